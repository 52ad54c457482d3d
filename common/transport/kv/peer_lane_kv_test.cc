// PeerLaneKv's choice of lane and what goes over it, with an in-memory peer
// lane (host pools "exported" by name within the test): a destination on
// this host goes GPU to GPU, byte for byte into the reserved blocks, and
// one-sided (no message bytes to count); another host's, a CPU-resident
// one, and one whose pool cannot be mapped go to the inner sender; a peer's
// new incarnation is mapped afresh and its old mapping released once its
// transfers end. The CUDA lane itself is tested on the GPU
// (common/backend/cuda:cuda_peer_lane_test).

#include "common/transport/kv/peer_lane_kv.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/transport/kv/fake_kv_message_sink.h"
#include "common/transport/kv/fake_kv_receiver.h"
#include "common/transport/kv/fake_kv_sender.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// 2 layers, blocks of 4 tokens, 256 bytes per block and layer.
kv::KvCacheSpec Spec() {
  return {.num_layers = 2,
          .num_kv_heads = 1,
          .head_dim = 8,
          .block_size = 4,
          .dtype = numeric::DType::kF32,
          .num_blocks = 8};
}

// Pools exported by name, as CUDA IPC handles name device memory.
struct Registry {
  std::map<std::string, uint8_t*> pools;
  int opens = 0;
  int live_mappings = 0;
};

class MemoryPeerPool final : public backend::KvPeerPool {
 public:
  MemoryPeerPool(uint8_t* base, uint64_t bytes, Registry* registry)
      : base_(base), bytes_(bytes), registry_(registry) {
    ++registry_->live_mappings;
  }
  ~MemoryPeerPool() override { --registry_->live_mappings; }
  uint64_t bytes() const override { return bytes_; }
  uint8_t* base() const { return base_; }

 private:
  uint8_t* const base_;
  const uint64_t bytes_;
  Registry* const registry_;
};

// A working in-memory KvPeerLane over one host pool.
class MemoryPeerLane final : public backend::KvPeerLane {
 public:
  MemoryPeerLane(std::string name, uint8_t* pool, Registry* registry)
      : name_(std::move(name)), pool_(pool), registry_(registry) {
    registry_->pools[name_] = pool_;
  }
  std::string name() const override { return "memory_ipc"; }
  absl::StatusOr<backend::KvPeerExport> Export() const override {
    return backend::KvPeerExport{.spec = Spec(), .rank_handles = {name_}};
  }
  absl::StatusOr<std::shared_ptr<backend::KvPeerPool>> Open(
      const backend::KvPeerExport& peer) override {
    ++registry_->opens;
    if (peer.rank_handles.size() != 1) return absl::InvalidArgumentError("one rank only");
    auto it = registry_->pools.find(peer.rank_handles[0]);
    if (it == registry_->pools.end()) return absl::FailedPreconditionError("no such pool");
    return std::make_shared<MemoryPeerPool>(it->second, peer.spec.TotalBytes(), registry_);
  }
  void Copy(const std::shared_ptr<backend::KvPeerPool>& peer,
            absl::Span<const backend::KvPeerCopy> copies,
            std::function<void(absl::Status)> done) override {
    auto* pool = static_cast<MemoryPeerPool*>(peer.get());
    for (const backend::KvPeerCopy& c : copies) {
      if (c.local_offset + c.bytes > Spec().TotalBytes() ||
          c.peer_offset + c.bytes > pool->bytes()) {
        done(absl::InvalidArgumentError("copy outside a pool"));
        return;
      }
    }
    for (const backend::KvPeerCopy& c : copies) {
      std::memcpy(pool->base() + c.peer_offset, pool_ + c.local_offset, c.bytes);
    }
    copies_ += static_cast<int>(copies.size());
    done(absl::OkStatus());
  }
  int copies() const { return copies_; }

 private:
  const std::string name_;
  uint8_t* const pool_;
  Registry* const registry_;
  int copies_ = 0;
};

