#include "kernels/cuda/peer_allreduce/peer_allreduce.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

// `ranks` ranks on the machine's GPUs in turn (several on one GPU when it
// has fewer: each rank its own buffers and stream, the kernels concurrent).
class Ranks {
 public:
  Ranks(int ranks, int64_t capacity) : ranks_(ranks), capacity_(capacity) {
    const int devices = DeviceCount();
    for (int d = 0; d < devices && d < ranks; ++d) {
      cudaSetDevice(d);
      for (int p = 0; p < devices && p < ranks; ++p) {
        if (p != d) cudaDeviceEnablePeerAccess(p, 0);
      }
      cudaGetLastError();  // Already enabled is fine.
    }
    for (int r = 0; r < ranks; ++r) {
      device_.push_back(r % devices);
      cudaSetDevice(device_[r]);
      void* in = nullptr;
      void* out = nullptr;
      void* signals = nullptr;
      cudaMalloc(&in, capacity * 4);
      cudaMalloc(&out, capacity * 4);
      cudaMalloc(&signals, PeerAllReduceSignalBytes());
      cudaMemset(signals, 0, PeerAllReduceSignalBytes());
      cudaStream_t stream;
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      in_.push_back(static_cast<float*>(in));
      out_.push_back(static_cast<float*>(out));
      signals_.push_back(signals);
      streams_.push_back(stream);
    }
    for (int r = 0; r < ranks; ++r) {
      cudaSetDevice(device_[r]);
      cudaDeviceSynchronize();
    }
  }
  ~Ranks() {
    for (int r = 0; r < ranks_; ++r) {
      cudaSetDevice(device_[r]);
      cudaStreamSynchronize(streams_[r]);
      cudaFree(in_[r]);
      cudaFree(out_[r]);
      cudaFree(signals_[r]);
      cudaStreamDestroy(streams_[r]);
    }
  }

  PeerAllReduceArgs Args(int rank, int64_t count) const {
    PeerAllReduceArgs a;
    a.rank = rank;
    a.ranks = ranks_;
    for (int q = 0; q < ranks_; ++q) {
      a.in[q] = in_[q];
      a.signals[q] = signals_[q];
    }
    a.out = out_[rank];
    a.count = count;
    return a;
  }

  // Random inputs of `count`, then the launch on every rank; returns the
  // reference sum.
  std::vector<float> Fill(std::mt19937& rng, int64_t count) {
    std::normal_distribution<float> normal(0.0f, 10.0f);
    std::vector<std::vector<float>> host(ranks_, std::vector<float>(count));
    std::vector<const float*> rows;
    for (int r = 0; r < ranks_; ++r) {
      for (auto& v : host[r]) v = normal(rng);
      cudaSetDevice(device_[r]);
      cudaMemcpy(in_[r], host[r].data(), count * 4, cudaMemcpyHostToDevice);
      rows.push_back(host[r].data());
    }
    std::vector<float> want(count);
    SumInRankOrder(rows.data(), ranks_, count, want.data());
    return want;
  }

  // Every rank's output equals `want` bit for bit.
  void Check(const std::vector<float>& want, int64_t count) {
    for (int r = 0; r < ranks_; ++r) {
      cudaSetDevice(device_[r]);
      ASSERT_EQ(cudaStreamSynchronize(streams_[r]), cudaSuccess);
      std::vector<float> got(count);
      ASSERT_EQ(cudaMemcpy(got.data(), out_[r], count * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i) wrong += std::memcmp(&got[i], &want[i], 4) != 0;
      EXPECT_EQ(wrong, 0) << "rank " << r << " of " << ranks_ << ", count " << count;
      auto failed = PeerAllReduceFailed(signals_[r]);
      ASSERT_THAT(failed.status(), IsOk());
      EXPECT_FALSE(*failed);
    }
  }

  int ranks_;
  int64_t capacity_;
  std::vector<int> device_;
  std::vector<float*> in_;
  std::vector<float*> out_;
  std::vector<void*> signals_;
  std::vector<cudaStream_t> streams_;
};

TEST(PeerAllReduceTest, SumsInRankOrderOnEveryRank) {
  const uint32_t seed = 20261128;
  std::printf("%d devices, seed %u\n", DeviceCount(), seed);
  std::mt19937 rng(seed);
  for (int ranks : {1, 2, 3, 4}) {
    Ranks group(ranks, int64_t{1} << 20);
    // Odd counts take the scalar path; repeated calls advance the epochs.
    for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{4096}, int64_t{4099}, int64_t{8192},
                          int64_t{1} << 20, int64_t{0}, int64_t{4096}}) {
      const std::vector<float> want = group.Fill(rng, count);
      for (int r = 0; r < ranks; ++r) {
        cudaSetDevice(group.device_[r]);
        ASSERT_THAT(LaunchPeerAllReduce(group.Args(r, count), group.streams_[r]), IsOk());
      }
      group.Check(want, count);
    }
  }
}

// accumulate: each rank's out (its own starting values, as a residual
// stream) += the sum, equal to the CPU reference's out + sum bit for bit.
TEST(PeerAllReduceTest, AccumulatesIntoEachRanksOutput) {
  const uint32_t seed = 1128;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  for (int ranks : {2, 3}) {
    Ranks group(ranks, 8192);
    for (int64_t count : {int64_t{5}, int64_t{8192}}) {
      std::vector<float> start(count);
      for (auto& v : start) v = normal(rng);
      for (int r = 0; r < ranks; ++r) {
        cudaSetDevice(group.device_[r]);
        cudaMemcpy(group.out_[r], start.data(), count * 4, cudaMemcpyHostToDevice);
      }
      const std::vector<float> sum = group.Fill(rng, count);
      std::vector<float> want = start;
      for (int64_t i = 0; i < count; ++i) want[i] = start[i] + sum[i];
      for (int r = 0; r < ranks; ++r) {
        cudaSetDevice(group.device_[r]);
        PeerAllReduceArgs args = group.Args(r, count);
        args.accumulate = true;
        ASSERT_THAT(LaunchPeerAllReduce(args, group.streams_[r]), IsOk());
      }
      group.Check(want, count);
    }
  }
}

