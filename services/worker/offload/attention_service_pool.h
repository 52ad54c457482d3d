// The one place in a worker that knows its CPU attention services: connects
// to each (a session: Attention.Connect, then the data-plane channel), picks
// one for a new sequence, admits and releases sequences, and keeps
// housekeeping off the engine loop: a thread that releases what is queued
// and reconnects to services that failed (every reconnect_interval).
// The offload (attention_offload.h) places and moves sequences through it;
// the KV tier (services/worker/kv_tier) reaches the services' block stores
// through it.
//
//   AttentionServicePool
//    ├─ UcxLanes (1 lane on the worker's UCX worker) + UcxAttentionClient
//    └─ per service: gRPC stub, RemoteAttention channel, state
//
// Thread-safe.

#ifndef TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_SERVICE_POOL_H_
#define TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_SERVICE_POOL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/grpc/async_unary.h"
#include "common/kv/block_key.h"
#include "common/kv/kv_layout.h"
#include "common/transport/attention/remote_attention.h"
#include "common/transport/attention/ucx_attention_client.h"
#include "common/transport/ucx_lanes.h"
#include "common/transport/ucx_worker.h"
#include "services/worker/offload/cost_tables.h"
#include "trident/v1/attention.grpc.pb.h"

namespace trident::worker {

struct AttentionServicePoolOptions {
  // host:port of each attention service's gRPC endpoint.
  std::vector<std::string> services;
  std::string worker_id;
  uint64_t incarnation = 0;
  // Deadline of each control RPC.
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration reconnect_interval = absl::Seconds(2);
  // UCX lanes (workers with their own progress threads) to the services:
  // requests spread over min(this, the service's --lanes). Replies are
  // received and copied on a lane's progress thread, so a DRAM-tier fetch
  // with gets in flight on several lanes moves several times as much.
  int32_t lanes = 1;
};

// The full leading blocks of a sequence being admitted, which the service
// reads in place from its block store as far as it holds them.
struct AdmitPrefix {
  const trident::v1::BlockFormat* format = nullptr;  // Null: none.
  absl::Span<const kv::BlockKey> keys;
};

class AttentionServicePool {
 public:
  struct Service {
    std::string address;
    std::unique_ptr<trident::v1::Attention::Stub> stub;  // Thread-safe.
    // Measured by the offload at the first connection, before the engine
    // runs (not changed after).
    bool calibrated = false;
    ServiceCosts costs;
  };

  // Connects to every service it can (one that cannot be reached now is
  // retried later); `ucx` (the worker's, not owned) must outlive the pool.
  // INVALID_ARGUMENT for no services; UcxLanes' errors.
  static absl::StatusOr<std::unique_ptr<AttentionServicePool>> Create(
      AttentionServicePoolOptions options, transport::UcxWorker* ucx);
  // Stops the housekeeping thread; copies not yet released are freed by
  // their services when this worker's session ends (its grace period).
  ~AttentionServicePool();

  const AttentionServicePoolOptions& options() const { return options_; }
  // The data plane's client and this worker's endpoint (the prefill side's
  // PromptKvSender shares them).
  transport::attention::UcxAttentionClient* client() const { return client_.get(); }
  const trident::v1::TransportEndpoint& endpoint() const { return endpoint_; }

  // Every service, connected or not, in the order given (stable pointers).
  std::vector<Service*> services() const;
  bool connected(const Service& service) const ABSL_LOCKS_EXCLUDED(mu_);
  // A connected service with the fewest sequences; null when none.
  Service* PickService() ABSL_LOCKS_EXCLUDED(mu_);
  // The service's current data-plane channel (null before its first
  // connection; a channel replaced by a reconnection stays valid for the
  // pool's life) and its id.
  transport::attention::RemoteAttention* channel(const Service& service) const
      ABSL_LOCKS_EXCLUDED(mu_);
  std::string service_id(const Service& service) const ABSL_LOCKS_EXCLUDED(mu_);

  // Sequences held for us at `service`, as far as we know: +1 admitted and
  // moved, -1 released.
  void CountSequence(Service& service, int delta) ABSL_LOCKS_EXCLUDED(mu_);
  // After a failed call to `service`: UNAVAILABLE and DEADLINE_EXCEEDED
  // mark it disconnected (the housekeeping thread reconnects).
  void NoteFailure(Service& service, const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_);

  // AdmitSequence for `id` with room for `capacity` tokens of `spec`'s
  // shape and `num_q_heads` query heads; block size and packing are the
  // service's choice (its block store's, for an in-place prefix:
  // AdmitSequenceResponse.in_place_tokens).
  absl::StatusOr<trident::v1::AdmitSequenceResponse> Admit(Service& service, const std::string& id,
                                                           int32_t capacity,
                                                           const kv::KvCacheSpec& spec,
                                                           int32_t num_q_heads,
                                                           AdmitPrefix prefix = {});
  // The same without blocking: `done` gets the answer on a gRPC callback
  // thread (CallUnaryAsync). `service` must outlive the call.
  void AdmitAsync(Service& service, const std::string& id, int32_t capacity,
                  const kv::KvCacheSpec& spec, int32_t num_q_heads, AdmitPrefix prefix,
                  UnaryDone<trident::v1::AdmitSequenceResponse> done);
  // ReleaseSequence, now (blocking).
  absl::Status ReleaseAt(Service& service, uint64_t handle);
  // ReleaseSequence later, on the housekeeping thread.
  void QueueRelease(Service& service, uint64_t handle) ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a copy named by its channel: counts it released and queues
  // the release. False when no current channel is `channel` (its service
  // restarted or failed: the copy is gone).
  bool QueueReleaseOf(const transport::attention::RemoteAttention* channel, uint64_t handle)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  trident::v1::AdmitSequenceRequest AdmitRequest(const std::string& id, int32_t capacity,
                                                 const kv::KvCacheSpec& spec, int32_t num_q_heads,
                                                 AdmitPrefix prefix) const;
  struct State {
    std::unique_ptr<transport::attention::RemoteAttention> channel;
    std::string service_id;  // Its ConnectResponse.server.owner_id.
    bool connected = false;
    absl::Time next_attempt = absl::InfinitePast();
    int32_t sequences = 0;
  };
  struct Release {
    Service* service = nullptr;
    uint64_t handle = 0;
  };

  explicit AttentionServicePool(AttentionServicePoolOptions options)
      : options_(std::move(options)) {}
  absl::Status Start(transport::UcxWorker* ucx);
  // Connect: the session and the data-plane channel.
  absl::Status Connect(Service& service) ABSL_LOCKS_EXCLUDED(mu_);
  void HousekeepingLoop();
  State& state(const Service& service) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const State& state(const Service& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const AttentionServicePoolOptions options_;
  std::unique_ptr<transport::UcxLanes> lanes_;
  std::unique_ptr<transport::attention::UcxAttentionClient> client_;
  trident::v1::TransportEndpoint endpoint_;
  std::vector<std::unique_ptr<Service>> services_;

  mutable absl::Mutex mu_;
  // Parallel to services_.
  std::vector<State> states_ ABSL_GUARDED_BY(mu_);
  // Channels of earlier connections, kept while the engine may name them.
  std::vector<std::unique_ptr<transport::attention::RemoteAttention>> retired_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Release> releases_ ABSL_GUARDED_BY(mu_);
  std::thread housekeeping_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_SERVICE_POOL_H_