// A prefill side (pool counting up) and a decode side ("decode-0"), each
// with the in-memory lane over its pool, on hosts `prefill_host` and
// `decode_host`.
struct Plane {
  Plane(const std::string& prefill_host, const std::string& decode_host)
      : local(Spec().TotalBytes()),
        decode_receiver("decode-0", 3, Spec(), &sink),
        prefill_receiver("prefill-0", 1, Spec(), &sink),
        inner_sender(Spec(), local.data()) {
    for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i % 251 + 1);
    inner_sender.AddPeer(&decode_receiver);
    auto p = std::make_unique<MemoryPeerLane>("prefill-pool", local.data(), &registry);
    prefill_lane = p.get();
    auto d =
        std::make_unique<MemoryPeerLane>("decode-pool", decode_receiver.pool().data(), &registry);
    prefill = *PeerLaneKv::Create(&inner_sender, &prefill_receiver, Spec(), std::move(p),
                                  {.host_id = prefill_host});
    decode = *PeerLaneKv::Create(&inner_sender, &decode_receiver, Spec(), std::move(d),
                                 {.host_id = decode_host});
  }

  trident::v1::KvDestination Destination(uint64_t id, int32_t num_tokens,
                                         const std::vector<int32_t>& blocks) {
    sink.Add(id, blocks);
    trident::v1::KvDestination d;
    EXPECT_THAT(decode->Describe(&d), IsOk());
    d.set_reservation_id(id);
    d.set_num_tokens(num_tokens);
    for (int32_t b : blocks) d.add_block_ids(b);
    return d;
  }

  std::vector<uint8_t> local;
  FakeKvMessageSink sink;
  FakeKvReceiver decode_receiver;
  FakeKvReceiver prefill_receiver;
  FakeKvSender inner_sender;
  Registry registry;
  MemoryPeerLane* prefill_lane = nullptr;
  std::unique_ptr<PeerLaneKv> prefill;
  std::unique_ptr<PeerLaneKv> decode;
};

std::vector<absl::Status> SendAll(KvTransfer& transfer, const std::vector<int32_t>& local) {
  std::vector<absl::Status> statuses;
  for (int32_t layer = 0; layer < Spec().num_layers; ++layer) {
    transfer.SendLayer(layer, local, [&](absl::Status s) { statuses.push_back(std::move(s)); });
  }
  return statuses;
}

TEST(PeerLaneKvTest, SameHostGoesOverTheLaneIntoTheReservedBlocks) {
  Plane plane("host-a", "host-a");
  const trident::v1::KvDestination d = plane.Destination(7, 11, {5, 6, 2});
  EXPECT_EQ(d.peer_pool().host_id(), "host-a");
  EXPECT_EQ(d.peer_pool().lane(), "memory_ipc");
  ASSERT_EQ(d.peer_pool().rank_handles_size(), 1);
  ASSERT_THAT(plane.prefill->Connect(d), IsOk());
  auto transfer = plane.prefill->Open(d);
  ASSERT_THAT(transfer.status(), IsOk());
  EXPECT_EQ((*transfer)->lane(), "memory_ipc");
  const std::vector<int32_t> local = {1, 2, 4};
  for (const absl::Status& s : SendAll(**transfer, local)) EXPECT_THAT(s, IsOk());
  // Blocks 1-2 -> 5-6 collate into one copy per layer; 4 -> 2 is another.
  EXPECT_EQ((*transfer)->messages(), 4);
  EXPECT_EQ(plane.prefill_lane->copies(), 4);
  const kv::KvCacheSpec spec = Spec();
  EXPECT_EQ((*transfer)->bytes_sent(), int64_t{2} * 3 * spec.block_stride_bytes());
  EXPECT_EQ((*transfer)->message_bytes(), 0);  // one-sided: nothing to count
  for (int32_t layer = 0; layer < spec.num_layers; ++layer) {
    for (size_t i = 0; i < local.size(); ++i) {
      const int32_t remote = d.block_ids(static_cast<int>(i));
      EXPECT_EQ(
          0, std::memcmp(plane.decode_receiver.pool().data() + spec.KeyOffsetBytes(layer, remote),
                         plane.local.data() + spec.KeyOffsetBytes(layer, local[i]),
                         spec.block_stride_bytes()))
          << "layer " << layer << " block " << remote;
    }
  }
  // Nothing else was written.
  EXPECT_EQ(plane.decode_receiver.pool()[spec.KeyOffsetBytes(0, 0)], 0);
  EXPECT_EQ(plane.decode_receiver.pool()[spec.KeyOffsetBytes(1, 7)], 0);
  EXPECT_EQ(plane.inner_sender.opens(), 0);
  EXPECT_EQ(plane.inner_sender.connects(), 0);
  EXPECT_EQ(plane.prefill->lane_transfers(), 1);
  // Mapped once for the peer's incarnation.
  ASSERT_THAT(plane.prefill->Open(d).status(), IsOk());
  EXPECT_EQ(plane.registry.opens, 1);
}

