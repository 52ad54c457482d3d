// KV transfer through host staging (UcxKv with a KvCopier: the path a GPU
// worker takes when UCX has no CUDA support), between two UcxWorkers in one
// process over posix shared memory, for Llama-3-8B's KV: 8 KV heads,
// head_dim 128, bf16, blocks of 16 tokens, 32 layers; 8192 tokens = 1 GiB.
// One iteration is one whole transfer: reserve on the receiver, SendLayer
// for all 32 layers (each layer copied device -> pinned slots, then sent as
// 4 MiB KV messages), until the receiver has copied every byte in
// (KvReservations::AwaitBytes).
//
// Over posix the messages go by rendezvous: a device (or staged) pool's
// receiver fetches each into a pinned receive buffer and copies it in on its
// receive threads (`fetches`: UcxKvOptions::receive_fetches at once); a host
// pool's receiver fetches straight into the reserved blocks.
//
// Paths (benchmark argument `path`):
//   0 cuda_bounce    device pools on GPU 0, messages copied in through
//                    pinned bounce buffers (CudaKvCopier kPinnedBounce)
//   1 cuda_pageable  device pools, messages handed to cudaMemcpyAsync as is
//                    (from the pinned receive buffer: one DMA)
//   2 host_direct    host pools, no staging (UcxKv's host path: KvWriter's
//                    messages straight from and into the pools)
//   3 host_staged    host pools staged with a memcpy copier (runs anywhere)
//   4 cuda_bounce_256k  as cuda_bounce with 8 bounce buffers of 256 KiB
//                    (default: 4 of 1 MiB): shorter tail per message, more
//                    copies
//
// Then, if ucx_perftest is found ($UCX_PERFTEST, else PATH), runs
// `ucx_perftest -t ucp_am_bw` and `-t ucp_put_bw -O 1` over posix with the
// same 4 MiB message size as two processes on loopback and prints every
// path's GB/s, perftest's and the ratios. Goal: cuda_* >= 0.8 of ucp_am_bw.
//
//   bazel run -c opt //services/worker:kv_staging_benchmark   (GPU machine)

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "common/backend/cuda/cuda_kv_copier.h"
#include "common/kv/kv_layout.h"
#include "common/transport/ucx_perftest.h"
#include "services/worker/ucx_kv_cuda_testing.h"
#include "services/worker/ucx_kv_testing.h"

