#include "services/router/admission/qos_config.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace trident::router::admission {
namespace {

using nlohmann::json;

constexpr int kMaxClasses = 64;
constexpr size_t kMaxNameBytes = 64;

// Builds errors that start with the file name and a field path.
class ErrorAt {
 public:
  ErrorAt(absl::string_view source, std::string field)
      : source_(source), field_(std::move(field)) {}

  ErrorAt Child(absl::string_view key) const { return ErrorAt(source_, Join(key)); }
  ErrorAt Index(size_t i) const { return ErrorAt(source_, absl::StrCat(field_, "[", i, "]")); }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", field_, ": ", what));
  }

 private:
  std::string Join(absl::string_view key) const {
    return field_.empty() ? std::string(key) : absl::StrCat(field_, ".", key);
  }

  absl::string_view source_;
  std::string field_;
};

// Rejects keys other than `allowed`.
absl::Status CheckKeys(const json& object, const std::set<std::string>& allowed,
                       const ErrorAt& at) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (allowed.count(it.key()) == 0) {
      return at.Child(it.key()).Error("unknown field");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> PositiveMillis(const json& value, const ErrorAt& at) {
  if (!value.is_number()) return at.Error("must be a positive number (milliseconds)");
  const double ms = value.get<double>();
  if (!std::isfinite(ms) || ms <= 0 || ms > 1e9) {
    return at.Error(
        absl::StrCat("must be a positive number of milliseconds up to 1e9, got ", value.dump()));
  }
  return absl::Milliseconds(ms);
}

absl::StatusOr<QosClass> ParseClass(const json& object, const ErrorAt& at) {
  if (!object.is_object()) return at.Error("must be an object");
  absl::Status keys = CheckKeys(
      object, {"name", "is_default", "priority", "sheddable", "default_slo", "reserved_fraction"},
      at);
  if (!keys.ok()) return keys;
  QosClass qos;

  auto name = object.find("name");
  if (name == object.end()) return at.Child("name").Error("required");
  if (!name->is_string()) return at.Child("name").Error("must be a string");
  qos.name = name->get<std::string>();
  if (qos.name.empty() || qos.name.size() > kMaxNameBytes) {
    return at.Child("name").Error("must be 1 to 64 bytes");
  }
  for (char c : qos.name) {
    if (c < 0x21 || c > 0x7e) {
      return at.Child("name").Error("must be printable ASCII without spaces (0x21-0x7E)");
    }
  }

  if (auto it = object.find("is_default"); it != object.end()) {
    if (!it->is_boolean()) return at.Child("is_default").Error("must be true or false");
    qos.is_default = it->get<bool>();
  }
  if (auto it = object.find("sheddable"); it != object.end()) {
    if (!it->is_boolean()) return at.Child("sheddable").Error("must be true or false");
    qos.sheddable = it->get<bool>();
  }
  if (auto it = object.find("priority"); it != object.end()) {
    const bool integer = it->is_number_integer() || it->is_number_unsigned();
    if (!integer || (it->is_number_unsigned() && it->get<uint64_t>() > INT32_MAX) ||
        (!it->is_number_unsigned() &&
         (it->get<int64_t>() < INT32_MIN || it->get<int64_t>() > INT32_MAX))) {
      return at.Child("priority").Error("must be a 32-bit integer");
    }
    qos.priority = static_cast<int32_t>(it->get<int64_t>());
  }
  if (auto it = object.find("default_slo"); it != object.end()) {
    const ErrorAt slo_at = at.Child("default_slo");
    if (!it->is_object()) return slo_at.Error("must be an object");
    absl::Status slo_keys = CheckKeys(*it, {"ttft_ms", "tpot_ms"}, slo_at);
    if (!slo_keys.ok()) return slo_keys;
    if (auto ttft = it->find("ttft_ms"); ttft != it->end()) {
      absl::StatusOr<absl::Duration> d = PositiveMillis(*ttft, slo_at.Child("ttft_ms"));
      if (!d.ok()) return d.status();
      qos.default_ttft = *d;
    }
    if (auto tpot = it->find("tpot_ms"); tpot != it->end()) {
      absl::StatusOr<absl::Duration> d = PositiveMillis(*tpot, slo_at.Child("tpot_ms"));
      if (!d.ok()) return d.status();
      qos.default_tpot = *d;
    }
  }
  if (auto it = object.find("reserved_fraction"); it != object.end()) {
    const double f = it->is_number() ? it->get<double>() : -1;
    if (!it->is_number() || !std::isfinite(f) || f < 0 || f > 1) {
      return at.Child("reserved_fraction").Error("must be a number in [0, 1]");
    }
    qos.reserved_fraction = f;
  }
  return qos;
}

// Parses without exceptions and rejects an object that repeats a key.
absl::StatusOr<json> ParseJson(absl::string_view text, absl::string_view source) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty() && parsed.is_string() &&
               duplicate.empty() && !open_objects.back().insert(parsed.get<std::string>()).second) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json value = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key \"", duplicate.substr(0, 64), "\" appears twice in an object"));
  }
  return value;
}

}  // namespace

