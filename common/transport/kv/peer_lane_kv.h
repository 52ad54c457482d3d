// The KV data plane with a GPU-to-GPU lane beside UCX: KvReceiver and
// KvSender over another pair (UcxKv) and a backend's KvPeerLane
// (common/backend/kv_peer_lane.h, CUDA IPC).
//
// Receiving: Describe adds the pool's export (KvDestination.peer_pool, with
// this host's identity) to what the inner receiver describes.
// Sending: Open and Connect choose the lane per destination, at connection
// time:
//
//   destination exports a peer pool, from this host, not CPU-resident
//     -> the pool mapped (once per decode worker incarnation; a new one
//        unmaps the old) -> PeerLaneTransfer: each layer's collated runs
//        (PlanLayerPuts) copied GPU to GPU, one-sided, as KvWriter's puts:
//        `done` once they landed; nothing for the receiver to count
//   otherwise, or when the mapping fails (logged once per incarnation)
//     -> the inner sender (UCX)
//
// Reservations, leases and aborts are the transport's callers' and hold
// unchanged: the lane writes only into the blocks of the destination, only
// while the caller posts layers, and the commit follows the last `done`.

#ifndef TRIDENT_COMMON_TRANSPORT_KV_PEER_LANE_KV_H_
#define TRIDENT_COMMON_TRANSPORT_KV_PEER_LANE_KV_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/kv_peer_lane.h"
#include "common/kv/kv_layout.h"
#include "common/transport/kv/kv_receiver.h"
#include "common/transport/kv/kv_sender.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport {

// This host's identity for KvPeerPool.host_id: its kernel's boot id (the
// same in every container of the host); the host name where that cannot be
// read.
std::string LocalHostId();

struct PeerLaneKvOptions {
  // Overrides LocalHostId() (tests: two "hosts" in one process).
  std::string host_id;
};

// Thread-safe.
class PeerLaneKv final : public KvReceiver, public KvSender {
 public:
  // `sender` and `receiver` (not owned: a worker's UcxKv for both) must
  // outlive this; `spec` is the local pool's TP = 1 layout. Errors: the
  // lane's Export's.
  static absl::StatusOr<std::unique_ptr<PeerLaneKv>> Create(
      KvSender* sender, KvReceiver* receiver, const kv::KvCacheSpec& spec,
      std::unique_ptr<backend::KvPeerLane> lane, PeerLaneKvOptions options = {});

  // KvReceiver: the inner Describe, plus the peer pool.
  absl::Status Describe(trident::v1::KvDestination* destination) const override;
  int64_t dropped_messages() const override { return receiver_->dropped_messages(); }

  // KvSender.
  int32_t num_layers() const override { return sender_->num_layers(); }
  absl::StatusOr<std::unique_ptr<KvTransfer>> Open(
      const trident::v1::KvDestination& destination) override;
  absl::Status Connect(const trident::v1::KvDestination& destination) override;

  // Transfers opened on the lane, and those that went to the inner sender.
  int64_t lane_transfers() const { return lane_transfers_.load(); }
  int64_t inner_transfers() const { return inner_transfers_.load(); }
  const std::string& host_id() const { return host_id_; }

 private:
  PeerLaneKv(KvSender* sender, KvReceiver* receiver, const kv::KvCacheSpec& spec,
             std::unique_ptr<backend::KvPeerLane> lane, backend::KvPeerExport exported,
             std::string host_id);

  // The destination's pool mapped (cached per owner incarnation); null when
  // the lane does not reach it (another host, no export, CPU-resident, or
  // the mapping failed: then the inner sender serves it).
  std::shared_ptr<backend::KvPeerPool> PeerFor(const trident::v1::KvDestination& destination)
      ABSL_LOCKS_EXCLUDED(mu_);

  KvSender* const sender_;
  KvReceiver* const receiver_;
  const kv::KvCacheSpec spec_;
  const std::unique_ptr<backend::KvPeerLane> lane_;
  const backend::KvPeerExport exported_;
  const std::string host_id_;

  struct Peer {
    uint64_t incarnation = 0;
    // Null when mapping this incarnation failed.
    std::shared_ptr<backend::KvPeerPool> pool;
  };
  absl::Mutex mu_;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> lane_transfers_{0};
  std::atomic<int64_t> inner_transfers_{0};
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_PEER_LANE_KV_H_
