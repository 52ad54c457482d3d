// KV transfer through host staging (UcxKv with a KvCopier: the path a GPU
// worker takes when UCX has no CUDA support), between two UcxWorkers in one
// process over posix shared memory, for Llama-3-8B's KV: 8 KV heads,
// head_dim 128, bf16, blocks of 16 tokens, 32 layers; 8192 tokens = 1 GiB.
// One iteration is one whole transfer: reserve on the receiver, SendLayer
// for all 32 layers (each layer copied device -> pinned slots, then sent as
// 4 MiB KV messages), until the receiver has copied every byte in
// (FakeKvMessageSink::AwaitBytes, standing in for the decode worker's
// reservations).
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
// `lanes`: UcxKvOptions::lanes on both sides (messages spread over that
// many UCX workers, each copying on its own progress thread).
//
// Then, if ucx_perftest is found ($UCX_PERFTEST, else PATH), runs
// `ucx_perftest -t ucp_am_bw` over the same transports with the same 4 MiB
// messages, as one pair of processes on loopback and as two pairs at once,
// and prints every path's GB/s next to them. Goal: cuda_* >= 0.8 of one
// pair. --transports=LIST sets UCX_TLS (default posix).
//
//   bazel run -c opt //common/transport/kv:kv_staging_benchmark   (GPU machine)

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "common/backend/cuda/cuda_kv_copier.h"
#include "common/kv/kv_layout.h"
#include "common/transport/kv/ucx_kv_cuda_testing.h"
#include "common/transport/kv/ucx_kv_testing.h"
#include "common/transport/ucx_perftest.h"

namespace trident::transport {
namespace {

using FromHost = backend::CudaKvCopierOptions::FromHost;

// UCX_TLS of both sides and of perftest: --transports (default posix).
std::string& Transports() {
  static auto* transports = new std::string("posix");
  return *transports;
}
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

// (path, tokens, lanes) -> GB/s of the last run.
std::map<std::tuple<int, int, int>, double>& Results() {
  static auto* results = new std::map<std::tuple<int, int, int>, double>;
  return *results;
}

void BM_StagedKvTransfer(benchmark::State& state) {
  const int path = static_cast<int>(state.range(0));
  const int32_t tokens = static_cast<int32_t>(state.range(1));
  const int fetches = static_cast<int>(state.range(2));
  const int lanes = static_cast<int>(state.range(3));
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

  testing::Side sender{
      .pool = sender_pool.get(), .max_message_bytes = kMessageBytes, .lanes = lanes};
  testing::Side receiver{.pool = receiver_pool.get(), .receive_fetches = fetches, .lanes = lanes};
  if (path != 2) {
    sender.copier = receiver.copier = true;
    sender.force_staging = receiver.force_staging = true;
  }
  auto pair = testing::KvTransferPair::Create(Transports(), spec, sender, receiver);
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
  if (fetches == testing::Side().receive_fetches) Results()[{path, tokens, lanes}] = gbps;
}
BENCHMARK(BM_StagedKvTransfer)
    ->ArgsProduct({{0, 1, 4, 2, 3}, {8192}, {4}, {1, 2}})
    ->ArgsProduct({{1, 2, 3}, {8192}, {1, 64}, {1, 2}})
    ->ArgNames({"path", "tokens", "fetches", "lanes"})
    ->UseRealTime()
    ->MinTime(2.0)
    ->Unit(benchmark::kMillisecond);

// GB/s of `ucx_perftest -t ucp_am_bw` run as `pairs` pairs of processes at
// once (their sum), or 0 after printing why not.
double PerftestAmBw(const std::string& perftest, int pairs) {
  const PerftestOptions options = {
      .test = "ucp_am_bw", .transport = Transports(), .message_bytes = kMessageBytes};
  std::vector<absl::StatusOr<double>> results(pairs, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < pairs; ++i) {
    threads.emplace_back([&, i] { results[i] = RunUcxPerftest(perftest, options); });
  }
  for (std::thread& thread : threads) thread.join();
  double sum = 0;
  for (const auto& result : results) {
    if (!result.ok() || *result <= 0) {
      std::fprintf(stderr, "ucx_perftest ucp_am_bw (%d at once): %s\n", pairs,
                   result.status().ToString().c_str());
      return 0;
    }
    sum += *result;
  }
  return sum;
}

void PrintComparison() {
  const std::string perftest = FindUcxPerftest();
  if (perftest.empty()) {
    std::printf("\nucx_perftest not found ($UCX_PERFTEST, PATH): no comparison\n");
    return;
  }
  // One pair: the transport's rate for one UCX stream, the goal's yardstick.
  // Two pairs at once: what two streams (two lanes) can reach together.
  const double one = PerftestAmBw(perftest, 1);
  const double two = PerftestAmBw(perftest, 2);
  auto ratio = [](double gbps, double reference) {
    return reference > 0 ? absl::StrFormat("%.2f", gbps / reference) : std::string("n/a");
  };
  std::printf(
      "\nKV transfer vs ucx_perftest -t ucp_am_bw over %s, %llu-byte messages (perftest: "
      "processes on loopback, host memory, its default window): one pair %.3f GB/s, two pairs "
      "at once %.3f GB/s together. Goal: transfer / one pair >= 0.80\n",
      Transports().c_str(), static_cast<unsigned long long>(kMessageBytes), one, two);
  std::printf("%-16s %7s %6s %14s %15s %16s\n", "path", "tokens", "lanes", "transfer_GB/s",
              "vs_one_pair", "vs_as_many_pairs");
  for (const auto& [key, gbps] : Results()) {
    const auto& [path, tokens, lanes] = key;
    std::printf("%-16s %7d %6d %14.3f %15s %16s\n", kPathNames[path], tokens, lanes, gbps,
                ratio(gbps, one).c_str(),
                lanes == 1   ? ratio(gbps, one).c_str()
                : lanes == 2 ? ratio(gbps, two).c_str()
                             : "n/a");
  }
}

}  // namespace
}  // namespace trident::transport

int main(int argc, char** argv) {
  // Ours: --transports=LIST (UCX_TLS syntax); the rest are the library's.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (absl::StartsWith(arg, "--transports=")) {
      trident::transport::Transports() = std::string(arg.substr(strlen("--transports=")));
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  trident::transport::PrintComparison();
  benchmark::Shutdown();
  return 0;
}