int QosConfig::Find(absl::string_view name) const {
  if (name.empty()) return default_index;
  for (size_t i = 0; i < classes.size(); ++i) {
    if (classes[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

QosConfig QosConfig::SingleDefaultClass() {
  QosConfig config;
  QosClass qos;
  qos.name = "default";
  qos.is_default = true;
  config.classes.push_back(qos);
  config.default_index = 0;
  return config;
}

absl::StatusOr<QosConfig> ParseQosConfig(absl::string_view json_text, absl::string_view source) {
  absl::StatusOr<json> root = ParseJson(json_text, source);
  if (!root.ok()) return root.status();
  const ErrorAt top(source, "");
  if (!root->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": must be a JSON object"));
  }
  absl::Status keys = CheckKeys(*root, {"classes"}, top);
  if (!keys.ok()) return keys;
  const ErrorAt classes_at = top.Child("classes");
  auto classes = root->find("classes");
  if (classes == root->end()) return classes_at.Error("required");
  if (!classes->is_array() || classes->empty() || classes->size() > kMaxClasses) {
    return classes_at.Error("must be an array of 1 to 64 classes");
  }

  QosConfig config;
  absl::flat_hash_set<std::string> names;
  int num_defaults = 0;
  double reserved = 0;
  for (size_t i = 0; i < classes->size(); ++i) {
    absl::StatusOr<QosClass> qos = ParseClass((*classes)[i], classes_at.Index(i));
    if (!qos.ok()) return qos.status();
    if (!names.insert(qos->name).second) {
      return classes_at.Index(i).Child("name").Error(
          absl::StrCat("\"", qos->name, "\" names an earlier class too"));
    }
    if (qos->is_default) {
      ++num_defaults;
      config.default_index = static_cast<int>(i);
    }
    reserved += qos->reserved_fraction;
    config.classes.push_back(*std::move(qos));
  }
  if (num_defaults > 1) return classes_at.Error("more than one class has is_default true");
  if (num_defaults == 0) {
    if (config.classes.size() > 1) {
      return classes_at.Error("no class has is_default true (exactly one must)");
    }
    config.classes[0].is_default = true;
    config.default_index = 0;
  }
  // A little slack for fractions such as 0.1 + 0.2 + 0.7 in binary.
  if (reserved > 1 + 1e-9) {
    return classes_at.Error(
        absl::StrCat("reserved_fraction values sum to ", reserved, ", more than 1"));
  }
  return config;
}

absl::StatusOr<QosConfig> LoadQosConfigFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the QoS config"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::NotFoundError(absl::StrCat(path, ": cannot read the QoS config"));
  return ParseQosConfig(buffer.str(), path);
}

}  // namespace trident::router::admission
