// The CUDA IPC KV lane between two processes (the peer is this binary,
// re-executed: cuda_peer_lane_testing.h), on two GPUs where there are two:
// collated runs and scattered blocks of each layer, and a range cut inside
// heads, land byte for byte in the peer's pool and nowhere else, between
// pools of any two TP degrees (heads re-sharded, replicas all written), on
// the copy engines and through the block-copy kernel; what cannot be mapped
// or copied is refused; a peer that dies with its pool mapped leaves this
// process working.
//
//   bazel test //common/backend/cuda:cuda_peer_lane_test   (GPU machine)

#include "common/backend/cuda/cuda_peer_lane.h"

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "common/backend/cuda/cuda_peer_lane_testing.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using peer_lane_testing::PoolShape;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

model::ModelConfig ConfigOf(const std::string& preset) {
  auto config = peer_lane_testing::PresetConfig(preset);
  EXPECT_THAT(config.status(), IsOk());
  return config.ok() ? *config : model::ModelConfig{};
}

int32_t PeerDevice() {
  int count = 0;
  cudaGetDeviceCount(&count);
  return count > 1 ? 1 : 0;
}

absl::Status CopyAndWait(KvPeerLane& lane, const std::shared_ptr<KvPeerPool>& pool,
                         const std::vector<KvPeerCopy>& copies) {
  absl::Notification done;
  absl::Status status;
  lane.Copy(pool, copies, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

constexpr int32_t kBlocks = 12;

struct Case {
  std::string preset;
  int32_t from;  // TP degree of this process's pool (0: a plain pool)
  int32_t to;    // the peer's
  int32_t kernel_min_copies;
  int32_t streams = 2;
};

class CudaPeerLaneTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaPeerLaneTest, CopiesLandByteForByteInThePeersPool) {
  const Case& c = GetParam();
  const uint32_t seed = 7 + c.from * 10 + c.to;
  std::printf("seed %u, peer on cuda:%d\n", seed, PeerDevice());
  const model::ModelConfig config = ConfigOf(c.preset);
  auto local_shape = peer_lane_testing::ShapeOf(config, c.from, kBlocks);
  auto peer_shape = peer_lane_testing::ShapeOf(config, c.to, kBlocks);
  ASSERT_THAT(local_shape.status(), IsOk());
  ASSERT_THAT(peer_shape.status(), IsOk());
  const kv::KvCacheSpec& spec = local_shape->spec;

  auto peer = peer_lane_testing::PeerProcess::Start();
  ASSERT_THAT(peer.status(), IsOk());
  auto exported = (*peer)->Pools(c.preset, c.to, kBlocks, PeerDevice(), seed + 1);
  ASSERT_THAT(exported.status(), IsOk());
  exported->spec = peer_shape->spec;

  auto pools = peer_lane_testing::DevicePools::Create(*local_shape, 0);
  ASSERT_THAT(pools.status(), IsOk());
  const std::vector<uint8_t> local_view =
      peer_lane_testing::RandomViewBytes(spec.TotalBytes(), seed);
  ASSERT_THAT((*pools)->Fill(peer_lane_testing::ScatterView(*local_shape, local_view)), IsOk());
  auto lane =
      CudaKvPeerLane::Create(config, spec, (*pools)->ranks(),
                             {.kernel_min_copies = c.kernel_min_copies, .streams = c.streams});
  ASSERT_THAT(lane.status(), IsOk());
  auto mapped = (*lane)->Open(*exported);
  ASSERT_THAT(mapped.status(), IsOk());

  // Per layer: local blocks 1-3 -> peer 4-6 (one run), 7 -> 0, 9 -> 11, and
  // a range cut inside heads.
  std::vector<KvPeerCopy> copies;
  const uint64_t stride = spec.block_stride_bytes();
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    copies.push_back({spec.KeyOffsetBytes(l, 1), spec.KeyOffsetBytes(l, 4), 3 * stride});
    copies.push_back({spec.KeyOffsetBytes(l, 7), spec.KeyOffsetBytes(l, 0), stride});
    copies.push_back({spec.KeyOffsetBytes(l, 9), spec.KeyOffsetBytes(l, 11), stride});
  }
  copies.push_back({spec.KeyOffsetBytes(0, 10) + 48, spec.KeyOffsetBytes(0, 8) + 48, stride + 96});
  ASSERT_THAT(CopyAndWait(**lane, *mapped, copies), IsOk());

  std::vector<uint8_t> expected = peer_lane_testing::RandomViewBytes(spec.TotalBytes(), seed + 1);
  for (const KvPeerCopy& k : copies) {
    std::copy_n(local_view.begin() + k.local_offset, k.bytes, expected.begin() + k.peer_offset);
  }
  auto dumped = (*peer)->Dump(peer_shape->ranks(), peer_shape->rank_bytes);
  ASSERT_THAT(dumped.status(), IsOk());
  std::vector<uint8_t> got;
  EXPECT_TRUE(peer_lane_testing::GatherView(*peer_shape, *dumped, &got))
      << "the peer's replicas of a head differ";
  ASSERT_EQ(got.size(), expected.size());
  for (uint64_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], expected[i]) << "byte " << i << " of the peer's TP = 1 pool";
  }
  std::printf("%s TP %d -> TP %d: %lld copies on the engines, %lld in kernels\n", c.preset.c_str(),
              c.from, c.to, static_cast<long long>((*lane)->engine_copies()),
              static_cast<long long>((*lane)->kernel_copies()));
  if (c.kernel_min_copies <= 1) {
    EXPECT_GT((*lane)->kernel_copies(), 0);
  } else {
    EXPECT_EQ((*lane)->kernel_copies(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Degrees, CudaPeerLaneTest,
    ::testing::Values(Case{"llama3-tiny", 0, 0, 1 << 20}, Case{"llama3-tiny", 0, 0, 1},
                      Case{"llama3-tiny", 0, 0, 1 << 20, 1}, Case{"llama3-tiny", 2, 4, 1, 1},
                      Case{"llama3-tiny", 2, 0, 1 << 20}, Case{"llama3-tiny", 0, 2, 1},
                      Case{"llama3-tiny", 2, 4, 1}, Case{"llama3-tiny", 4, 2, 1 << 20},
                      Case{"mistral-tiny", 0, 2, 1}, Case{"mistral-tiny", 2, 0, 1 << 20}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return absl::StrCat(absl::StrReplaceAll(info.param.preset, {{"-", "_"}}), "_tp",
                          info.param.from, "_to_tp", info.param.to,
                          info.param.kernel_min_copies <= 1 ? "_kernel" : "_engines",
                          info.param.streams == 1 ? "_one_stream" : "");
    });

// A plain llama3-tiny pool on GPU 0 and a lane over it.
class CudaPeerLaneRefusalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = ConfigOf("llama3-tiny");
    auto shape = peer_lane_testing::ShapeOf(config_, 0, kBlocks);
    ASSERT_THAT(shape.status(), IsOk());
    shape_ = *std::move(shape);
    auto pools = peer_lane_testing::DevicePools::Create(shape_, 0);
    ASSERT_THAT(pools.status(), IsOk());
    pools_ = *std::move(pools);
    auto lane = CudaKvPeerLane::Create(config_, shape_.spec, pools_->ranks());
    ASSERT_THAT(lane.status(), IsOk());
    lane_ = *std::move(lane);
  }

  model::ModelConfig config_;
  PoolShape shape_;
  std::unique_ptr<peer_lane_testing::DevicePools> pools_;
  std::unique_ptr<CudaKvPeerLane> lane_;
};

