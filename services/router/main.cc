// The router: Trident's public gRPC endpoint (trident.v1.Generation).
// Tokenization, validation, stop strings and streamed text are the same front
// half a worker in role `both` serves; behind it, each request is admitted
// against its SLO (services/router/admission) on the live load of the
// workers, then runs on a (decode, prefill) pair: ReserveKv, Prefill into
// the reservation, Decode (RemoteTokenSource).

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/frontend/generation_service.h"
#include "common/frontend/model_info.h"
#include "common/logging/log.h"
#include "common/model/config.h"
#include "common/service/service_runtime.h"
#include "common/status/error_details.h"
#include "common/time/clock.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/admission/qos_config.h"
#include "services/router/admission/worker_load_proto.h"
#include "services/router/load_subscriber.h"
#include "services/router/remote_token_source.h"
#include "services/router/router_metrics.h"

ABSL_FLAG(std::string, model, "",
          "Model directory (config.json, tokenizer.json) the workers serve; the router reads "
          "no weights. Required.");
ABSL_FLAG(std::string, model_name, "", "Name ModelInfo reports; empty: the directory's name.");
ABSL_FLAG(int32_t, max_model_len, 0,
          "Longest prompt + output accepted; 0: the model's max_position_embeddings. Keep it "
          "at or below the workers' own limit.");
ABSL_FLAG(std::string, prefill_workers, "", "Comma-separated host:port of prefill workers.");
ABSL_FLAG(std::string, decode_workers, "", "Comma-separated host:port of decode workers.");
ABSL_FLAG(std::string, qos_config, "",
          "QoS classes (JSON; see services/router/admission/qos_config.h); empty: one default "
          "class without targets.");
ABSL_FLAG(bool, admission, true,
          "SLO admission: reject at once (RESOURCE_EXHAUSTED with RetryInfo) a request no "
          "worker pair is predicted to serve within its SLO. false: admit everything to the "
          "least-loaded pair.");
ABSL_FLAG(double, slo_margin, 0.85,
          "Admission admits a request only if its predicted TTFT and TPOT are within this "
          "fraction of its targets: headroom for step-time noise the cost models do not see.");
ABSL_FLAG(int32_t, load_interval_ms, 100, "Interval of the workers' load streams.");
ABSL_FLAG(int32_t, kv_lease_ms, 30000,
          "Lease of each KV reservation on a decode worker: blocks whose prefill worker never "
          "commits (it died) return to the pool when it ends.");
ABSL_FLAG(int32_t, max_kv_wait_ms, 60000,
          "A request whose decode worker's KV cache is full waits for room at most this long "
          "(and never past its TTFT target when admission is on, nor past its deadline), then "
          "gets RESOURCE_EXHAUSTED with RetryInfo.");

