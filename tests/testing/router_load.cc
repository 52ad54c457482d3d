#include "tests/testing/router_load.h"

#include <utility>

#include "absl/time/clock.h"

namespace trident::testing {

RouterLoad::RouterLoad(std::string address, int clients, RequestFor request)
    : address_(std::move(address)), request_(std::move(request)) {
  for (int c = 0; c < clients; ++c) threads_.emplace_back([this, c] { Run(c); });
}

std::vector<GenerationOutcome> RouterLoad::Stop() {
  stop_.store(true);
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  absl::MutexLock lock(&mu_);
  return outcomes_;
}

int64_t RouterLoad::Count(const std::function<bool(const GenerationOutcome&)>& match) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const GenerationOutcome& o : outcomes_) n += match(o);
  return n;
}

bool RouterLoad::AwaitCount(const std::function<bool(const GenerationOutcome&)>& match,
                            int64_t count, absl::Duration timeout) const {
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t n = 0;
    for (const GenerationOutcome& o : outcomes_) n += match(o);
    return n >= count;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

std::string RouterLoad::last_error() const {
  absl::MutexLock lock(&mu_);
  for (auto it = outcomes_.rbegin(); it != outcomes_.rend(); ++it) {
    if (!it->ok) return it->error;
  }
  return "";
}

void RouterLoad::Run(int client) {
  for (int n = 0; !stop_.load(); ++n) {
    cli::GenerateOptions options = request_(client, n);
    if (options.address.empty()) options.address = address_;
    absl::StatusOr<cli::GenerateSummary> summary = cli::StreamGeneration(options, nullptr);
    GenerationOutcome outcome{.max_tokens = options.max_tokens};
    if (summary.ok()) {
      outcome.ok = true;
      outcome.tokens = summary->tokens;
      outcome.usage_tokens = summary->complete.usage().completion_tokens();
      outcome.cached_tokens = summary->complete.usage().cached_tokens();
      outcome.dram_cached_tokens = summary->complete.usage().dram_cached_tokens();
      outcome.text = std::move(summary->text);
      outcome.decode_worker = summary->complete.placement().decode_worker_id();
      outcome.attention_service = summary->complete.placement().attention_service_id();
    } else {
      outcome.error = summary.status().ToString();
    }
    outcome.finished = absl::Now();
    absl::MutexLock lock(&mu_);
    outcomes_.push_back(std::move(outcome));
  }
}

}  // namespace trident::testing