TEST_F(CudaPeerLaneRefusalTest, RefusesWhatItCannotMapOrCopy) {
  auto own = lane_->Export();
  ASSERT_THAT(own.status(), IsOk());
  EXPECT_EQ(own->rank_handles.size(), 1u);
  // This process's own pool: CUDA IPC maps other processes' memory only.
  EXPECT_THAT(lane_->Open(*own).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("cudaIpcOpenMemHandle")));
  KvPeerExport bad = *own;
  bad.rank_handles[0] = "short";
  EXPECT_THAT(lane_->Open(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("handle")));
  bad = *own;
  bad.spec.head_dim *= 2;
  EXPECT_THAT(lane_->Open(bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("laid out")));
  bad = *own;
  bad.rank_handles.push_back(bad.rank_handles[0]);
  bad.rank_handles.push_back(bad.rank_handles[0]);  // 3 ranks: 2 KV heads do not split
  EXPECT_THAT(lane_->Open(bad).status(), StatusIs(absl::StatusCode::kInvalidArgument));

  auto peer = peer_lane_testing::PeerProcess::Start();
  ASSERT_THAT(peer.status(), IsOk());
  auto exported = (*peer)->Pools("llama3-tiny", 0, kBlocks / 2, PeerDevice(), 3);
  ASSERT_THAT(exported.status(), IsOk());
  exported->spec = shape_.spec;
  exported->spec.num_blocks = kBlocks / 2;
  auto mapped = lane_->Open(*exported);
  ASSERT_THAT(mapped.status(), IsOk());
  EXPECT_EQ((*mapped)->bytes(), exported->spec.TotalBytes());
  // Past the peer's (smaller) pool: refused, nothing copied.
  const uint64_t stride = shape_.spec.block_stride_bytes();
  EXPECT_THAT(
      CopyAndWait(*lane_, *mapped, {{0, 0, stride}, {0, (*mapped)->bytes() - stride, 2 * stride}}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside")));
  EXPECT_EQ(lane_->engine_copies() + lane_->kernel_copies(), 0);
}

// A decode worker that dies with its pool mapped here: the mapping keeps
// the memory, the copy ends (either way) and this process's GPU still works.
TEST_F(CudaPeerLaneRefusalTest, APeerThatDiesLeavesThisProcessWorking) {
  auto peer = peer_lane_testing::PeerProcess::Start();
  ASSERT_THAT(peer.status(), IsOk());
  auto exported = (*peer)->Pools("llama3-tiny", 0, kBlocks, PeerDevice(), 3);
  ASSERT_THAT(exported.status(), IsOk());
  exported->spec = shape_.spec;
  auto mapped = lane_->Open(*exported);
  ASSERT_THAT(mapped.status(), IsOk());
  peer->reset();  // the peer exits (its pool freed on its side)
  const absl::Status copied = CopyAndWait(*lane_, *mapped, {{0, 0, shape_.spec.TotalBytes()}});
  std::printf("copy into a dead peer's pool: %s\n", copied.ToString().c_str());
  mapped->reset();
  // This process's own memory still reads back.
  auto read = pools_->Read();
  EXPECT_THAT(read.status(), IsOk());
  auto again = CudaKvPeerLane::Create(config_, shape_.spec, pools_->ranks());
  EXPECT_THAT(again.status(), IsOk());
}

}  // namespace
}  // namespace trident::backend

int main(int argc, char** argv) {
  if (trident::backend::peer_lane_testing::MaybeRunPeerChild(argc, argv)) return 0;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