// skip_end_barrier with each rank alternating between two inputs, calls
// back to back with each call's input copied in on the rank's stream just
// before it: every call's sum still lands (accumulated into out, compared
// with the CPU reference bit for bit).
TEST(PeerAllReduceTest, SkipsTheEndBarrierWithDoubleBufferedInputs) {
  const uint32_t seed = 29;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  const int64_t count = 8192;
  const int calls = 40;
  for (int ranks : {2, 4}) {
    Ranks group(ranks, count);
    std::vector<float*> second(ranks);
    for (int r = 0; r < ranks; ++r) {
      cudaSetDevice(group.device_[r]);
      cudaMalloc(reinterpret_cast<void**>(&second[r]), count * 4);
      cudaMemsetAsync(group.out_[r], 0, count * 4, group.streams_[r]);
    }
    std::vector<std::vector<std::vector<float>>> inputs(
        calls, std::vector<std::vector<float>>(ranks, std::vector<float>(count)));
    std::vector<float> want(count, 0.0f);
    for (int k = 0; k < calls; ++k) {
      std::vector<const float*> rows;
      for (int r = 0; r < ranks; ++r) {
        for (auto& v : inputs[k][r]) v = normal(rng);
        rows.push_back(inputs[k][r].data());
      }
      SumInRankOrder(rows.data(), ranks, count, want.data(), /*accumulate=*/true);
    }
    for (int k = 0; k < calls; ++k) {
      for (int r = 0; r < ranks; ++r) {
        cudaSetDevice(group.device_[r]);
        float* in = k % 2 == 0 ? group.in_[r] : second[r];
        ASSERT_EQ(cudaMemcpyAsync(in, inputs[k][r].data(), count * 4, cudaMemcpyHostToDevice,
                                  group.streams_[r]),
                  cudaSuccess);
        PeerAllReduceArgs args = group.Args(r, count);
        for (int q = 0; q < ranks; ++q) args.in[q] = k % 2 == 0 ? group.in_[q] : second[q];
        args.accumulate = true;
        args.skip_end_barrier = true;
        ASSERT_THAT(LaunchPeerAllReduce(args, group.streams_[r]), IsOk());
      }
    }
    group.Check(want, count);
    for (int r = 0; r < ranks; ++r) {
      cudaSetDevice(group.device_[r]);
      cudaFree(second[r]);
    }
  }
}

// Captured once per rank and replayed: the epochs advance in device memory.
TEST(PeerAllReduceTest, ReplaysFromCudaGraphs) {
  std::mt19937 rng(7);
  const int ranks = 2;
  const int64_t count = 4096;
  Ranks group(ranks, count);
  std::vector<cudaGraphExec_t> execs(ranks);
  for (int r = 0; r < ranks; ++r) {
    cudaSetDevice(group.device_[r]);
    ASSERT_EQ(cudaStreamBeginCapture(group.streams_[r], cudaStreamCaptureModeThreadLocal),
              cudaSuccess);
    ASSERT_THAT(LaunchPeerAllReduce(group.Args(r, count), group.streams_[r]), IsOk());
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamEndCapture(group.streams_[r], &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&execs[r], graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
  }
  for (int replay = 0; replay < 5; ++replay) {
    const std::vector<float> want = group.Fill(rng, count);
    for (int r = 0; r < ranks; ++r) {
      cudaSetDevice(group.device_[r]);
      ASSERT_EQ(cudaGraphLaunch(execs[r], group.streams_[r]), cudaSuccess);
    }
    group.Check(want, count);
  }
  for (auto exec : execs) cudaGraphExecDestroy(exec);
}

// A peer that never launches: the other rank gives up after its timeout and
// says so, instead of hanging the stream.
TEST(PeerAllReduceTest, GivesUpOnASilentPeer) {
  Ranks group(2, 64);
  PeerAllReduceArgs args = group.Args(0, 64);
  args.timeout_ns = 2'000'000;  // 2 ms
  cudaSetDevice(group.device_[0]);
  ASSERT_THAT(LaunchPeerAllReduce(args, group.streams_[0]), IsOk());
  ASSERT_EQ(cudaStreamSynchronize(group.streams_[0]), cudaSuccess);
  auto failed = PeerAllReduceFailed(group.signals_[0]);
  ASSERT_THAT(failed.status(), IsOk());
  EXPECT_TRUE(*failed);
}

TEST(PeerAllReduceTest, RejectsBadArgs) {
  Ranks group(2, 64);
  PeerAllReduceArgs good = group.Args(0, 64);
  EXPECT_EQ(LaunchPeerAllReduce({}, nullptr).code(), absl::StatusCode::kInvalidArgument);
  PeerAllReduceArgs a = good;
  a.rank = 2;
  EXPECT_EQ(LaunchPeerAllReduce(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.ranks = kMaxPeerAllReduceRanks + 1;
  EXPECT_EQ(LaunchPeerAllReduce(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.in[1] = nullptr;
  EXPECT_EQ(LaunchPeerAllReduce(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.out = group.in_[1] + 10;  // Inside a peer's input.
  EXPECT_EQ(LaunchPeerAllReduce(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.count = -1;
  EXPECT_EQ(LaunchPeerAllReduce(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a = good;
  a.timeout_ns = 0;
  EXPECT_EQ(LaunchPeerAllReduce(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trident::kernels::cuda
