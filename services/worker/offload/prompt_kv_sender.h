// The prefill side of a CPU-placed prompt: a transport::KvSender that
// writes the KV of destinations with `cpu_resident` set straight into the
// CPU attention service that the decode worker admitted the sequence at,
// and hands every other destination to the worker's KV transport.
//
// For such a destination, Open connects to the service named by
// attention_address (Attention.Connect, once per service incarnation, as
// this worker's session) and each SendLayer copies that layer of the
// prompt with append-only prompt writes (ServiceKvCopier, with the
// destination's attention_handle and attention_write_key). A layer's
// `done` runs once the service has stored every row of it, so the commit
// that follows (Decode.CommitKv) hands over KV that is all there;
// message_bytes() is 0.
//
// Thread-safe.

#ifndef TRIDENT_SERVICES_WORKER_OFFLOAD_PROMPT_KV_SENDER_H_
#define TRIDENT_SERVICES_WORKER_OFFLOAD_PROMPT_KV_SENDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backend/model_backend.h"
#include "common/transport/attention/ucx_attention_client.h"
#include "common/transport/kv/kv_sender.h"
#include "common/transport/ucx_lanes.h"
#include "common/transport/ucx_worker.h"
#include "services/worker/offload/attention_session.h"
#include "services/worker/offload/service_kv_copier.h"
#include "trident/v1/attention.grpc.pb.h"

namespace trident::worker {

struct PromptKvSenderOptions {
  // This worker's session at the services: its TransportEndpoint
  // owner_id and incarnation.
  std::string worker_id;
  uint64_t incarnation = 0;
  // Deadline of Attention.Connect, and the longest a layer's writes wait
  // for the service's answers.
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration write_timeout = absl::Seconds(10);
};

// The attention data plane's client of this process, when there is one
// already (the decode side's offload): the sender shares it and its
// endpoint, whose owner id and incarnation must be the sender's.
struct SharedAttentionClient {
  transport::attention::UcxAttentionClient* client = nullptr;
  trident::v1::TransportEndpoint endpoint;
};

class PromptKvSender final : public transport::KvSender {
 public:
  // `base` (the worker's KV transport; may be null: only CPU-placed
  // destinations can then be written), `ucx` and `backend` must outlive
  // the sender. Without `shared`, it makes a client of its own on `ucx`.
  static absl::StatusOr<std::unique_ptr<PromptKvSender>> Create(
      PromptKvSenderOptions options, transport::KvSender* base, transport::UcxWorker* ucx,
      const backend::ModelBackend& backend, SharedAttentionClient shared = SharedAttentionClient());

  int32_t num_layers() const override;
  // FAILED_PRECONDITION for a CPU-placed destination without an address,
  // handle or write key, or whose layout is not this model's; the
  // service's errors from Connect (UNAVAILABLE when it cannot be reached).
  absl::StatusOr<std::unique_ptr<transport::KvTransfer>> Open(
      const trident::v1::KvDestination& destination) override;
  absl::Status Connect(const trident::v1::KvDestination& destination) override;

 private:
  struct Service {
    std::unique_ptr<trident::v1::Attention::Stub> stub;
    // The data-plane channel of the service incarnation last connected to;
    // earlier ones stay alive for transfers still using them.
    std::vector<std::unique_ptr<transport::attention::RemoteAttention>> channels;
    uint64_t incarnation = 0;
    bool connected = false;
  };
  class Transfer;

  PromptKvSender(PromptKvSenderOptions options, transport::KvSender* base,
                 std::unique_ptr<ServiceKvCopier> copier);
  // The channel to the destination's service, connecting first if this
  // worker has no session with that incarnation of it.
  absl::StatusOr<transport::attention::RemoteAttention*> ChannelFor(
      const trident::v1::KvDestination& destination) ABSL_LOCKS_EXCLUDED(mu_);
  // A channel's request failed: the next Open connects again.
  void Disconnected(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  std::unique_ptr<ServiceKvCopier::Scratch> TakeScratch() ABSL_LOCKS_EXCLUDED(mu_);
  void ReturnScratch(std::unique_ptr<ServiceKvCopier::Scratch> scratch) ABSL_LOCKS_EXCLUDED(mu_);

  const PromptKvSenderOptions options_;
  transport::KvSender* const base_;
  const std::unique_ptr<ServiceKvCopier> copier_;
  // Own client (no shared one), and the one used.
  std::unique_ptr<transport::UcxLanes> lanes_;
  std::unique_ptr<transport::attention::UcxAttentionClient> own_client_;
  transport::attention::UcxAttentionClient* client_ = nullptr;
  trident::v1::TransportEndpoint endpoint_;

  absl::Mutex mu_;
  // By gRPC address; never erased (transfers hold their channels).
  absl::flat_hash_map<std::string, std::unique_ptr<Service>> services_ ABSL_GUARDED_BY(mu_);
  // Staging buffers of finished transfers, for the next ones.
  std::vector<std::unique_ptr<ServiceKvCopier::Scratch>> scratch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_OFFLOAD_PROMPT_KV_SENDER_H_
