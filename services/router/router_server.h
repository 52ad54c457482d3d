// A router process's parts, wired together. main.cc fills
// RouterServerOptions from its flags and serves services(); tests build one
// on a small generated model and serve it on port 0.
//
// What it owns, built top to bottom and destroyed bottom to top:
//
//   tokenizer, ModelInfo       the front half's (no weights are read)
//   AdmissionController        SLO admission on the workers' live load
//   RouterMetrics              trident_router_*
//   RemoteTokenSource          ReserveKv / Prefill / Decode on the chosen
//                              workers
//   LoadSubscriber             one GetLoad stream per followed worker:
//                              samples feed admission, the metrics and the
//                              worker-id -> address map; an ended stream
//                              (or a worker leaving the set) removes the
//                              worker from admission
//   WorkerAddressSet,          with a controller: the followed set is the
//   TopologyWatcher            static addresses plus the topology's workers
//                              that are not DEAD; while the controller is
//                              away the last topology's set stays
//   GenerationService          trident.v1.Generation over the source
//
// A worker's role comes from its own load stream, whichever way its address
// was learned.

#ifndef TRIDENT_SERVICES_ROUTER_ROUTER_SERVER_H_
#define TRIDENT_SERVICES_ROUTER_ROUTER_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/controller_client/backoff.h"
#include "common/controller_client/topology_watcher.h"
#include "common/frontend/generation_service.h"
#include "common/grpc/server.h"
#include "common/time/clock.h"
#include "common/tokenizer/tokenizer.h"
#include "prometheus/registry.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/auth/api_keys.h"
#include "services/router/kv_index/kv_index.h"
#include "services/router/load_subscriber.h"
#include "services/router/remote_token_source.h"
#include "services/router/router_metrics.h"
#include "services/router/worker_address_set.h"
#include "trident/v1/generation.pb.h"

namespace trident::router {

struct RouterServerOptions {
  // Model directory (config.json, tokenizer.json). Required.
  std::string model_dir;
  // Name ModelInfo reports; empty: the directory's name.
  std::string model_name;
  // Longest prompt + output; 0: the model's max_position_embeddings.
  int32_t max_model_len = 0;
  // Static worker addresses (host:port), always followed. A worker's role
  // comes from its load reports, whichever list names it; `workers` is for
  // those of any role (e.g. role both, colocated).
  std::vector<std::string> workers;
  std::vector<std::string> prefill_workers;
  std::vector<std::string> decode_workers;
  // QoS classes file (JSON); empty: one default class without targets.
  std::string qos_config_path;
  // Hashed API keys (services/router/auth/api_keys.h); empty: every caller
  // is served without one.
  std::string api_keys_file;
  // SLO admission (false: everything to the least-loaded pair).
  bool admission = true;
  // Fraction of the SLO targets predictions must stay within; (0, 1].
  double slo_margin = 0.85;
  // AdmissionOptions::learn_ttft_overhead.
  bool learn_ttft_overhead = true;
  // AdmissionOptions::idle_probe_interval (zero: no probes).
  absl::Duration idle_probe_interval = absl::Seconds(1);
  // The workers' load streams.
  LoadSubscriberOptions load;
  // Lease of each KV reservation; > 0.
  absl::Duration kv_lease = absl::Seconds(30);
  // RemoteTokenSourceOptions::allow_cpu_attention (--allow_cpu_attention).
  bool allow_cpu_attention = true;
  // Price each prefill worker at the prompt tokens its cache lacks (the
  // workers' KV events); false: by load alone (--kv_aware_routing).
  bool kv_aware_routing = true;
  // Longest wait for KV room on a full decode worker; >= 0.
  absl::Duration max_kv_wait = absl::Seconds(60);
  // Migration and failure detection (RemoteTokenSourceOptions): the most
  // migrations per request (>= 0), the stall watchdog (zero: off) and the
  // keepalive on every channel to a worker (> 0).
  int migration_limit = 3;
  absl::Duration stall_timeout = absl::Seconds(10);
  absl::Duration keepalive_interval = absl::Seconds(2);
  absl::Duration keepalive_timeout = absl::Seconds(2);
  // host:port of the controller whose topology names the workers; empty:
  // the static addresses only.
  std::string controller_address;
  // WatchTopologyRequest.watcher_id.
  std::string router_id = "router";
  // Reconnection bounds of the topology watch.
  controller_client::BackoffOptions controller_backoff;
  // WorkerAddressSet's restart grace.
  absl::Duration controller_restart_grace = absl::Seconds(30);
  // Not owned; must outlive the server. Null: a RealClock of its own.
  Clock* clock = nullptr;
};

// Thread-safe.
class RouterServer {
 public:
  // Reads the model's config and tokenizer, loads the QoS classes, starts
  // the load streams and (with a controller address) the topology watch.
  // `registry` (not owned; must outlive the server) takes the router's
  // metrics. Errors: INVALID_ARGUMENT naming the flag for a missing model
  // directory, out-of-range options, or no worker and no controller;
  // LoadModelConfig's, the tokenizer's and LoadQosConfigFile's.
  static absl::StatusOr<std::unique_ptr<RouterServer>> Create(RouterServerOptions options,
                                                              prometheus::Registry* registry);

