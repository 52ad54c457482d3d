// RemoteAttention over UCX (attention_wire.h's messages), on the decode
// worker's UcxLanes: one client per process, one RemoteAttention per
// attention service it talks to.
//
// Requests go out round-robin over the lanes both sides have; a reply comes
// back on the lane its request left from and is copied into the caller's
// output rows on that lane's progress thread, under the client's lock, so a
// Wait that gave up (timeout) is never written into afterwards.
//
// Thread-safe. The client must outlive the RemoteAttentions it made.

#ifndef TRIDENT_COMMON_TRANSPORT_ATTENTION_UCX_ATTENTION_CLIENT_H_
#define TRIDENT_COMMON_TRANSPORT_ATTENTION_UCX_ATTENTION_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/transport/attention/message_buffers.h"
#include "common/transport/attention/remote_attention.h"
#include "common/transport/ucx_lanes.h"
#include "trident/v1/cluster.pb.h"

namespace trident::transport::attention {

class UcxAttentionClient {
 public:
  // Installs the reply handler on every lane of `lanes` (not owned; must
  // outlive the client). `owner_incarnation` is the caller's
  // TransportEndpoint.incarnation, the one its attention sessions use.
  static absl::StatusOr<std::unique_ptr<UcxAttentionClient>> Create(UcxLanes* lanes,
                                                                    uint64_t owner_incarnation);
  // Fails every pending request (UNAVAILABLE) and stops taking replies.
  ~UcxAttentionClient();

  UcxAttentionClient(const UcxAttentionClient&) = delete;
  UcxAttentionClient& operator=(const UcxAttentionClient&) = delete;

  // The service whose ConnectResponse.server is `service`: connects to its
  // lanes (blocking: UcxLanes::EndpointsTo and its errors).
  absl::StatusOr<std::unique_ptr<RemoteAttention>> ForService(
      const trident::v1::TransportEndpoint& service);

  // Requests sent and replies taken since start.
  int64_t requests_sent() const { return requests_sent_.load(std::memory_order_relaxed); }
  int64_t bad_replies() const { return bad_replies_.load(std::memory_order_relaxed); }

 private:
  class ServiceChannel;
  struct Pending {
    float* out = nullptr;
    int64_t out_stride = 0;
    uint16_t* out_bf16 = nullptr;
    int64_t out_bf16_stride = 0;
    int32_t num_sequences = 0;
    int64_t row_elements = 0;
    WireDType dtype = WireDType::kF32;
    // A block-store request: a get's blocks go to block_out.
    bool blocks = false;
    char* block_out = nullptr;
    size_t block_bytes = 0;
    bool done = false;
    absl::Status status;
  };

  UcxAttentionClient(UcxLanes* lanes, uint64_t owner_incarnation)
      : lanes_(lanes), owner_incarnation_(owner_incarnation) {}
  void OnReply(absl::string_view header, absl::string_view data) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t AddPending(const AttentionCall& call) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t AddBlockPending(char* out, size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // OnReply's part for a block-store reply.
  void TakeBlockReply(const ReplyHeader& h, absl::string_view data, Pending& pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(uint64_t request_id, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Wait(uint64_t request_id, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  UcxLanes* const lanes_;
  const uint64_t owner_incarnation_;
  std::atomic<uint64_t> next_request_id_{1};
  // Request data, reused once each send completes.
  MessageBuffers buffers_;
  std::atomic<int64_t> requests_sent_{0};
  std::atomic<int64_t> bad_replies_{0};
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Node map: Wait holds a pointer into it across rehashes.
  absl::node_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::transport::attention

#endif  // TRIDENT_COMMON_TRANSPORT_ATTENTION_UCX_ATTENTION_CLIENT_H_
