#ifndef TRIDENT_SERVICES_ROUTER_AUTH_API_KEYS_H_
#define TRIDENT_SERVICES_ROUTER_AUTH_API_KEYS_H_

// API keys at the router (--api_keys_file): a JSON file of SHA-256 hashes of
// keys, never the keys themselves, each mapped to a tenant and the QoS
// classes it may use:
//
//   {"keys": [{"sha256": "<64 hex digits: SHA-256 of the key>",
//              "tenant": "acme",
//              "qos_classes": ["interactive", "batch"],  // optional; absent: any
//              "default_qos_class": "interactive"}]}     // optional
//
// A call presents its key as `authorization: Bearer <key>` or
// `x-api-key: <key>` metadata. The presented key's hash is compared with
// every entry in constant time (CRYPTO_memcmp, no early exit), so timing
// tells nothing about which bytes matched. The file is re-read when it
// changes (checked at most every two seconds, on the calls themselves), and
// a file that no longer parses keeps the keys last loaded. Make a key's
// hash with `printf %s "$KEY" | sha256sum`.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/frontend/authenticator.h"
#include "common/time/clock.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace trident::router::auth {

using Sha256 = std::array<uint8_t, 32>;

struct ApiKeyEntry {
  Sha256 digest;
  frontend::Principal principal;
};

// Parses the file's contents. INVALID_ARGUMENT naming the entry and field
// (keys[2].sha256) for a malformed one, a repeated hash, or a QoS class
// outside `known_qos_classes` (when not empty).
absl::StatusOr<std::vector<ApiKeyEntry>> ParseApiKeys(
    const std::string& json, const absl::flat_hash_set<std::string>& known_qos_classes);

Sha256 HashKey(const std::string& key);

// Thread-safe.
class ApiKeyAuthenticator final : public frontend::Authenticator {
 public:
  // Reads `path` now (an error fails the start). `registry` (may be null)
  // gets trident_router_authentications_total{outcome, tenant}.
  static absl::StatusOr<std::unique_ptr<ApiKeyAuthenticator>> Load(
      const std::string& path, absl::flat_hash_set<std::string> known_qos_classes, Clock* clock,
      prometheus::Registry* registry);

  absl::StatusOr<frontend::Principal> Authenticate(
      const grpc::CallbackServerContext& context) override;

  // The principal of `key` (UNAUTHENTICATED when it is no entry's).
  absl::StatusOr<frontend::Principal> AuthenticateKey(const std::string& key);

  // Keys loaded now.
  size_t size() const;

 private:
  // The file's identity: a change of any part means it was replaced.
  struct FileStamp {
    int64_t mtime_ns = 0;
    int64_t size = 0;
    uint64_t inode = 0;
    bool operator==(const FileStamp&) const = default;
  };

  ApiKeyAuthenticator(std::string path, absl::flat_hash_set<std::string> known_qos_classes,
                      Clock* clock, prometheus::Registry* registry);
  absl::Status Reload();
  void MaybeReload();
  void Count(const std::string& outcome, const std::string& tenant);

  const std::string path_;
  const absl::flat_hash_set<std::string> known_qos_classes_;
  Clock* const clock_;
  prometheus::Family<prometheus::Counter>* counter_family_ = nullptr;

  mutable absl::Mutex mu_;
  std::shared_ptr<const std::vector<ApiKeyEntry>> entries_ ABSL_GUARDED_BY(mu_);
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace trident::router::auth

#endif  // TRIDENT_SERVICES_ROUTER_AUTH_API_KEYS_H_
