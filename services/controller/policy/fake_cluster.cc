#include "services/controller/policy/fake_cluster.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trident::controller {
namespace {

using trident::v1::Role;

// A p90 sits above the mean of a step's spread; a fixed factor keeps the
// model simple.
constexpr double kP90OverMean = 1.1;

}  // namespace

FakeCluster::FakeCluster(FakeClusterOptions options, const std::vector<Role>& roles, uint64_t seed,
                         FakeClock* clock)
    : options_(std::move(options)), clock_(clock), rng_(seed) {
  for (size_t i = 0; i < roles.size(); ++i) {
    workers_.push_back(Worker{.id = absl::StrCat("w", i),
                              .role = roles[i],
                              .role_change_time = clock_->Now() - absl::Hours(24)});
  }
}

int32_t FakeCluster::Count(Role role) const {
  return static_cast<int32_t>(
      std::count_if(workers_.begin(), workers_.end(),
                    [role](const auto& w) { return w.serving && w.role == role; }));
}

std::string FakeCluster::RolesString() const {
  return absl::StrJoin(workers_, " ", [](std::string* out, const Worker& w) {
    out->append(!w.serving ? "-" : (w.role == trident::v1::ROLE_PREFILL ? "P" : "D"));
  });
}

Observation FakeCluster::Observe() const {
  Observation observation{.signals = signals_, .flip_pending = pending_worker_ >= 0};
  for (const Worker& w : workers_) {
    observation.workers.push_back(WorkerState{.worker_id = w.id,
                                              .role = w.role,
                                              .role_change_time = w.role_change_time,
                                              .serving = w.serving});
  }
  return observation;
}

absl::Status FakeCluster::Apply(const Decision& decision) {
  if (decision.action != Decision::Action::kFlip) return absl::OkStatus();
  if (pending_worker_ >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "flip of ", decision.worker_id, " while ", workers_[pending_worker_].id, " still drains"));
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = workers_[i];
    if (w.id != decision.worker_id) continue;
    if (!w.serving || w.role != decision.from) {
      return absl::FailedPreconditionError(
          absl::StrCat(w.id, " is not serving as ", RoleName(decision.from)));
    }
    w.serving = false;
    pending_worker_ = static_cast<int32_t>(i);
    pending_role_ = decision.to;
    pending_intervals_left_ = options_.flip_intervals;
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("no worker ", decision.worker_id));
}

double FakeCluster::Noisy(double value, double spread) {
  if (spread <= 0) return value;
  std::normal_distribution<double> normal(-spread * spread / 2, spread);
  return value * std::exp(normal(rng_));
}

double FakeCluster::BatchLimit() const {
  const double per_sequence = traffic_.prompt_tokens + traffic_.output_tokens;
  return std::min<double>(options_.max_batch_sequences,
                          std::floor(options_.kv_tokens_per_worker / std::max(1.0, per_sequence)));
}

void FakeCluster::Step() {
  clock_->Advance(options_.interval);
  if (pending_worker_ >= 0 && --pending_intervals_left_ <= 0) {
    Worker& w = workers_[pending_worker_];
    w.role = pending_role_;
    w.role_change_time = clock_->Now();
    w.serving = true;
    pending_worker_ = -1;
  }
  const int32_t num_prefill = Count(trident::v1::ROLE_PREFILL);
  const int32_t num_decode = Count(trident::v1::ROLE_DECODE);
  const double seconds = absl::ToDoubleSeconds(options_.interval);
  const double rate = Noisy(traffic_.requests_per_second, options_.rate_noise);
  std::poisson_distribution<int64_t> poisson(std::max(0.0, rate * seconds));
  const double arrivals = static_cast<double>(poisson(rng_));

  const Admitted admitted = Admit(arrivals, num_prefill, num_decode);
  const double finished_prefill = ServePrefill(admitted.requests, num_prefill);
  ServeDecode(finished_prefill, num_decode);
  signals_.prefill.ttft_rejected_ratio = arrivals > 0 ? admitted.rejected_ttft / arrivals : 0;
  signals_.decode.rejected_ratio = arrivals > 0 ? admitted.rejected_decode / arrivals : 0;
}

