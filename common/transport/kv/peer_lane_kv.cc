#include "common/transport/kv/peer_lane_kv.h"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "common/transport/kv/kv_writer.h"

namespace trident::transport {

namespace v1 = ::trident::v1;

std::string LocalHostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (in && std::getline(in, id) && !id.empty()) return std::string(absl::StripAsciiWhitespace(id));
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) return absl::StrCat("host:", name);
  return "";
}

namespace {

// One sequence's KV through the peer lane: each layer's collated runs, as
// KvWriter would put them, copied GPU to GPU.
class PeerLaneTransfer final : public KvTransfer {
 public:
  PeerLaneTransfer(const kv::KvCacheSpec& spec, backend::KvPeerLane* lane,
                   std::shared_ptr<backend::KvPeerPool> peer, v1::KvDestination destination)
      : spec_(spec), lane_(lane), peer_(std::move(peer)), destination_(std::move(destination)) {}

  void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                 std::function<void(absl::Status)> done) override {
    if (absl::Status valid = CheckLayerBlocks(spec_, destination_, layer, local_blocks);
        !valid.ok()) {
      done(valid);
      return;
    }
    std::vector<backend::KvPeerCopy> copies;
    uint64_t bytes = 0;
    for (const KvPut& put : PlanLayerPuts(spec_, destination_, layer, local_blocks)) {
      const v1::KvRegion& region = destination_.regions(put.region);
      // The region's offset in the destination's pool (its first layer's).
      const uint64_t region_at =
          static_cast<uint64_t>(region.first_layer()) * destination_.layout().layer_stride_bytes();
      copies.push_back({.local_offset = put.local_offset_bytes,
                        .peer_offset = put.remote_address - region.base_address() + region_at,
                        .bytes = put.length_bytes});
      bytes += put.length_bytes;
    }
    copies_ += static_cast<int32_t>(copies.size());
    lane_->Copy(peer_, copies,
                [stats = stats_, bytes, done = std::move(done)](absl::Status status) {
                  if (status.ok()) stats->bytes_completed += static_cast<int64_t>(bytes);
                  done(std::move(status));
                });
  }
  int64_t bytes_sent() const override { return stats_->bytes_completed.load(); }
  int32_t messages() const override { return copies_; }
  std::string lane() const override { return lane_->name(); }
  int64_t message_bytes() const override { return 0; }

 private:
  struct Stats {
    std::atomic<int64_t> bytes_completed{0};
  };
  const kv::KvCacheSpec spec_;
  backend::KvPeerLane* const lane_;
  const std::shared_ptr<backend::KvPeerPool> peer_;
  const v1::KvDestination destination_;
  int32_t copies_ = 0;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
};

}  // namespace

absl::StatusOr<std::unique_ptr<PeerLaneKv>> PeerLaneKv::Create(
    KvSender* sender, KvReceiver* receiver, const kv::KvCacheSpec& spec,
    std::unique_ptr<backend::KvPeerLane> lane, PeerLaneKvOptions options) {
  TRIDENT_ASSIGN_OR_RETURN(backend::KvPeerExport exported, lane->Export());
  std::string host_id = options.host_id.empty() ? LocalHostId() : options.host_id;
  return std::unique_ptr<PeerLaneKv>(new PeerLaneKv(sender, receiver, spec, std::move(lane),
                                                    std::move(exported), std::move(host_id)));
}

PeerLaneKv::PeerLaneKv(KvSender* sender, KvReceiver* receiver, const kv::KvCacheSpec& spec,
                       std::unique_ptr<backend::KvPeerLane> lane, backend::KvPeerExport exported,
                       std::string host_id)
    : sender_(sender),
      receiver_(receiver),
      spec_(spec),
      lane_(std::move(lane)),
      exported_(std::move(exported)),
      host_id_(std::move(host_id)) {}

absl::Status PeerLaneKv::Describe(v1::KvDestination* destination) const {
  TRIDENT_RETURN_IF_ERROR(receiver_->Describe(destination));
  if (host_id_.empty()) return absl::OkStatus();
  v1::KvPeerPool* pool = destination->mutable_peer_pool();
  pool->set_host_id(host_id_);
  pool->set_lane(lane_->name());
  for (const std::string& handle : exported_.rank_handles) pool->add_rank_handles(handle);
  return absl::OkStatus();
}

std::shared_ptr<backend::KvPeerPool> PeerLaneKv::PeerFor(const v1::KvDestination& destination) {
  if (!destination.has_peer_pool() || destination.cpu_resident() || host_id_.empty() ||
      destination.peer_pool().host_id() != host_id_) {
    return nullptr;
  }
  const v1::TransportEndpoint& endpoint = destination.endpoint();
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(endpoint.owner_id());
  if (it != peers_.end() && it->second.incarnation == endpoint.incarnation()) {
    return it->second.pool;
  }
  // A new peer, or a new incarnation of one: the old mapping goes once its
  // transfers end (they hold it).
  Peer& peer = peers_[endpoint.owner_id()];
  peer = Peer{.incarnation = endpoint.incarnation()};
  absl::StatusOr<kv::KvCacheSpec> spec = kv::FromProto(destination.layout());
  absl::StatusOr<std::shared_ptr<backend::KvPeerPool>> pool =
      spec.ok() ? lane_->Open({.spec = *spec,
                               .rank_handles = {destination.peer_pool().rank_handles().begin(),
                                                destination.peer_pool().rank_handles().end()}})
                : absl::StatusOr<std::shared_ptr<backend::KvPeerPool>>(spec.status());
  if (!pool.ok()) {
    TRIDENT_LOG(WARNING) << "KV to " << endpoint.owner_id() << " goes over UCX: its "
                         << lane_->name() << " pool cannot be mapped here: " << pool.status();
    return nullptr;
  }
  TRIDENT_LOG(INFO) << "KV to " << endpoint.owner_id() << " goes GPU to GPU over " << lane_->name()
                    << " (" << destination.peer_pool().rank_handles_size() << " rank(s))";
  peer.pool = *std::move(pool);
  return peer.pool;
}

absl::StatusOr<std::unique_ptr<KvTransfer>> PeerLaneKv::Open(const v1::KvDestination& destination) {
  if (std::shared_ptr<backend::KvPeerPool> pool = PeerFor(destination)) {
    TRIDENT_RETURN_IF_ERROR(ValidateKvDestination(spec_, destination));
    ++lane_transfers_;
    return std::unique_ptr<KvTransfer>(
        new PeerLaneTransfer(spec_, lane_.get(), std::move(pool), destination));
  }
  ++inner_transfers_;
  return sender_->Open(destination);
}

absl::Status PeerLaneKv::Connect(const v1::KvDestination& destination) {
  if (PeerFor(destination) != nullptr) return absl::OkStatus();
  return sender_->Connect(destination);
}

}  // namespace trident::transport
