#include "services/router/router_server.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/frontend/model_info.h"
#include "common/logging/log.h"
#include "common/model/config.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"
#include "common/time/proto_time.h"
#include "services/router/admission/qos_config.h"
#include "services/router/admission/worker_load_proto.h"

namespace trident::router {

namespace v1 = ::trident::v1;

namespace {

std::vector<std::string> StaticAddresses(const RouterServerOptions& options) {
  std::set<std::string> all(options.workers.begin(), options.workers.end());
  all.insert(options.prefill_workers.begin(), options.prefill_workers.end());
  all.insert(options.decode_workers.begin(), options.decode_workers.end());
  return {all.begin(), all.end()};
}

absl::Status Validate(const RouterServerOptions& options) {
  if (options.model_dir.empty()) {
    return InvalidArgumentForField(
        "--model", "name the model directory the workers serve (config.json, tokenizer.json)");
  }
  if (options.slo_margin <= 0 || options.slo_margin > 1) {
    return InvalidArgumentForField("--slo_margin", "must be in (0, 1]");
  }
  if (options.kv_lease <= absl::ZeroDuration()) {
    return InvalidArgumentForField("--kv_lease_ms", "must be positive");
  }
  if (options.max_kv_wait < absl::ZeroDuration()) {
    return InvalidArgumentForField("--max_kv_wait_ms", "must not be negative");
  }
  if (options.migration_limit < 0) {
    return InvalidArgumentForField("--migration_limit", "must not be negative");
  }
  if (options.stall_timeout < absl::ZeroDuration()) {
    return InvalidArgumentForField("--stall_timeout_ms", "must not be negative");
  }
  if (options.keepalive_interval < absl::Seconds(1) ||
      options.keepalive_timeout <= absl::ZeroDuration()) {
    // Workers refuse pings more often than every second.
    return InvalidArgumentForField("--keepalive_ms", "must be at least 1000");
  }
  if (StaticAddresses(options).empty() && options.controller_address.empty()) {
    return InvalidArgumentForField(
        "--prefill_workers",
        "name at least one prefill and one decode worker (or --workers in role both), or a "
        "--controller_address whose topology names them");
  }
  return absl::OkStatus();
}

}  // namespace

RouterServer::RouterServer(RouterServerOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &own_clock_) {}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Create(RouterServerOptions options,
                                                                   prometheus::Registry* registry) {
  TRIDENT_RETURN_IF_ERROR(Validate(options));
  std::unique_ptr<RouterServer> server(new RouterServer(std::move(options)));
  TRIDENT_RETURN_IF_ERROR(server->LoadFrontend());
  TRIDENT_RETURN_IF_ERROR(server->BuildAdmission(registry));
  server->StartLoadStreams();
  TRIDENT_RETURN_IF_ERROR(server->StartTopologyWatch());
  if (!server->options_.api_keys_file.empty()) {
    absl::flat_hash_set<std::string> qos_classes;
    for (const auto& qos : server->info_.qos_classes()) qos_classes.insert(qos.name());
    TRIDENT_ASSIGN_OR_RETURN(
        server->authenticator_,
        auth::ApiKeyAuthenticator::Load(server->options_.api_keys_file, std::move(qos_classes),
                                        server->clock_, registry));
  }
  server->generation_ = std::make_unique<frontend::GenerationService>(
      server->remote_.get(), server->tokenizer_.get(), server->info_, server->clock_,
      /*gate=*/nullptr, server->authenticator_.get());
  return server;
}

RouterServer::~RouterServer() {
  // The watcher's callback changes the load streams, whose callbacks reach
  // admission, the metrics and the source: stop them in that order.
  watcher_.reset();
  loads_.reset();
}

absl::Status RouterServer::LoadFrontend() {
  TRIDENT_ASSIGN_OR_RETURN(const model::ModelConfig config,
                           model::LoadModelConfig(options_.model_dir));
  TRIDENT_ASSIGN_OR_RETURN(tokenizer_, tokenizer::Tokenizer::FromDirectory(options_.model_dir));
  int32_t max_len = config.max_position_embeddings;
  if (options_.max_model_len > 0) max_len = std::min(max_len, options_.max_model_len);
  info_ = frontend::ModelInfoFor(config, *tokenizer_, options_.model_dir, options_.model_name,
                                 max_len, /*kv_block_size=*/16, numeric::DType::kBF16);
  return absl::OkStatus();
}

absl::Status RouterServer::BuildAdmission(prometheus::Registry* registry) {
  admission::QosConfig qos = admission::QosConfig::SingleDefaultClass();
  if (!options_.qos_config_path.empty()) {
    TRIDENT_ASSIGN_OR_RETURN(qos, admission::LoadQosConfigFile(options_.qos_config_path));
  }
  // ModelInfo lists the classes GenerateRequest.qos_class accepts.
  for (const admission::QosClass& c : qos.classes) {
    trident::v1::QosClass* entry = info_.add_qos_classes();
    entry->set_name(c.name);
    entry->set_is_default(c.is_default);
    entry->set_priority(c.priority);
    entry->set_sheddable(c.sheddable);
    if (c.default_ttft.has_value()) {
      SetProtoDuration(*c.default_ttft, entry->mutable_default_slo()->mutable_ttft());
    }
    if (c.default_tpot.has_value()) {
      SetProtoDuration(*c.default_tpot, entry->mutable_default_slo()->mutable_tpot());
    }
  }
  admission::AdmissionOptions admission_options;
  admission_options.enabled = options_.admission;
  admission_options.slo_margin = options_.slo_margin;
  admission_options.learn_ttft_overhead = options_.learn_ttft_overhead;
  admission_options.idle_probe_interval = options_.idle_probe_interval;
  admission_ = std::make_unique<admission::AdmissionController>(admission_options, qos, clock_);
  metrics_ = std::make_unique<RouterMetrics>(*registry, qos);
  RemoteTokenSourceOptions remote_options;
  remote_options.reserve_lease = options_.kv_lease;
  remote_options.allow_cpu_attention = options_.allow_cpu_attention;
  remote_options.max_kv_wait = options_.max_kv_wait;
  remote_options.migration_limit = options_.migration_limit;
  remote_options.stall_timeout = options_.stall_timeout;
  remote_options.keepalive_interval = options_.keepalive_interval;
  remote_options.keepalive_timeout = options_.keepalive_timeout;
  remote_options.metrics = metrics_.get();
  remote_options.kv_index = options_.kv_aware_routing ? &kv_index_ : nullptr;
  remote_options.clock = clock_;
  remote_ = std::make_unique<RemoteTokenSource>(admission_.get(), remote_options);
  return absl::OkStatus();
}

void RouterServer::StartLoadStreams() {
  std::vector<std::string> initial = StaticAddresses(options_);
  {
    absl::MutexLock lock(&addresses_mu_);
    addresses_ = std::make_unique<WorkerAddressSet>(initial, options_.controller_restart_grace);
  }
  LoadCallbacks callbacks;
  callbacks.on_load = [this](const std::string& address, const v1::WorkerLoad& load) {
    OnLoad(address, load);
  };
  callbacks.on_down = [this](const std::string& address, const absl::Status&) { OnDown(address); };
  loads_ =
      std::make_unique<LoadSubscriber>(std::move(initial), std::move(callbacks), options_.load);
}

absl::Status RouterServer::StartTopologyWatch() {
  if (options_.controller_address.empty()) return absl::OkStatus();
  controller_client::TopologyWatcherOptions watch;
  watch.controller_address = options_.controller_address;
  watch.watcher_id = options_.router_id;
  watch.backoff = options_.controller_backoff;
  watch.seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  TRIDENT_ASSIGN_OR_RETURN(watcher_,
                           controller_client::TopologyWatcher::Create(
                               std::move(watch), [this](const v1::Topology& t) { OnTopology(t); }));
  watcher_->Start();
  TRIDENT_LOG(INFO) << "following the workers of the controller at " << options_.controller_address;
  return absl::OkStatus();
}

void RouterServer::OnLoad(const std::string& address, const v1::WorkerLoad& load) {
  bool known = false;
  {
    absl::MutexLock lock(&ids_mu_);
    auto it = ids_.find(address);
    known = it != ids_.end() && it->second == load.worker_id();
  }
  // Only for an address not yet known to serve this worker: every sample
  // would otherwise take the request path's lock to write it again.
  if (!known) remote_->SetWorkerAddress(load.worker_id(), address);
  if (load.has_kv_events()) {
    if (absl::Status s = kv_index_.Apply(load.worker_id(), load.incarnation(), load.kv_events());
        !s.ok()) {
      TRIDENT_LOG(WARNING) << "KV events from " << address << ": " << s;
    }
  }
  if (load.has_dram_kv_events()) {
    kv_index_.SetDramHitValue(load.worker_id(), load.dram_hit_value());
    if (absl::Status s = kv_index_.Apply(kv_index::KvIndex::DramSource(load.worker_id()),
                                         load.incarnation(), load.dram_kv_events());
        !s.ok()) {
      TRIDENT_LOG(WARNING) << "DRAM-tier KV events from " << address << ": " << s;
    }
  }
  absl::StatusOr<admission::WorkerLoadReport> report = admission::WorkerLoadReportFromProto(load);
  if (!report.ok()) {
    TRIDENT_LOG(WARNING) << "bad load report from " << address << ": " << report.status();
    return;
  }
  if (absl::Status s = admission_->UpdateLoad(*report); !s.ok()) {
    TRIDENT_LOG(WARNING) << "load report from " << address << ": " << s;
    return;
  }
  metrics_->UpdateWorkerLoad(*report);
  absl::MutexLock lock(&ids_mu_);
  ids_[address] = load.worker_id();
}

void RouterServer::OnDown(const std::string& address) {
  std::string id;
  {
    // This address's stream is over: no OnLoad for it runs concurrently.
    absl::MutexLock lock(&ids_mu_);
    auto it = ids_.find(address);
    if (it == ids_.end()) return;
    id = it->second;
    ids_.erase(it);
    // The worker is still reached under another address (e.g. a static one
    // and the name it advertised): it stays.
    for (const auto& [other, other_id] : ids_) {
      if (other_id == id) return;
    }
  }
  admission_->RemoveWorker(id);
  metrics_->RemoveWorker(id);
  kv_index_.RemoveWorker(id);
}

void RouterServer::OnTopology(const v1::Topology& topology) {
  std::vector<std::string> wanted;
  {
    absl::MutexLock lock(&addresses_mu_);
    wanted = addresses_->Update(topology, clock_->Now());
  }
  TRIDENT_LOG(INFO) << "topology " << topology.version() << " (controller incarnation "
                    << topology.controller_incarnation() << "): following "
                    << absl::StrJoin(wanted, ",");
  loads_->SetAddresses(wanted);
}

std::vector<RegisteredService> RouterServer::services() {
  return {{generation_.get(), v1::Generation::service_full_name()}};
}

std::vector<std::string> RouterServer::WorkerAddresses() const { return loads_->addresses(); }

std::map<std::string, std::string> RouterServer::LiveWorkers() const {
  absl::MutexLock lock(&ids_mu_);
  return ids_;
}

bool RouterServer::AwaitLiveWorkers(
    const std::function<bool(const std::map<std::string, std::string>&)>& condition,
    absl::Duration timeout) const {
  absl::MutexLock lock(&ids_mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ids_mu_) { return condition(ids_); };
  return ids_mu_.AwaitWithTimeout(absl::Condition(&holds), timeout);
}

}  // namespace trident::router
