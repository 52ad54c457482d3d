#include "common/model/json_util.h"

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace trident::model::internal {

absl::StatusOr<nlohmann::json> ParseJson(absl::string_view text, absl::string_view source) {
  // One key set per open object; the parser reports keys in order, so a
  // repeat shows up when its key event arrives.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  bool has_duplicate = false;
  auto callback = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case nlohmann::json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get_ref<const std::string&>()).second &&
            !has_duplicate) {
          has_duplicate = true;
          duplicate = parsed.get_ref<const std::string&>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  nlohmann::json value = nlohmann::json::parse(text.begin(), text.end(), callback,
                                               /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  }
  if (has_duplicate) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key \"", JsonSnippet(duplicate), "\" appears twice in an object"));
  }
  return value;
}

bool JsonToInt64(const nlohmann::json& value, int64_t* out) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (value.is_number_integer()) {
    *out = value.get<int64_t>();
    return true;
  }
  return false;
}

bool JsonToUint64(const nlohmann::json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer()) {
    const int64_t i = value.get<int64_t>();
    if (i < 0) return false;
    *out = static_cast<uint64_t>(i);
    return true;
  }
  return false;
}

std::string JsonSnippet(const nlohmann::json& value) {
  // Containers are named by type only: dumping them would recurse as deep as
  // an adversarial input nests.
  constexpr size_t kMaxChars = 60;
  std::string s;
  if (value.is_string()) {
    s = value.get_ref<const std::string&>();
  } else if (value.is_primitive()) {
    s = value.dump();
  } else {
    s = value.type_name();
  }
  if (s.size() > kMaxChars) s = absl::StrCat(s.substr(0, kMaxChars), "...");
  return s;
}

}  // namespace trident::model::internal
