// The router: Trident's public gRPC endpoint (trident.v1.Generation).
// Tokenization, validation, stop strings and streamed text are the same front
// half a worker in role `both` serves; behind it, each request is admitted
// against its SLO (services/router/admission) on the live load of the
// workers, then runs on a (decode, prefill) pair: ReserveKv, Prefill into
// the reservation, Decode (RemoteTokenSource). Flags only; the parts are in
// router_server.h.

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "common/controller_client/member_address.h"
#include "common/service/service_runtime.h"
#include "common/status/status_macros.h"
#include "services/router/router_server.h"

ABSL_FLAG(std::string, model, "",
          "Model directory (config.json, tokenizer.json) the workers serve; the router reads "
          "no weights. Required.");
ABSL_FLAG(std::string, model_name, "", "Name ModelInfo reports; empty: the directory's name.");
ABSL_FLAG(int32_t, max_model_len, 0,
          "Longest prompt + output accepted; 0: the model's max_position_embeddings. Keep it "
          "at or below the workers' own limit.");
ABSL_FLAG(std::string, workers, "",
          "Comma-separated host:port of workers of any role, always followed: the router reads "
          "each one's role from its load reports. A worker in role both serves a request's "
          "prefill and decode itself when the router pairs it with itself (always, when it has "
          "no KV transport).");
ABSL_FLAG(std::string, prefill_workers, "",
          "Comma-separated host:port of prefill workers, always followed. Optional with "
          "--controller_address.");
ABSL_FLAG(std::string, decode_workers, "",
          "Comma-separated host:port of decode workers, always followed. Optional with "
          "--controller_address.");
ABSL_FLAG(std::string, controller_address, "",
          "host:port of the controller: the router follows its topology (WatchTopology) and "
          "subscribes to the load of every worker there that is not DEAD, besides "
          "--prefill_workers/--decode_workers; while the controller is unreachable it keeps "
          "the last topology's workers and reconnects with backoff. Empty: the static lists "
          "only.");
ABSL_FLAG(std::string, api_keys_file, "",
          "JSON file of hashed API keys, each mapped to a tenant and its QoS classes "
          "(services/router/auth/api_keys.h). Set: every Generation call needs `authorization: "
          "Bearer <key>` or `x-api-key: <key>` (UNAUTHENTICATED otherwise; PERMISSION_DENIED for "
          "a QoS class the key may not use); re-read when it changes. Empty: no keys.");
ABSL_FLAG(std::string, qos_config, "",
          "QoS classes (JSON; see services/router/admission/qos_config.h); empty: one default "
          "class without targets.");
ABSL_FLAG(bool, admission, true,
          "SLO admission: reject at once (RESOURCE_EXHAUSTED with RetryInfo) a request no "
          "worker pair is predicted to serve within its SLO. false: admit everything to the "
          "least-loaded pair.");
ABSL_FLAG(bool, admission_learn_ttft_overhead, true,
          "Admission learns each prefill worker's fixed TTFT overhead (RPC hops, step "
          "boundaries) apart from its slowdown factor, so that a fixed cost seen on short prompts "
          "does not price long ones out (services/router/admission/admission_controller.h). "
          "False: the older factor-only calibration, for comparison.");
ABSL_FLAG(int64_t, admission_idle_probe_interval_ms, 1000,
          "A request admission would reject on its predicted TTFT or TPOT alone is admitted "
          "anyway when a prefill and a decode worker are both idle, at most once per this "
          "interval per prefill worker: models fitted under a burst cannot then refuse an idle "
          "cluster forever (trident_router_admission_probes_total counts them). 0: no probes "
          "(decode models fitted only to a burst may then refuse an idle cluster until "
          "restarted).");
ABSL_FLAG(double, slo_margin, 0.85,
          "Admission admits a request only if its predicted TTFT and TPOT are within this "
          "fraction of its targets: headroom for step-time noise the cost models do not see.");
ABSL_FLAG(int32_t, load_interval_ms, 100, "Interval of the workers' load streams.");
ABSL_FLAG(bool, allow_cpu_attention, true,
          "Let decode workers with CPU attention services place a request's KV there: "
          "long-context requests, or any when their GPU KV pool is full.");
