#include "services/router/auth/api_keys.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::router::auth {
namespace {

// How often calls look at the file for a change.
constexpr absl::Duration kReloadCheck = absl::Seconds(2);

absl::StatusOr<Sha256> ParseHex(const std::string& field, const std::string& hex) {
  Sha256 digest{};
  if (hex.size() != 64) {
    return InvalidArgumentForField(
        field, absl::StrCat("must be 64 hex digits (a SHA-256), got ", hex.size(), " characters"));
  }
  for (size_t i = 0; i < 32; ++i) {
    int value = 0;
    for (size_t k = 0; k < 2; ++k) {
      const char c = absl::ascii_tolower(hex[2 * i + k]);
      int nibble;
      if (c >= '0' && c <= '9') {
        nibble = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        nibble = c - 'a' + 10;
      } else {
        return InvalidArgumentForField(field, "must be 64 hex digits (a SHA-256)");
      }
      value = value * 16 + nibble;
    }
    digest[i] = static_cast<uint8_t>(value);
  }
  return digest;
}

absl::StatusOr<std::vector<std::string>> StringList(const nlohmann::json& value,
                                                    const std::string& field) {
  if (!value.is_array()) return InvalidArgumentForField(field, "must be a list of strings");
  std::vector<std::string> out;
  for (const nlohmann::json& item : value) {
    if (!item.is_string()) return InvalidArgumentForField(field, "must be a list of strings");
    out.push_back(item.get<std::string>());
  }
  return out;
}

absl::Status CheckQos(const std::string& field, const std::string& name,
                      const absl::flat_hash_set<std::string>& known) {
  if (known.empty() || known.contains(name)) return absl::OkStatus();
  return InvalidArgumentForField(field,
                                 absl::StrCat("\"", name, "\" is not a QoS class of this router"));
}

absl::StatusOr<ApiKeyEntry> ParseEntry(const nlohmann::json& item, const std::string& at,
                                       const absl::flat_hash_set<std::string>& known) {
  if (!item.is_object()) return InvalidArgumentForField(at, "must be an object");
  for (const auto& [key, unused] : item.items()) {
    if (key != "sha256" && key != "tenant" && key != "qos_classes" && key != "default_qos_class") {
      return InvalidArgumentForField(absl::StrCat(at, ".", key), "is not a known field");
    }
  }
  if (!item.contains("sha256") || !item["sha256"].is_string()) {
    return InvalidArgumentForField(at + ".sha256", "must be a string of 64 hex digits");
  }
  if (!item.contains("tenant") || !item["tenant"].is_string() ||
      item["tenant"].get<std::string>().empty()) {
    return InvalidArgumentForField(at + ".tenant", "must be a non-empty string");
  }
  ApiKeyEntry entry;
  TRIDENT_ASSIGN_OR_RETURN(entry.digest, ParseHex(at + ".sha256", item["sha256"]));
  entry.principal.tenant = item["tenant"].get<std::string>();
  if (item.contains("qos_classes")) {
    TRIDENT_ASSIGN_OR_RETURN(entry.principal.qos_classes,
                             StringList(item["qos_classes"], at + ".qos_classes"));
    for (const std::string& qos : entry.principal.qos_classes) {
      TRIDENT_RETURN_IF_ERROR(CheckQos(at + ".qos_classes", qos, known));
    }
  }
  if (item.contains("default_qos_class")) {
    if (!item["default_qos_class"].is_string()) {
      return InvalidArgumentForField(at + ".default_qos_class", "must be a string");
    }
    entry.principal.default_qos_class = item["default_qos_class"].get<std::string>();
    TRIDENT_RETURN_IF_ERROR(
        CheckQos(at + ".default_qos_class", entry.principal.default_qos_class, known));
    if (!frontend::QosClassFor(entry.principal, entry.principal.default_qos_class).ok()) {
      return InvalidArgumentForField(at + ".default_qos_class", "is not one of its qos_classes");
    }
  }
  return entry;
}

// The key a call presents, or "" when none.
std::string PresentedKey(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    const std::string value(it->second.data(), it->second.size());
    if (value.size() > 7 && absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) {
      return std::string(absl::StripAsciiWhitespace(value.substr(7)));
    }
  }
  if (auto it = metadata.find("x-api-key"); it != metadata.end()) {
    return std::string(it->second.data(), it->second.size());
  }
  return "";
}

}  // namespace