TEST(PeerLaneKvTest, AnotherHostOrCpuResidentGoesToTheInnerSender) {
  Plane plane("host-a", "host-b");
  const trident::v1::KvDestination d = plane.Destination(7, 11, {5, 6, 2});
  auto transfer = plane.prefill->Open(d);
  ASSERT_THAT(transfer.status(), IsOk());
  EXPECT_EQ((*transfer)->lane(), "memcpy");
  EXPECT_EQ(plane.inner_sender.opens(), 1);
  EXPECT_EQ(plane.registry.opens, 0);

  Plane same("host-a", "host-a");
  trident::v1::KvDestination cpu = same.Destination(8, 4, {3});
  cpu.set_cpu_resident(true);
  ASSERT_THAT(same.prefill->Open(cpu).status(), IsOk());
  EXPECT_EQ(same.inner_sender.opens(), 1);
  EXPECT_EQ(same.prefill->inner_transfers(), 1);
  EXPECT_EQ(same.registry.opens, 0);
}

TEST(PeerLaneKvTest, UnmappablePoolFallsBackAndANewIncarnationIsMappedAfresh) {
  Plane plane("host-a", "host-a");
  trident::v1::KvDestination d = plane.Destination(7, 4, {3});
  d.mutable_peer_pool()->set_rank_handles(0, "no-such-pool");
  auto transfer = plane.prefill->Open(d);
  ASSERT_THAT(transfer.status(), IsOk());
  EXPECT_EQ((*transfer)->lane(), "memcpy");
  // The failure is remembered for that incarnation: not retried.
  ASSERT_THAT(plane.prefill->Connect(d), IsOk());
  EXPECT_EQ(plane.registry.opens, 1);
  EXPECT_EQ(plane.inner_sender.connects(), 1);

  // The decode worker restarts: its new incarnation is mapped.
  trident::v1::KvDestination again = plane.Destination(9, 4, {3});
  again.mutable_endpoint()->set_incarnation(4);
  auto held = plane.prefill->Open(again);
  ASSERT_THAT(held.status(), IsOk());
  EXPECT_EQ((*held)->lane(), "memory_ipc");
  EXPECT_EQ(plane.registry.live_mappings, 1);
  // And another: the previous mapping is released once its transfer ends.
  again.mutable_endpoint()->set_incarnation(5);
  ASSERT_THAT(plane.prefill->Open(again).status(), IsOk());
  EXPECT_EQ(plane.registry.opens, 3);
  EXPECT_EQ(plane.registry.live_mappings, 2);
  held->reset();
  EXPECT_EQ(plane.registry.live_mappings, 1);
}

TEST(PeerLaneKvTest, BadLayerArgumentsFailTheLayerAndCopyNothing) {
  Plane plane("host-a", "host-a");
  const trident::v1::KvDestination d = plane.Destination(7, 11, {5, 6, 2});
  auto transfer = plane.prefill->Open(d);
  ASSERT_THAT(transfer.status(), IsOk());
  absl::Status status;
  (*transfer)->SendLayer(2, {1, 2, 4}, [&](absl::Status s) { status = s; });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer 2")));
  (*transfer)->SendLayer(0, {1, 2}, [&](absl::Status s) { status = s; });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 local blocks")));
  (*transfer)->SendLayer(0, {1, 2, 99}, [&](absl::Status s) { status = s; });
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(plane.prefill_lane->copies(), 0);
  EXPECT_EQ((*transfer)->bytes_sent(), 0);
  // A destination laid out otherwise is refused at Open.
  trident::v1::KvDestination other = d;
  other.mutable_layout()->set_head_dim(16);
  EXPECT_FALSE(plane.prefill->Open(other).ok());
}

TEST(PeerLaneKvTest, LocalHostIdIsStable) {
  const std::string id = LocalHostId();
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(id, LocalHostId());
}

}  // namespace
}  // namespace trident::transport