FakeCluster::Admitted FakeCluster::Admit(double arrivals, int32_t num_prefill,
                                         int32_t num_decode) const {
  const double seconds = absl::ToDoubleSeconds(options_.interval);
  const double b_max = BatchLimit();
  const double full_step = options_.step_seconds + options_.step_seconds_per_sequence * b_max;
  const double decode_capacity =
      num_decode * b_max * seconds / (std::max(1.0, traffic_.output_tokens) * full_step);
  const double waiting = std::max(0.0, decode_sequences_ - num_decode * b_max);
  const double decode_room =
      decode_capacity + std::max(0.0, options_.waiting_per_decode_worker * num_decode - waiting);
  Admitted admitted;
  const double past_decode = std::min(arrivals, decode_room);
  admitted.rejected_decode = arrivals - past_decode;

  // Tokens the prefill queue may hold with TTFT still within its SLO.
  const double per_worker = options_.prefill_tokens_per_second;
  const double capacity = per_worker * num_prefill;
  const double compute = traffic_.prompt_tokens / per_worker;
  const double queue_limit =
      std::max(0.0, absl::ToDoubleSeconds(options_.ttft_slo) - compute) * capacity;
  const double room = queue_limit + capacity * seconds - prefill_queue_tokens_;
  admitted.requests = std::clamp(room / std::max(1.0, traffic_.prompt_tokens), 0.0, past_decode);
  admitted.rejected_ttft = past_decode - admitted.requests;
  return admitted;
}

double FakeCluster::ServePrefill(double accepted, int32_t num_prefill) {
  const double seconds = absl::ToDoubleSeconds(options_.interval);
  const double per_worker = options_.prefill_tokens_per_second;
  const double capacity = per_worker * num_prefill;
  const double before = prefill_queue_tokens_;
  const double offered = before + accepted * traffic_.prompt_tokens;
  const double served = std::min(offered, capacity * seconds);
  prefill_queue_tokens_ = offered - served;
  PrefillSignals& s = signals_.prefill;
  s.queued_prefill_tokens = prefill_queue_tokens_;
  s.prefill_tokens_per_second_per_worker = per_worker;
  if (served <= 0 || num_prefill == 0) {
    s.ttft_p90_seconds = kNoSignal;
    return 0;
  }
  const double utilisation = std::min(0.95, served / (capacity * seconds));
  const double wait = (before + prefill_queue_tokens_) / 2 / capacity;
  const double ttft = traffic_.prompt_tokens / per_worker *
                          (1 + 1.5 * utilisation / (1 - utilisation) / num_prefill) +
                      wait;
  s.ttft_p90_seconds = Noisy(ttft, options_.latency_noise);
  return served / std::max(1.0, traffic_.prompt_tokens);
}

void FakeCluster::ServeDecode(double finished_prefill, int32_t num_decode) {
  const double seconds = absl::ToDoubleSeconds(options_.interval);
  // One-second steps keep the sequence count's update stable (a sequence
  // stays for Lo steps, many seconds).
  const int32_t substeps = std::max(1, static_cast<int32_t>(std::ceil(seconds)));
  const double dt = seconds / substeps;
  const double arrival_rate = finished_prefill / seconds;
  const double b_max = BatchLimit();
  const double output = std::max(1.0, traffic_.output_tokens);
  double batch_sum = 0;
  double tpot_sum = 0;
  double batch = 0;
  for (int32_t i = 0; i < substeps; ++i) {
    decode_sequences_ += arrival_rate * dt;
    batch = num_decode > 0 ? std::min(decode_sequences_ / num_decode, b_max) : 0;
    const double tpot = options_.step_seconds + options_.step_seconds_per_sequence * batch;
    const double done = num_decode * batch * dt / (output * tpot);
    decode_sequences_ = std::max(0.0, decode_sequences_ - done);
    batch_sum += batch;
    tpot_sum += tpot * batch;
  }
  DecodeSignals& s = signals_.decode;
  s.waiting_sequences = std::max(0.0, decode_sequences_ - num_decode * batch);
  if (num_decode == 0) {
    s.kv_usage_ratio = kNoSignal;
    s.tpot_p90_seconds = kNoSignal;
    return;
  }
  const double mean_batch = batch_sum / substeps;
  s.kv_usage_ratio =
      std::min(1.0, mean_batch * (traffic_.prompt_tokens + traffic_.output_tokens / 2) /
                        options_.kv_tokens_per_worker);
  s.tpot_p90_seconds = batch_sum > 0
                           ? Noisy(tpot_sum / batch_sum * kP90OverMean, options_.latency_noise)
                           : kNoSignal;
}

}  // namespace trident::controller
