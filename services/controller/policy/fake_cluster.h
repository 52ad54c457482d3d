#ifndef TRIDENT_SERVICES_CONTROLLER_POLICY_FAKE_CLUSTER_H_
#define TRIDENT_SERVICES_CONTROLLER_POLICY_FAKE_CLUSTER_H_

// A simulated cluster for the role policy's tests: prefill and decode
// workers whose signals respond to their roles and to the traffic, one
// policy interval at a time, with seeded noise. A fluid model, not a
// discrete-event one: enough for the signals to move the way a real
// cluster's do when a worker changes role.
//
// Each interval of length T, with P serving prefill and D serving decode
// workers and traffic (rate, prompt tokens Lp, output tokens Lo):
//
//   arrivals   Poisson(rate * T * e), e a log-normal burst factor
//              (`rate_noise`)
//   admission  decode first (as the router): requests beyond what decode
//              serves in T plus the room left in its waiting line are
//              rejected for "kv_capacity"; then prefill: requests whose
//              queueing would push TTFT past its SLO are rejected for "ttft"
//   prefill    a token queue served at P * prefill_tokens_per_second;
//              TTFT p90 = Lp / rate_1 * (1 + 1.5 u / (1 - u) / P) + queue
//              wait, u the utilisation (at most 0.95), rate_1 one worker's
//   decode     S sequences in decode; each worker runs a batch of
//              b = min(S / D, b_max) with a step (= TPOT) of
//              step_seconds + step_seconds_per_sequence * b; a sequence
//              leaves after Lo steps; the rest of S waits; b_max is the
//              smaller of max_batch_sequences and the KV pool over Lp + Lo;
//              KV usage = b * (Lp + Lo / 2) / KV pool
//   noise      the measured p90s carry a log-normal factor (`latency_noise`)
//
// A flip ordered after interval t completes at the start of interval
// t + flip_intervals (the policy sees it pending until then); the worker
// serves neither role in between (it drains).

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "services/controller/policy/role_policy.h"

namespace trident::controller {

struct Traffic {
  double requests_per_second = 0;
  double prompt_tokens = 0;
  double output_tokens = 0;
};

struct FakeClusterOptions {
  absl::Duration interval = absl::Seconds(10);
  // One prefill worker, busy.
  double prefill_tokens_per_second = 20000;
  // A decode step: fixed part, and per sequence in the batch.
  double step_seconds = 0.020;
  double step_seconds_per_sequence = 0.0004;
  int32_t max_batch_sequences = 256;
  double kv_tokens_per_worker = 200000;
  // Admitted requests that may wait for decode room, per decode worker.
  double waiting_per_decode_worker = 16;
  int32_t flip_intervals = 2;
  // Relative spread of the per-interval request rate and of measured p90s.
  double rate_noise = 0.1;
  double latency_noise = 0.1;
  absl::Duration ttft_slo = absl::Milliseconds(500);
};

// Thread-compatible.
class FakeCluster {
 public:
  // Workers "w0", "w1", ... in `roles`, all having changed role at the
  // clock's Now() minus a day (free to flip). `clock` (not owned) is advanced
  // by Step().
  FakeCluster(FakeClusterOptions options, const std::vector<trident::v1::Role>& roles,
              uint64_t seed, FakeClock* clock);

  void set_traffic(const Traffic& traffic) { traffic_ = traffic; }

  // One interval: advances the clock, moves a pending flip on, serves the
  // interval's traffic and updates the signals.
  void Step();

  // What the policy sees now.
  Observation Observe() const;

  // Starts the flip `decision` orders (a hold does nothing).
  // kFailedPrecondition if a flip is pending or the worker is not serving in
  // the decision's `from` role; kNotFound for an unknown worker.
  absl::Status Apply(const Decision& decision);

  // Serving workers in `role`.
  int32_t Count(trident::v1::Role role) const;

  // e.g. "P P D D" in worker order, "-" for a draining worker.
  std::string RolesString() const;

  const ClusterSignals& signals() const { return signals_; }

 private:
  struct Worker {
    std::string id;
    trident::v1::Role role;
    absl::Time role_change_time;
    bool serving = true;
  };
  struct Admitted {
    double requests = 0;
    double rejected_decode = 0;
    double rejected_ttft = 0;
  };

  Admitted Admit(double arrivals, int32_t num_prefill, int32_t num_decode) const;
  // Returns the requests whose prefill finished in the interval.
  double ServePrefill(double accepted, int32_t num_prefill);
  void ServeDecode(double finished_prefill, int32_t num_decode);
  double BatchLimit() const;
  double Noisy(double value, double spread);

  const FakeClusterOptions options_;
  FakeClock* const clock_;
  std::mt19937_64 rng_;
  std::vector<Worker> workers_;
  Traffic traffic_;
  int32_t pending_worker_ = -1;
  trident::v1::Role pending_role_ = trident::v1::ROLE_UNSPECIFIED;
  int32_t pending_intervals_left_ = 0;
  double prefill_queue_tokens_ = 0;
  double decode_sequences_ = 0;
  ClusterSignals signals_;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_POLICY_FAKE_CLUSTER_H_
