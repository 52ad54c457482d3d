// Load through a router for integration tests: client threads, each sending
// generations one after another until stopped, every outcome recorded. A
// request may name its own address (e.g. a worker's Generation API in role
// `both`) instead of the router's.

#ifndef TRIDENT_TESTS_TESTING_ROUTER_LOAD_H_
#define TRIDENT_TESTS_TESTING_ROUTER_LOAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tools/cli/generate.h"

namespace trident::testing {

struct GenerationOutcome {
  bool ok = false;
  std::string error;  // The status, when not ok.
  int32_t max_tokens = 0;
  int32_t tokens = 0;        // Streamed.
  int32_t usage_tokens = 0;  // GenerateComplete.usage.completion_tokens.
  // GenerateComplete.usage: prompt tokens reused from a cache, and those of
  // them fetched from an attention service's block store (the DRAM tier).
  int32_t cached_tokens = 0;
  int32_t dram_cached_tokens = 0;
  std::string text;
  std::string decode_worker;      // placement.decode_worker_id
  std::string attention_service;  // placement.attention_service_id
  absl::Time finished;
};

// Thread-safe.
class RouterLoad {
 public:
  // Client `client`'s `n`-th request; the load sets its address to the
  // router's unless it names one.
  using RequestFor = std::function<cli::GenerateOptions(int client, int n)>;

  RouterLoad(std::string address, int clients, RequestFor request);
  ~RouterLoad() { Stop(); }

  // Stops sending; returns every outcome once the requests in flight are
  // answered. Idempotent.
  std::vector<GenerationOutcome> Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Outcomes so far for which `match` holds.
  int64_t Count(const std::function<bool(const GenerationOutcome&)>& match) const
      ABSL_LOCKS_EXCLUDED(mu_);
  int64_t answered() const { return Count([](const GenerationOutcome&) { return true; }); }
  // Waits until at least `count` outcomes satisfy `match`, at most
  // `timeout`; whether they do. Wakes on each new outcome; never sleeps.
  bool AwaitCount(const std::function<bool(const GenerationOutcome&)>& match, int64_t count,
                  absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  // The last failure's status, or empty.
  std::string last_error() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run(int client);

  const std::string address_;
  const RequestFor request_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  mutable absl::Mutex mu_;
  std::vector<GenerationOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_ROUTER_LOAD_H_