namespace trident::worker {
namespace {

using FromHost = backend::CudaKvCopierOptions::FromHost;

constexpr const char* kTransport = "posix";
constexpr uint64_t kMessageBytes = uint64_t{4} << 20;
const char* const kPathNames[] = {"cuda_bounce", "cuda_pageable", "host_direct", "host_staged",
                                  "cuda_bounce_256k"};

kv::KvCacheSpec LlamaSpec(int32_t tokens) {
  return {.num_layers = 32,
          .num_kv_heads = 8,
          .head_dim = 128,
          .block_size = 16,
          .dtype = numeric::DType::kBF16,
          .num_blocks = tokens / 16};
}

// (path, tokens) -> GB/s of the last run.
std::map<std::tuple<int, int>, double>& Results() {
  static auto* results = new std::map<std::tuple<int, int>, double>;
  return *results;
}

void BM_StagedKvTransfer(benchmark::State& state) {
  const int path = static_cast<int>(state.range(0));
  const int32_t tokens = static_cast<int32_t>(state.range(1));
  const int fetches = static_cast<int>(state.range(2));
  const kv::KvCacheSpec spec = LlamaSpec(tokens);
  const bool cuda = path <= 1 || path == 4;
  std::unique_ptr<testing::TestPool> sender_pool, receiver_pool;
  if (cuda) {
    backend::CudaKvCopierOptions options;
    options.from_host = path == 1 ? FromHost::kPageable : FromHost::kPinnedBounce;
    if (path == 4) {
      options.bounce_buffer_bytes = 256 << 10;
      options.bounce_buffers = 8;
    }
    auto sender = testing::NewCudaTestPool(spec, /*device=*/0, options);
    auto receiver = testing::NewCudaTestPool(spec, /*device=*/0, options);
    if (!sender.ok() || !receiver.ok()) {
      state.SkipWithError(
          absl::StrCat("no device pools: ", (sender.ok() ? receiver : sender).status().ToString())
              .c_str());
      return;
    }
    sender_pool = *std::move(sender);
    receiver_pool = *std::move(receiver);
  } else {
    sender_pool = testing::NewHostTestPool(spec);
    receiver_pool = testing::NewHostTestPool(spec);
  }
  // Any bytes do; fault in every page before timing.
  sender_pool->Fill(std::vector<uint8_t>(spec.TotalBytes(), 0x3c));
  receiver_pool->Fill(std::vector<uint8_t>(spec.TotalBytes(), 0));

  testing::Side sender{.pool = sender_pool.get(), .max_message_bytes = kMessageBytes};
  testing::Side receiver{.pool = receiver_pool.get(), .receive_fetches = fetches};
  if (path != 2) {
    sender.copier = receiver.copier = true;
    sender.force_staging = receiver.force_staging = true;
  }
  auto pair = testing::KvTransferPair::Create(kTransport, spec, sender, receiver);
  if (!pair.ok()) {
    state.SkipWithError(pair.status().ToString().c_str());
    return;
  }
  std::vector<int32_t> blocks;
  for (int32_t b = 0; b < spec.num_blocks; ++b) blocks.push_back(b);
  // Warm up: connects, touches the staging slots.
  if (auto warm = (*pair)->Transfer(tokens, blocks, blocks); !warm.ok()) {
    state.SkipWithError(warm.status().ToString().c_str());
    return;
  }
  int64_t transfers = 0;
  int64_t messages = 0;
  const absl::Time start = absl::Now();
  for (auto _ : state) {
    auto result = (*pair)->Transfer(tokens, blocks, blocks);
    if (!result.ok()) {
      state.SkipWithError(result.status().ToString().c_str());
      return;
    }
    messages += result->messages;
    ++transfers;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double bytes = static_cast<double>(transfers) * static_cast<double>(spec.TotalBytes());
  const double gbps = bytes / seconds / 1e9;
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["GB/s"] = gbps;
  state.counters["messages"] = static_cast<double>(messages) / static_cast<double>(transfers);
  state.SetLabel(absl::StrCat(kPathNames[path], " staged=", (*pair)->sender().staged() ? 1 : 0, "/",
                              (*pair)->receiver().staged() ? 1 : 0));
  if (fetches == testing::Side().receive_fetches) Results()[{path, tokens}] = gbps;
}
BENCHMARK(BM_StagedKvTransfer)
    ->ArgsProduct({{0, 1, 4, 2, 3}, {8192}, {4}})
    ->ArgsProduct({{1, 3}, {8192}, {1, 2}})
    ->ArgNames({"path", "tokens", "fetches"})
    ->UseRealTime()
    ->MinTime(2.0)
    ->Unit(benchmark::kMillisecond);

void PrintComparison() {
  const std::string perftest = transport::FindUcxPerftest();
  std::string am_text = perftest.empty() ? "not found" : "failed";
  std::string put_text = am_text;
  double am_gbps = 0, put_gbps = 0;
  if (!perftest.empty()) {
    absl::StatusOr<double> am = transport::RunUcxPerftest(
        perftest, {.test = "ucp_am_bw", .transport = kTransport, .message_bytes = kMessageBytes});
    if (am.ok() && *am > 0) {
      am_gbps = *am;
      am_text = absl::StrFormat("%.3f", am_gbps);
    } else {
      std::fprintf(stderr, "ucx_perftest ucp_am_bw: %s\n", am.status().ToString().c_str());
    }
    // One put in flight, as kv_transfer_benchmark runs it.
    absl::StatusOr<double> put =
        transport::RunUcxPerftest(perftest, {.test = "ucp_put_bw",
                                             .transport = kTransport,
                                             .message_bytes = kMessageBytes,
                                             .outstanding = 1});
    if (put.ok() && *put > 0) {
      put_gbps = *put;
      put_text = absl::StrFormat("%.3f", put_gbps);
    } else {
      std::fprintf(stderr, "ucx_perftest ucp_put_bw: %s\n", put.status().ToString().c_str());
    }
  }
  std::printf(
      "\nStaged KV transfer vs ucx_perftest over %s, %llu-byte messages (perftest: two "
      "processes on loopback, host memory; ucp_am_bw with perftest's default window, "
      "ucp_put_bw -O 1). Goal: cuda_* / ucp_am_bw >= 0.80\n",
      kTransport, static_cast<unsigned long long>(kMessageBytes));
  std::printf("%-14s %7s %12s %12s %9s %13s %9s\n", "path", "tokens", "transfer_GB/s", "ucp_am_bw",
              "ratio", "ucp_put_bw", "ratio");
  for (const auto& [key, gbps] : Results()) {
    const auto& [path, tokens] = key;
    const std::string am_ratio = am_gbps > 0 ? absl::StrFormat("%.2f", gbps / am_gbps) : "n/a";
    const std::string put_ratio = put_gbps > 0 ? absl::StrFormat("%.2f", gbps / put_gbps) : "n/a";
    std::printf("%-14s %7d %12.3f %12s %9s %13s %9s\n", kPathNames[path], tokens, gbps,
                am_text.c_str(), am_ratio.c_str(), put_text.c_str(), put_ratio.c_str());
  }
}

}  // namespace
}  // namespace trident::worker

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  trident::worker::PrintComparison();
  benchmark::Shutdown();
  return 0;
}