ABSL_FLAG(bool, kv_aware_routing, true,
          "Price each prefill worker at the prompt tokens its prefix cache lacks, as its KV "
          "events tell, so that a repeated prefix goes where it is cached; false: route by load "
          "alone.");
ABSL_FLAG(int32_t, kv_lease_ms, 30000,
          "Lease of each KV reservation on a decode worker: blocks whose prefill worker never "
          "commits (it died) return to the pool when it ends.");
ABSL_FLAG(int32_t, max_kv_wait_ms, 60000,
          "A request whose decode worker's KV cache is full waits for room at most this long "
          "(and never past its TTFT target when admission is on, nor past its deadline), then "
          "gets RESOURCE_EXHAUSTED with RetryInfo.");
ABSL_FLAG(int32_t, migration_limit, 3,
          "How many times one request may move to another worker pair when a worker fails "
          "under it (its stream breaks, it is unreachable or stopped, it answers UNAVAILABLE or "
          "ABORTED, or it stalls): the request resumes with its prompt plus the tokens already "
          "streamed and the client's stream goes on. 0: a failed worker fails its requests.");
ABSL_FLAG(int32_t, stall_timeout_ms, 10000,
          "A decode stream that brings no token for this long once its KV arrived is ended as "
          "stalled (and its request migrated). 0: no watchdog.");
ABSL_FLAG(int32_t, keepalive_ms, 2000,
          "HTTP/2 keepalive on every channel to a worker: a ping after this long, and the "
          "connection (with its calls, which migrate) dropped when no answer comes within as "
          "long again. A stopped worker is noticed in about twice this.");

namespace {

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    out.emplace_back(part);
  }
  return out;
}

trident::router::RouterServerOptions OptionsFromFlags() {
  trident::router::RouterServerOptions options;
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.model_name = absl::GetFlag(FLAGS_model_name);
  options.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  options.workers = SplitList(absl::GetFlag(FLAGS_workers));
  options.prefill_workers = SplitList(absl::GetFlag(FLAGS_prefill_workers));
  options.decode_workers = SplitList(absl::GetFlag(FLAGS_decode_workers));
  options.qos_config_path = absl::GetFlag(FLAGS_qos_config);
  options.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  options.admission = absl::GetFlag(FLAGS_admission);
  options.slo_margin = absl::GetFlag(FLAGS_slo_margin);
  options.learn_ttft_overhead = absl::GetFlag(FLAGS_admission_learn_ttft_overhead);
  options.idle_probe_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_admission_idle_probe_interval_ms));
  options.load.interval = absl::Milliseconds(absl::GetFlag(FLAGS_load_interval_ms));
  options.kv_lease = absl::Milliseconds(absl::GetFlag(FLAGS_kv_lease_ms));
  options.kv_aware_routing = absl::GetFlag(FLAGS_kv_aware_routing);
  options.allow_cpu_attention = absl::GetFlag(FLAGS_allow_cpu_attention);
  options.max_kv_wait = absl::Milliseconds(absl::GetFlag(FLAGS_max_kv_wait_ms));
  options.migration_limit = absl::GetFlag(FLAGS_migration_limit);
  options.stall_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_stall_timeout_ms));
  options.keepalive_interval = absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_ms));
  options.keepalive_timeout = options.keepalive_interval;
  options.controller_address = absl::GetFlag(FLAGS_controller_address);
  options.router_id = trident::controller_client::HostName();
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv,
      {.component = "router",
       .grpc_port = 50051,
       .metrics_port = 9401,
       .max_message_bytes = 16 << 20,
       .client_auth = trident::ClientAuth::kOptional},
      [](trident::ServiceRuntime& runtime) -> absl::Status {
        TRIDENT_ASSIGN_OR_RETURN(
            std::unique_ptr<trident::router::RouterServer> server,
            trident::router::RouterServer::Create(OptionsFromFlags(), &runtime.registry()));
        return runtime.Serve(server->services());
      });
}
