// The controller: membership, topology, and prefill/decode role decisions
// from Prometheus metrics (services/controller/controller_server.h).

#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "common/service/service_runtime.h"
#include "common/time/clock.h"
#include "services/controller/controller_server.h"

ABSL_FLAG(std::string, prometheus_url, "",
          "Base URL of the Prometheus server whose metrics drive role decisions, e.g. "
          "http://127.0.0.1:9090; empty: no role decisions (every interval holds).");
ABSL_FLAG(absl::Duration, prometheus_timeout, absl::Seconds(5),
          "Longest wait for one Prometheus answer; past it the interval holds "
          "(metrics_unavailable).");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(1),
          "How often members (workers, attention services) heartbeat.");
ABSL_FLAG(absl::Duration, dead_after, absl::Seconds(5),
          "Silence after which a member is marked DEAD and routers stop using it.");
ABSL_FLAG(absl::Duration, decision_interval, absl::Seconds(10),
          "How often the role policy decides; the unit of the window, horizon and sustain "
          "counts, and the least time between two flips.");
ABSL_FLAG(int32_t, window_intervals, 6, "Intervals of pressure samples the forecast uses.");
ABSL_FLAG(int32_t, min_samples, 3,
          "Samples needed after a change of the serving set before the policy acts.");
ABSL_FLAG(double, horizon_intervals, 1, "How far ahead the forecast looks, in intervals.");
ABSL_FLAG(double, high_pressure, 0.9, "A role needs a worker at or above this forecast pressure.");
ABSL_FLAG(double, low_pressure, 0.7,
          "A role gives a worker only if, one worker fewer, it stays at or below this; the gap "
          "to --high_pressure is the no-action band.");
ABSL_FLAG(int32_t, sustain_intervals, 3, "Consecutive intervals a need must last before a flip.");
ABSL_FLAG(absl::Duration, min_dwell, absl::Minutes(2),
          "Least time between two role changes of one worker.");
ABSL_FLAG(absl::Duration, ttft_slo, absl::Milliseconds(500),
          "TTFT target that reads as prefill pressure 1.0.");
ABSL_FLAG(absl::Duration, tpot_slo, absl::Milliseconds(50),
          "TPOT target that reads as decode pressure 1.0.");
ABSL_FLAG(double, kv_usage_at_capacity, 0.9, "Decode KV usage that reads as pressure 1.0.");
ABSL_FLAG(double, waiting_sequences_per_worker_at_capacity, 4,
          "Waiting sequences per decode worker that read as pressure 1.0.");
ABSL_FLAG(double, rejected_ratio_at_capacity, 0.05,
          "Share of requests rejected for a role's reasons that reads as its pressure 1.0.");
ABSL_FLAG(absl::Duration, rate_window, absl::Minutes(1),
          "Window of the rate() and histogram queries; at least four scrape intervals.");
ABSL_FLAG(absl::Duration, flip_drain_timeout, absl::Seconds(30),
          "How long a flipping worker lets its work in flight finish before aborting it.");

namespace {

trident::controller::ControllerServerOptions OptionsFromFlags() {
  trident::controller::ControllerServerOptions options;
  options.membership.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.membership.dead_after = absl::GetFlag(FLAGS_dead_after);
  options.prometheus_timeout = absl::GetFlag(FLAGS_prometheus_timeout);
  trident::controller::RoleBalancerOptions& b = options.balancer;
  b.prometheus_url = absl::GetFlag(FLAGS_prometheus_url);
  b.queries = trident::controller::DefaultSignalQueries(absl::GetFlag(FLAGS_rate_window));
  b.drain_timeout = absl::GetFlag(FLAGS_flip_drain_timeout);
  trident::controller::RolePolicyOptions& p = b.policy;
  p.interval = absl::GetFlag(FLAGS_decision_interval);
  p.window_intervals = absl::GetFlag(FLAGS_window_intervals);
  p.min_samples = absl::GetFlag(FLAGS_min_samples);
  p.horizon_intervals = absl::GetFlag(FLAGS_horizon_intervals);
  p.high_pressure = absl::GetFlag(FLAGS_high_pressure);
  p.low_pressure = absl::GetFlag(FLAGS_low_pressure);
  p.sustain_intervals = absl::GetFlag(FLAGS_sustain_intervals);
  p.min_dwell = absl::GetFlag(FLAGS_min_dwell);
  p.ttft_slo = absl::GetFlag(FLAGS_ttft_slo);
  p.tpot_slo = absl::GetFlag(FLAGS_tpot_slo);
  p.kv_usage_at_capacity = absl::GetFlag(FLAGS_kv_usage_at_capacity);
  p.waiting_sequences_per_worker_at_capacity =
      absl::GetFlag(FLAGS_waiting_sequences_per_worker_at_capacity);
  p.rejected_ratio_at_capacity = absl::GetFlag(FLAGS_rejected_ratio_at_capacity);
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv, {.component = "controller", .grpc_port = 50054, .metrics_port = 9404},
      [](trident::ServiceRuntime& runtime) -> absl::Status {
        absl::StatusOr<std::unique_ptr<trident::controller::ControllerServer>> server =
            trident::controller::ControllerServer::Create(OptionsFromFlags(), runtime.registry(),
                                                          trident::Clock::Real());
        if (!server.ok()) return server.status();
        return runtime.Serve((*server)->services());
      });
}