namespace {

std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    out.emplace_back(part);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv, {.component = "router", .grpc_port = 50051, .metrics_port = 9401},
      [](trident::ServiceRuntime& runtime) -> absl::Status {
        namespace admission = trident::router::admission;
        const std::string model_dir = absl::GetFlag(FLAGS_model);
        if (model_dir.empty()) {
          return trident::InvalidArgumentForField(
              "--model", "name the model directory the workers serve (config.json, tokenizer.json)");
        }
        absl::StatusOr<trident::model::ModelConfig> config =
            trident::model::LoadModelConfig(model_dir);
        if (!config.ok()) return config.status();
        absl::StatusOr<std::unique_ptr<trident::tokenizer::Tokenizer>> tokenizer =
            trident::tokenizer::Tokenizer::FromDirectory(model_dir);
        if (!tokenizer.ok()) return tokenizer.status();
        int32_t max_len = config->max_position_embeddings;
        if (absl::GetFlag(FLAGS_max_model_len) > 0) {
          max_len = std::min(max_len, absl::GetFlag(FLAGS_max_model_len));
        }
        const trident::v1::ModelInfoResponse info = trident::frontend::ModelInfoFor(
            *config, **tokenizer, model_dir, absl::GetFlag(FLAGS_model_name), max_len,
            /*kv_block_size=*/16, trident::numeric::DType::kBF16);

        admission::QosConfig qos = admission::QosConfig::SingleDefaultClass();
        if (!absl::GetFlag(FLAGS_qos_config).empty()) {
          absl::StatusOr<admission::QosConfig> loaded =
              admission::LoadQosConfigFile(absl::GetFlag(FLAGS_qos_config));
          if (!loaded.ok()) return loaded.status();
          qos = std::move(*loaded);
        }
        admission::AdmissionOptions admission_options;
        admission_options.enabled = absl::GetFlag(FLAGS_admission);
        if (absl::GetFlag(FLAGS_slo_margin) <= 0 || absl::GetFlag(FLAGS_slo_margin) > 1) {
          return trident::InvalidArgumentForField("--slo_margin", "must be in (0, 1]");
        }
        admission_options.slo_margin = absl::GetFlag(FLAGS_slo_margin);
        trident::RealClock clock;
        admission::AdmissionController controller(admission_options, qos, &clock);
        if (absl::GetFlag(FLAGS_kv_lease_ms) <= 0) {
          return trident::InvalidArgumentForField("--kv_lease_ms", "must be positive");
        }
        trident::router::RouterMetrics metrics(runtime.registry(), qos);
        trident::router::RemoteTokenSourceOptions remote_options;
        remote_options.reserve_lease = absl::Milliseconds(absl::GetFlag(FLAGS_kv_lease_ms));
        if (absl::GetFlag(FLAGS_max_kv_wait_ms) < 0) {
          return trident::InvalidArgumentForField("--max_kv_wait_ms", "must not be negative");
        }
        remote_options.max_kv_wait = absl::Milliseconds(absl::GetFlag(FLAGS_max_kv_wait_ms));
        remote_options.metrics = &metrics;
        remote_options.clock = &clock;
        trident::router::RemoteTokenSource remote(&controller, remote_options);

        std::set<std::string> addresses;
        for (const std::string& a : SplitList(absl::GetFlag(FLAGS_prefill_workers))) {
          addresses.insert(a);
        }
        for (const std::string& a : SplitList(absl::GetFlag(FLAGS_decode_workers))) {
          addresses.insert(a);
        }
        if (addresses.empty()) {
          return trident::InvalidArgumentForField(
              "--prefill_workers", "name at least one prefill and one decode worker");
        }
        // Worker id by address, learned from the load streams.
        absl::Mutex ids_mu;
        std::map<std::string, std::string> ids;
        trident::router::LoadCallbacks callbacks;
        callbacks.on_load = [&](const std::string& address, const trident::v1::WorkerLoad& load) {
          {
            absl::MutexLock lock(&ids_mu);
            ids[address] = load.worker_id();
          }
          remote.SetWorkerAddress(load.worker_id(), address);
          absl::StatusOr<admission::WorkerLoadReport> report =
              admission::WorkerLoadReportFromProto(load);
          if (!report.ok()) {
            TRIDENT_LOG(WARNING) << "bad load report from " << address << ": " << report.status();
            return;
          }
          if (absl::Status s = controller.UpdateLoad(*report); !s.ok()) {
            TRIDENT_LOG(WARNING) << "load report from " << address << ": " << s;
            return;
          }
          metrics.UpdateWorkerLoad(*report);
        };
        callbacks.on_down = [&](const std::string& address, const absl::Status&) {
          std::string id;
          {
            absl::MutexLock lock(&ids_mu);
            id = ids[address];
          }
          if (!id.empty()) {
            controller.RemoveWorker(id);
            metrics.RemoveWorker(id);
          }
        };
        trident::router::LoadSubscriberOptions load_options;
        load_options.interval = absl::Milliseconds(absl::GetFlag(FLAGS_load_interval_ms));
        trident::router::LoadSubscriber loads(
            std::vector<std::string>(addresses.begin(), addresses.end()), callbacks, load_options);

        trident::frontend::GenerationService generation(&remote, tokenizer->get(), info, &clock);
        return runtime.Serve({{&generation, trident::v1::Generation::service_full_name()}});
      });
}