  // Stops the topology watch, then the load streams. Stop serving
  // services() first.
  ~RouterServer();

  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  // trident.v1.Generation, living as long as this.
  std::vector<RegisteredService> services();

  // The worker addresses whose load is followed now, sorted.
  std::vector<std::string> WorkerAddresses() const;

  // Worker id by address of the workers admission may choose: from a
  // worker's first valid load sample until its stream ends or it leaves
  // the followed set.
  std::map<std::string, std::string> LiveWorkers() const ABSL_LOCKS_EXCLUDED(ids_mu_);

  // Blocks until `condition(LiveWorkers())` holds or `timeout` passes;
  // returns whether it held.
  bool AwaitLiveWorkers(
      const std::function<bool(const std::map<std::string, std::string>&)>& condition,
      absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(ids_mu_);

  // What a test checks. Null without a controller address.
  const controller_client::TopologyWatcher* TopologyWatcherForTesting() const {
    return watcher_.get();
  }
  const admission::AdmissionController& AdmissionForTesting() const { return *admission_; }

 private:
  explicit RouterServer(RouterServerOptions options);

  // Create's steps, in order.
  absl::Status LoadFrontend();
  absl::Status BuildAdmission(prometheus::Registry* registry);
  void StartLoadStreams();
  absl::Status StartTopologyWatch();

  // LoadSubscriber's callbacks.
  void OnLoad(const std::string& address, const trident::v1::WorkerLoad& load);
  void OnDown(const std::string& address);
  // The watcher's callback.
  void OnTopology(const trident::v1::Topology& topology);

  const RouterServerOptions options_;
  RealClock own_clock_;
  Clock* const clock_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  trident::v1::ModelInfoResponse info_;
  std::unique_ptr<admission::AdmissionController> admission_;
  // The workers' prefix caches, from their load streams' KV events.
  kv_index::KvIndex kv_index_;
  std::unique_ptr<RouterMetrics> metrics_;
  std::unique_ptr<RemoteTokenSource> remote_;
  // Worker id by address, learned from the load streams (LiveWorkers).
  mutable absl::Mutex ids_mu_;
  std::map<std::string, std::string> ids_ ABSL_GUARDED_BY(ids_mu_);
  std::unique_ptr<LoadSubscriber> loads_;
  // Only the watcher's thread updates it after Create.
  absl::Mutex addresses_mu_;
  std::unique_ptr<WorkerAddressSet> addresses_ ABSL_GUARDED_BY(addresses_mu_);
  std::unique_ptr<controller_client::TopologyWatcher> watcher_;
  std::unique_ptr<auth::ApiKeyAuthenticator> authenticator_;
  std::unique_ptr<frontend::GenerationService> generation_;
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_ROUTER_SERVER_H_