absl::StatusOr<std::vector<ApiKeyEntry>> ParseApiKeys(
    const std::string& json, const absl::flat_hash_set<std::string>& known_qos_classes) {
  const nlohmann::json doc = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("keys") || !doc["keys"].is_array()) {
    return InvalidArgumentForField("keys", "the file must be a JSON object {\"keys\": [...]}");
  }
  std::vector<ApiKeyEntry> entries;
  for (size_t i = 0; i < doc["keys"].size(); ++i) {
    const std::string at = absl::StrCat("keys[", i, "]");
    TRIDENT_ASSIGN_OR_RETURN(ApiKeyEntry entry, ParseEntry(doc["keys"][i], at, known_qos_classes));
    for (const ApiKeyEntry& other : entries) {
      if (other.digest == entry.digest) {
        return InvalidArgumentForField(at + ".sha256", "repeats an earlier entry's hash");
      }
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

Sha256 HashKey(const std::string& key) {
  Sha256 digest{};
  unsigned int size = 0;
  EVP_Digest(key.data(), key.size(), digest.data(), &size, EVP_sha256(), nullptr);
  return digest;
}

ApiKeyAuthenticator::ApiKeyAuthenticator(std::string path,
                                         absl::flat_hash_set<std::string> known_qos_classes,
                                         Clock* clock, prometheus::Registry* registry)
    : path_(std::move(path)), known_qos_classes_(std::move(known_qos_classes)), clock_(clock) {
  if (registry != nullptr) {
    counter_family_ = &prometheus::BuildCounter()
                           .Name("trident_router_authentications_total")
                           .Help(
                               "Calls to the Generation API by API key check outcome (ok, "
                               "missing, invalid) and tenant (empty unless ok)")
                           .Register(*registry);
  }
}

absl::StatusOr<std::unique_ptr<ApiKeyAuthenticator>> ApiKeyAuthenticator::Load(
    const std::string& path, absl::flat_hash_set<std::string> known_qos_classes, Clock* clock,
    prometheus::Registry* registry) {
  std::unique_ptr<ApiKeyAuthenticator> auth(
      new ApiKeyAuthenticator(path, std::move(known_qos_classes), clock, registry));
  TRIDENT_RETURN_IF_ERROR(auth->Reload());
  TRIDENT_LOG(INFO) << "API keys: " << auth->size() << " loaded from " << path;
  return auth;
}

absl::Status ApiKeyAuthenticator::Reload() {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--api_keys_file=", path_, ": cannot be read"));
  }
  const FileStamp stamp{
      .mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
      .size = static_cast<int64_t>(st.st_size),
      .inode = static_cast<uint64_t>(st.st_ino)};
  {
    absl::MutexLock lock(&mu_);
    if (entries_ != nullptr && stamp == stamp_) return absl::OkStatus();
  }
  std::ifstream in(path_);
  std::stringstream contents;
  contents << in.rdbuf();
  absl::StatusOr<std::vector<ApiKeyEntry>> entries =
      ParseApiKeys(contents.str(), known_qos_classes_);
  if (!entries.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api_keys_file=", path_, ": ", entries.status().message()));
  }
  auto loaded = std::make_shared<const std::vector<ApiKeyEntry>>(*std::move(entries));
  absl::MutexLock lock(&mu_);
  entries_ = std::move(loaded);
  stamp_ = stamp;
  return absl::OkStatus();
}

void ApiKeyAuthenticator::MaybeReload() {
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock lock(&mu_);
    if (now < next_check_) return;
    next_check_ = now + kReloadCheck;
  }
  if (absl::Status s = Reload(); !s.ok()) {
    TRIDENT_LOG(ERROR) << "keeping the API keys loaded before: " << s;
  }
}

size_t ApiKeyAuthenticator::size() const {
  absl::MutexLock lock(&mu_);
  return entries_ == nullptr ? 0 : entries_->size();
}

void ApiKeyAuthenticator::Count(const std::string& outcome, const std::string& tenant) {
  if (counter_family_ != nullptr) {
    counter_family_->Add({{"outcome", outcome}, {"tenant", tenant}}).Increment();
  }
}

absl::StatusOr<frontend::Principal> ApiKeyAuthenticator::AuthenticateKey(const std::string& key) {
  MaybeReload();
  std::shared_ptr<const std::vector<ApiKeyEntry>> entries;
  {
    absl::MutexLock lock(&mu_);
    entries = entries_;
  }
  if (key.empty()) {
    Count("missing", "");
    return absl::UnauthenticatedError(
        "this router requires an API key: send `authorization: Bearer <key>` or "
        "`x-api-key: <key>` metadata");
  }
  const Sha256 digest = HashKey(key);
  // Every entry is compared, in constant time each, whatever matched.
  const ApiKeyEntry* match = nullptr;
  for (const ApiKeyEntry& entry : *entries) {
    const bool equal = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
    match = equal ? &entry : match;
  }
  if (match == nullptr) {
    Count("invalid", "");
    return absl::UnauthenticatedError("the API key is not valid");
  }
  Count("ok", match->principal.tenant);
  return match->principal;
}

absl::StatusOr<frontend::Principal> ApiKeyAuthenticator::Authenticate(
    const grpc::CallbackServerContext& context) {
  return AuthenticateKey(PresentedKey(context));
}

}  // namespace trident::router::auth
