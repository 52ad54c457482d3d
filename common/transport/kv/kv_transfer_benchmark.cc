// KvWriter throughput between two UcxWorkers in one process, for a
// Llama-3-8B-shaped layer (8 KV heads, head_dim 128, bf16, blocks of 16
// tokens: 4 KiB of K and V per token and layer), over tcp and shared memory
// (posix). Blocks are allocated consecutively on both sides, so each layer is
// one put of tokens * 4 KiB. BM_Messages measures raw active messages (eager
// and rendezvous) the same way. After the benchmarks, if ucx_perftest is
// found ($UCX_PERFTEST, else PATH), runs `ucx_perftest -t ucp_put_bw -e -O 1`
// with the same transport and message size as two processes on loopback, and
// prints both rates and their ratio.
//
//   bazel run -c opt //common/transport/kv:kv_transfer_benchmark

#include <algorithm>
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
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "common/kv/kv_cache.h"
#include "common/kv/kv_layout.h"
#include "common/transport/kv/kv_writer.h"
#include "common/transport/ucx_perftest.h"
#include "common/transport/ucx_worker.h"

namespace trident::transport {
namespace {

const char* const kTransports[] = {"tcp", "posix"};
constexpr int32_t kNumLayers = 4;

kv::KvCacheSpec LlamaSpec(int32_t tokens) {
  return {.num_layers = kNumLayers,
          .num_kv_heads = 8,
          .head_dim = 128,
          .block_size = 16,
          .dtype = numeric::DType::kBF16,
          .num_blocks = tokens / 16};
}

struct Measured {
  uint64_t message_bytes = 0;
  double kv_writer_gbps = 0;
};
// (transport, tokens) -> result of the last run.
std::map<std::tuple<std::string, int>, Measured>& Results() {
  static auto* results = new std::map<std::tuple<std::string, int>, Measured>;
  return *results;
}

absl::Status WriteLayerAndWait(KvWriter& writer, int32_t layer,
                               const std::vector<int32_t>& blocks) {
  absl::Notification done;
  absl::Status result;
  writer.WriteLayer(layer, blocks, [&](absl::Status status) {
    result = std::move(status);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

void BM_KvWriterLayer(benchmark::State& state) {
  const std::string transport = kTransports[state.range(0)];
  const int32_t tokens = static_cast<int32_t>(state.range(1));
  const kv::KvCacheSpec spec = LlamaSpec(tokens);
  auto target = UcxWorker::Create({.transports = transport, .name = "decode"});
  auto writer_worker = UcxWorker::Create({.transports = transport, .name = "prefill"});
  auto remote = kv::HostKvCache::Create(spec);
  auto local = kv::HostKvCache::Create(spec);
  if (!target.ok() || !writer_worker.ok() || !remote.ok() || !local.ok()) {
    state.SkipWithError("cannot create the workers or caches");
    return;
  }
  auto remote_region =
      (*target)->Register((*remote)->data(), (*remote)->size_bytes(), MemoryKind::kHost);
  auto local_region =
      (*writer_worker)->Register((*local)->data(), (*local)->size_bytes(), MemoryKind::kHost);
  auto endpoint = (*writer_worker)->Connect((*target)->address(), "decode");
  if (!remote_region.ok() || !local_region.ok() || !endpoint.ok()) {
    state.SkipWithError("cannot register or connect");
    return;
  }
  std::memset((*local)->data(), 0x3c, (*local)->size_bytes());
  trident::v1::KvDestination destination;
  destination.set_num_tokens(tokens);
  std::vector<int32_t> blocks;
  for (int32_t b = 0; b < spec.num_blocks; ++b) {
    blocks.push_back(b);
    destination.add_block_ids(b);
  }
  *destination.mutable_layout() = kv::ToProto(spec);
  auto* region = destination.add_regions();
  region->set_base_address(reinterpret_cast<uint64_t>((*remote)->data()));
  region->set_length_bytes((*remote)->size_bytes());
  region->set_rkey((*remote_region)->packed_rkey());
  region->set_first_layer(0);
  region->set_num_layers(kNumLayers);
  auto writer = KvWriter::Create(spec, (*local)->data(), *endpoint, destination);
  if (!writer.ok()) {
    state.SkipWithError(std::string(writer.status().message()).c_str());
    return;
  }
  // Warm up: fault in every destination page.
  for (int32_t layer = 0; layer < kNumLayers; ++layer) {
    if (!WriteLayerAndWait(**writer, layer, blocks).ok()) {
      state.SkipWithError("warm-up write failed");
      return;
    }
  }
  const int64_t messages_before = (*writer)->messages_posted();
  const uint64_t layer_bytes = spec.num_blocks * spec.block_stride_bytes();
  int32_t layer = 0;
  int64_t layers = 0;
  const absl::Time start = absl::Now();
  for (auto _ : state) {
    if (!WriteLayerAndWait(**writer, layer, blocks).ok()) {
      state.SkipWithError("write failed");
      return;
    }
    layer = (layer + 1) % kNumLayers;
    ++layers;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double gbps = layers * static_cast<double>(layer_bytes) / seconds / 1e9;
  state.SetBytesProcessed(layers * static_cast<int64_t>(layer_bytes));
  state.counters["messages_per_layer"] =
      static_cast<double>((*writer)->messages_posted() - messages_before) / layers;
  state.counters["GB/s"] = gbps;
  state.SetLabel(absl::StrCat(transport, " lane=", (*writer)->lane()));
  Results()[{transport, tokens}] = {layer_bytes, gbps};
}
BENCHMARK(BM_KvWriterLayer)
    ->ArgsProduct({{0, 1}, {512, 8192}})
    ->ArgNames({"transport", "tokens"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Raw active-message throughput of UcxWorker (Endpoint::Send) over a
// transport, with a window of 4 MiB messages in flight: the ceiling of
// KvWriter's message mode. Modes: 0 eager, the receiver drops each message in
// its handler (what ucx_perftest -t ucp_am_bw does); 1 eager, copied out in
// the handler; 2 rendezvous, fetched into one of the receiver's buffers
// (IncomingMessage::Receive).
void BM_Messages(benchmark::State& state) {
  const std::string transport = kTransports[state.range(0)];
  const int mode = static_cast<int>(state.range(1));
  constexpr size_t kBytes = size_t{4} << 20;
  constexpr int kWindow = 16;
  constexpr int kPerIteration = 64;  // 256 MiB.
  auto target = UcxWorker::Create({.transports = transport, .name = "receiver"});
  auto sender = UcxWorker::Create({.transports = transport, .name = "sender"});
  if (!target.ok() || !sender.ok()) {
    state.SkipWithError("cannot create the workers");
    return;
  }
  auto endpoint = (*sender)->Connect((*target)->address(), "receiver");
  if (!endpoint.ok()) {
    state.SkipWithError("cannot connect");
    return;
  }
  std::vector<char> source(kBytes, 0x5a);
  std::vector<std::vector<char>> sinks(kWindow, std::vector<char>(kBytes, 0));
  absl::Mutex mu;
  int64_t received = 0;
  int next_sink = 0;
  const absl::Status set = (*target)->SetMessageHandler(
      9,
      [&](absl::string_view, absl::string_view data) {
        if (mode == 1) std::memcpy(sinks[0].data(), data.data(), data.size());
        absl::MutexLock lock(&mu);
        received += data.size();
      },
      [&](absl::string_view, std::unique_ptr<IncomingMessage> message) {
        // At most kWindow are in flight, so a sink is never shared.
        const size_t length = message->length();
        message->Receive(sinks[next_sink++ % kWindow].data(), [&, length](absl::Status status) {
          absl::MutexLock lock(&mu);
          if (status.ok()) received += length;
        });
      });
  if (!set.ok()) {
    state.SkipWithError("cannot set the handler");
    return;
  }
  std::atomic<int> in_flight{0};
  absl::Mutex send_mu;
  auto send_all = [&](int count) {
    for (int i = 0; i < count; ++i) {
      {
        absl::MutexLock lock(&send_mu);
        auto room = [&] { return in_flight.load() < kWindow; };
        send_mu.Await(absl::Condition(&room));
        ++in_flight;
      }
      (*endpoint)->Send(
          9, "h", source.data(), kBytes,
          [&](absl::Status) {
            absl::MutexLock lock(&send_mu);
            --in_flight;
          },
          /*rendezvous=*/mode == 2);
    }
  };
  int64_t expected = 0;
  auto wait_received = [&] {
    absl::MutexLock lock(&mu);
    auto all = [&] { return received >= expected; };
    mu.Await(absl::Condition(&all));
  };
  expected += kPerIteration * static_cast<int64_t>(kBytes);
  send_all(kPerIteration);  // Warm-up.
  wait_received();
  const absl::Time start = absl::Now();
  int64_t bytes = 0;
  for (auto _ : state) {
    expected += kPerIteration * static_cast<int64_t>(kBytes);
    send_all(kPerIteration);
    wait_received();
    bytes += kPerIteration * static_cast<int64_t>(kBytes);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  state.counters["GB/s"] = bytes / seconds / 1e9;
  state.SetBytesProcessed(bytes);
  state.SetLabel(absl::StrCat(transport, mode == 0   ? " eager drop"
                                         : mode == 1 ? " eager copy"
                                                     : " rndv"));
}
BENCHMARK(BM_Messages)
    ->ArgsProduct({{0, 1}, {0, 1, 2}})
    ->ArgNames({"transport", "mode"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void PrintComparison() {
  const std::string perftest = FindUcxPerftest();
  std::printf(
      "\nKvWriter vs ucx_perftest -t ucp_put_bw -e -O 1 (same transport and message "
      "size; perftest's own buffers may get a direct shared-memory lane where "
      "KvWriter's user memory goes through UCX's emulated puts)\n");
  std::printf("%-8s %7s %12s %14s %16s %7s\n", "tls", "tokens", "msg_bytes", "kv_writer_GB/s",
              "ucx_perftest_GB/s", "ratio");
  for (const auto& [key, measured] : Results()) {
    const auto& [transport, tokens] = key;
    std::string perftest_text = "n/a";
    std::string ratio_text = "n/a";
    if (perftest.empty()) {
      perftest_text = "not on PATH";
    } else {
      // One put in flight, as the benchmark writes one layer at a time
      // (unbounded, perftest over tcp drops to ~25 MB/s).
      absl::StatusOr<double> gbps =
          RunUcxPerftest(perftest, {.test = "ucp_put_bw",
                                    .transport = transport,
                                    .message_bytes = measured.message_bytes,
                                    .outstanding = 1});
      if (gbps.ok() && *gbps > 0) {
        perftest_text = absl::StrFormat("%.3f", *gbps);
        ratio_text = absl::StrFormat("%.2f", measured.kv_writer_gbps / *gbps);
      } else {
        std::fprintf(stderr, "ucx_perftest over %s: %s\n", transport.c_str(),
                     gbps.status().ToString().c_str());
      }
    }
    std::printf("%-8s %7d %12llu %14.3f %16s %7s\n", transport.c_str(), tokens,
                static_cast<unsigned long long>(measured.message_bytes), measured.kv_writer_gbps,
                perftest_text.c_str(), ratio_text.c_str());
  }
}

}  // namespace
}  // namespace trident::transport

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  trident::transport::PrintComparison();
  benchmark::Shutdown();
  return 0;
}
