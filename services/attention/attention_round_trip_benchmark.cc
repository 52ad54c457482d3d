// Round trip of one layer's request on the CPU-attention data plane, over
// real UCX between two workers of this process: a UcxAttentionClient (the
// decode worker's side) sends q, k and v of every sequence; a
// UcxAttentionServer (the attention service's side) computes and answers o.
// Llama-3-8B attention: 32 q heads, 8 KV heads, head_dim 128, bf16 on the
// wire, one lane each side.
//
// Rows: tls (0 posix shared memory, 1 tcp) x seqs (1, 4, 16, 64) x context
// (tokens per sequence: 1, 4096) x kernel:
//   kernel:0  a computer that only zeroes the reply rows: transport and
//             framing alone (context changes nothing there: listed at 1).
//   kernel:1  the service's KvAttentionComputer and kernel on a SpinPool of
//             --threads pinned threads, its sequences admitted to a
//             SequenceStore on a NUMA arena (ArenaKvPool) and their KV filled
//             to `context` tokens before timing.
// An iteration is one request for every sequence: Start, then Wait. Each
// request writes the token at position context - 1 again (the store pins any
// position within capacity and the computer overwrites it) and attends over
// [0, context - 1], so the context stays fixed. Requests cycle the layers as
// a decode step does, over as many as fit 2 GiB of KV (32 at most), so a
// layer's KV is cold when it is read.
//
// Counters per row: rt_us (mean round trip, also the Time column), p50_us,
// p99_us; compute_us and queued_us as the server's on_request reports them
// (AttentionRequestRecord), overhead_us = rt_us - compute_us (transport,
// framing, wire conversion, queueing, wake-ups); per_step_ms = rt_us x 32:
// what a 32-layer decode step gains if nothing hides the round trips;
// bytes_out and bytes_back of one request and its reply (header + data);
// threads (kernel rows); layers (distinct KV layers cycled).
//
// Both sides share this process's cores: the two UCX progress threads (one
// lane a side; each busy-polls for 2 ms after traffic), the dispatcher and
// the caller run wherever the scheduler puts them, kernel cores included.
// With few cores (a 2-core CI machine) that contention shows in compute_us
// and the tails; on a service host leave cores free with --threads.
//
//   bazel run --config=cpu -c opt //services/attention:attention_round_trip_benchmark --
//     --benchmark_min_time=0.05 [--threads=N] [--benchmark_filter='kernel:1']

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "common/numa/numa_arena.h"
#include "common/numa/numa_topology.h"
#include "common/numa/spin_pool.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"
#include "common/time/clock.h"
#include "common/transport/attention/attention_wire.h"
#include "common/transport/attention/remote_attention.h"
#include "common/transport/attention/ucx_attention_client.h"
#include "common/transport/attention/ucx_attention_server.h"
#include "common/transport/ucx_lanes.h"
#include "common/transport/ucx_worker.h"
#include "services/attention/kv_attention_computer.h"
#include "services/attention/kv_store/arena_kv_pool.h"
#include "services/attention/kv_store/kv_pool.h"
#include "services/attention/kv_store/sequence_store.h"
#include "trident/v1/cluster.pb.h"

ABSL_FLAG(int32_t, threads, 0,
          "Kernel threads of kernel rows, pinned one per physical core of the node; 0: every "
          "physical core but one, which is left to the UCX progress threads, the dispatcher and "
          "the caller (in production the client side runs on another host).");

namespace trident::attention {
namespace {

using transport::UcxLanes;
using transport::UcxWorker;
using transport::attention::AttentionCall;
using transport::attention::AttentionComputer;
using transport::attention::AttentionRequestRecord;
using transport::attention::RemoteAttention;
using transport::attention::ReplyHeader;
using transport::attention::RequestHeader;
using transport::attention::RequestView;
using transport::attention::UcxAttentionClient;
using transport::attention::UcxAttentionServer;
using transport::attention::UcxAttentionServerOptions;
using transport::attention::WireDType;
using transport::attention::WireElementSize;

const char* const kTransports[] = {"posix", "tcp"};
constexpr int32_t kModelLayers = 32;
constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kBlockSize = 16;
constexpr int64_t kKvBudgetBytes = int64_t{2} << 30;
constexpr uint64_t kIncarnation = 1234;
constexpr char kOwner[] = "decode-0";
constexpr int kWarmupRequests = 3;
constexpr absl::Duration kWaitTimeout = absl::Seconds(60);
// bf16 0x3c3c (~0.0115), exact in bf16: the KV filled before timing and the
// k and v each request appends, so every element of o must come back as it.
constexpr float kKvValue = 0.011474609375f;
constexpr uint8_t kKvByte = 0x3c;

// Answers zeros: what is left is transport and framing.
class NullComputer final : public AttentionComputer {
 public:
  absl::Status Compute(const RequestView& request, char* reply_rows) override {
    const RequestHeader& h = request.header;
    std::memset(reply_rows, 0,
                static_cast<size_t>(h.num_sequences) * h.num_q_heads * h.head_dim *
                    WireElementSize(h.dtype));
    return absl::OkStatus();
  }
};

// The server's on_request records. It calls on_request after the reply is
// sent, so the last record may trail the caller's Wait.
class RecordLog {
 public:
  void Add(const AttentionRequestRecord& record) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    records_.push_back(record);
  }
  // Waits until `count` records are in and returns them; DEADLINE_EXCEEDED
  // after 10 seconds.
  absl::StatusOr<std::vector<AttentionRequestRecord>> Take(size_t count) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto arrived = [&] { return records_.size() >= count; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&arrived), absl::Seconds(10))) {
      return absl::DeadlineExceededError(
          absl::StrCat(records_.size(), " of ", count, " request records arrived"));
    }
    return records_;
  }

 private:
  absl::Mutex mu_;
  std::vector<AttentionRequestRecord> records_ ABSL_GUARDED_BY(mu_);
};

trident::v1::TransportEndpoint Describe(const UcxLanes& lanes, const std::string& owner) {
  trident::v1::TransportEndpoint endpoint;
  endpoint.set_owner_id(owner);
  endpoint.set_incarnation(kIncarnation);
  lanes.DescribeAddresses(&endpoint);
  return endpoint;
}

// Two UCX workers of this process wired as a decode worker (client) and an
// attention service (server). Members are destroyed in reverse: the server
// before the lanes its handlers run on.
struct DataPlane {
  std::unique_ptr<UcxWorker> service_worker;
  std::unique_ptr<UcxWorker> client_worker;
  std::unique_ptr<UcxLanes> service_lanes;
  std::unique_ptr<UcxLanes> client_lanes;
  std::unique_ptr<UcxAttentionServer> server;
  std::unique_ptr<UcxAttentionClient> client;
  std::unique_ptr<RemoteAttention> channel;
};

// `computer` must outlive the result.
absl::StatusOr<std::unique_ptr<DataPlane>> ConnectDataPlane(const std::string& transports,
                                                            AttentionComputer* computer,
                                                            UcxAttentionServerOptions options) {
  auto plane = std::make_unique<DataPlane>();
  TRIDENT_ASSIGN_OR_RETURN(plane->service_worker,
                           UcxWorker::Create({.transports = transports, .name = "attention-0"}));
  TRIDENT_ASSIGN_OR_RETURN(plane->client_worker,
                           UcxWorker::Create({.transports = transports, .name = kOwner}));
  TRIDENT_ASSIGN_OR_RETURN(plane->service_lanes,
                           UcxLanes::Create(plane->service_worker.get(), {.lanes = 1}));
  TRIDENT_ASSIGN_OR_RETURN(plane->client_lanes,
                           UcxLanes::Create(plane->client_worker.get(), {.lanes = 1}));
  TRIDENT_ASSIGN_OR_RETURN(plane->server, UcxAttentionServer::Create(plane->service_lanes.get(),
                                                                     computer, std::move(options)));
  TRIDENT_ASSIGN_OR_RETURN(plane->client,
                           UcxAttentionClient::Create(plane->client_lanes.get(), kIncarnation));
  TRIDENT_RETURN_IF_ERROR(plane->server->AddPeer(Describe(*plane->client_lanes, kOwner)));
  TRIDENT_ASSIGN_OR_RETURN(
      plane->channel, plane->client->ForService(Describe(*plane->service_lanes, "attention-0")));
  return plane;
}

absl::StatusOr<std::unique_ptr<numa::SpinPool>> CreateKernelPool() {
  TRIDENT_ASSIGN_OR_RETURN(const numa::NumaTopology topology, numa::NumaTopology::Read());
  const int node = topology.DefaultNode();
  int32_t threads = absl::GetFlag(FLAGS_threads);
  if (threads == 0) {
    TRIDENT_ASSIGN_OR_RETURN(const std::vector<int> cores, topology.PhysicalCores(node));
    threads = std::max(1, static_cast<int32_t>(cores.size()) - 1);
  }
  return numa::SpinPool::CreateOnNode(topology, node, threads);
}

// The kernel threads of every kernel row, started once as the service starts
// them once. Never destroyed.
absl::StatusOr<numa::SpinPool*> KernelPool() {
  static auto* const pool = new absl::StatusOr<std::unique_ptr<numa::SpinPool>>(CreateKernelPool());
  if (!pool->ok()) return pool->status();
  return pool->value().get();
}

SequenceSpec SpecFor(int32_t context, int32_t layers) {
  return SequenceSpec{.owner_id = kOwner,
                      .owner_incarnation = kIncarnation,
                      .num_layers = layers,
                      .num_q_heads = kQHeads,
                      .num_kv_heads = kKvHeads,
                      .head_dim = kHeadDim,
                      .dtype = numeric::DType::kBF16,
                      .capacity_tokens = context,
                      .block_size = kBlockSize};
}

// KV layers the sequences of a kernel row cycle through: as many as fit
// kKvBudgetBytes, at most kModelLayers; 0 if one does not fit.
int32_t KvLayersFor(int64_t num_sequences, int32_t context) {
  const absl::StatusOr<SequenceLayout> layout = LayoutFor(SpecFor(context, 1));
  if (!layout.ok()) return 0;
  const int64_t layer_bytes = num_sequences * static_cast<int64_t>(layout->layer_stride_bytes);
  return static_cast<int32_t>(std::min<int64_t>(kModelLayers, kKvBudgetBytes / layer_bytes));
}

// The service's side of a kernel row. Members are destroyed in reverse: the
// computer, then the store (which frees the sequences), then the pool.
struct KernelSide {
  std::unique_ptr<KvPool> kv_pool;
  std::unique_ptr<SequenceStore> store;
  std::unique_ptr<KvAttentionComputer> computer;
  std::vector<uint64_t> handles;
};

// Admits `num_sequences` sequences of `layers` layers and `context` tokens
// to a store on an arena of their size, and fills every layer's KV with
// kKvByte on the kernel threads (as one-sided writes of the prompts would
// have filled it).
absl::StatusOr<std::unique_ptr<KernelSide>> BuildKernelSide(int32_t num_sequences, int32_t context,
                                                            int32_t layers, numa::SpinPool* pool) {
  const SequenceSpec base = SpecFor(context, layers);
  TRIDENT_ASSIGN_OR_RETURN(const SequenceLayout layout, LayoutFor(base));
  const int64_t sequence_bytes = static_cast<int64_t>(LayoutBytes(layout));
  TRIDENT_ASSIGN_OR_RETURN(const numa::NumaTopology topology, numa::NumaTopology::Read());
  TRIDENT_ASSIGN_OR_RETURN(
      std::unique_ptr<numa::NumaArena> arena,
      numa::NumaArena::Create(topology, {.node = topology.DefaultNode(),
                                         .capacity_bytes = num_sequences * sequence_bytes,
                                         .prefault_pool = pool}));
  auto side = std::make_unique<KernelSide>();
  side->kv_pool = std::make_unique<ArenaKvPool>(std::move(arena));
  side->store = std::make_unique<SequenceStore>(side->kv_pool.get(), Clock::Real());
  TRIDENT_RETURN_IF_ERROR(side->store->Connect(kOwner, kIncarnation).status());
  for (int32_t i = 0; i < num_sequences; ++i) {
    SequenceSpec spec = base;
    spec.sequence_id = absl::StrCat("sequence-", i);
    TRIDENT_ASSIGN_OR_RETURN(const AdmittedSequence admitted, side->store->Admit(spec));
    side->handles.push_back(admitted.handle);
    const int64_t slice = sequence_bytes / pool->num_threads() / 64 * 64;
    pool->Run([&](int t) {
      const int64_t end = t + 1 == pool->num_threads() ? sequence_bytes : (t + 1) * slice;
      std::memset(admitted.data + t * slice, kKvByte, end - t * slice);
    });
  }
  TRIDENT_ASSIGN_OR_RETURN(
      side->computer,
      KvAttentionComputer::Create(
          side->store.get(),
          Executor{.threads = pool->num_threads(),
                   .run = [pool](const std::function<void(int)>& fn) { pool->Run(fn); }}));
  return side;
}

// One request's rows as a decode worker's GPU backend sends them: bf16
// [q | k | v] of every sequence, and bf16 o back, with no conversion.
struct Batch {
  static constexpr int64_t kQElems = kQHeads * kHeadDim;
  static constexpr int64_t kRowElems = kQElems + 2 * kKvHeads * kHeadDim;

  Batch(std::vector<uint64_t> sequence_handles, int32_t context)
      : handles(std::move(sequence_handles)),
        positions(handles.size(), context - 1),
        qkv(handles.size() * kRowElems),
        out(handles.size() * kQElems, numeric::FloatToBf16(-1.0f)) {
    for (size_t i = 0; i < handles.size(); ++i) {
      uint16_t* row = &qkv[i * kRowElems];
      std::fill_n(row, kQElems, numeric::FloatToBf16(0.01f));
      std::fill_n(row + kQElems, kRowElems - kQElems, numeric::FloatToBf16(kKvValue));
    }
  }

  AttentionCall Call(int32_t layer) {
    AttentionCall call{.layer = layer,
                       .num_q_heads = kQHeads,
                       .num_kv_heads = kKvHeads,
                       .head_dim = kHeadDim,
                       .dtype = WireDType::kBF16,
                       .handles = handles,
                       .positions = positions};
    call.qkv_bf16 = qkv.data();
    call.qkv_bf16_stride = kRowElems;
    call.out_bf16 = out.data();
    call.out_bf16_stride = kQElems;
    return call;
  }

  // Whether every element of o is `want` (the kernel's output is an average
  // of equal values, so only rounding, to bf16 here, may differ).
  bool OutIs(float want) const {
    return std::all_of(out.begin(), out.end(), [want](uint16_t o) {
      return std::abs(numeric::Bf16ToFloat(o) - want) <= std::abs(want) / 128 + 1e-4f;
    });
  }

  std::vector<uint64_t> handles;
  std::vector<int32_t> positions;
  std::vector<uint16_t> qkv, out;
};

absl::Status RoundTrip(RemoteAttention& channel, const AttentionCall& call) {
  TRIDENT_ASSIGN_OR_RETURN(const RemoteAttention::Ticket ticket, channel.Start(call));
  return channel.Wait(ticket, kWaitTimeout);
}

// Header and data bytes of one request for `num_sequences`, and of its reply.
std::pair<int64_t, int64_t> WireBytes(int32_t num_sequences) {
  const RequestHeader request{.dtype = WireDType::kBF16,
                              .num_sequences = num_sequences,
                              .num_q_heads = kQHeads,
                              .num_kv_heads = kKvHeads,
                              .head_dim = kHeadDim};
  const ReplyHeader reply{.dtype = WireDType::kBF16,
                          .num_sequences = num_sequences,
                          .num_q_heads = kQHeads,
                          .head_dim = kHeadDim};
  return {static_cast<int64_t>(sizeof(RequestHeader) + RequestDataBytes(request)),
          static_cast<int64_t>(sizeof(ReplyHeader) + ReplyDataBytes(reply))};
}

// Means of the records past the warm-up, in microseconds.
std::pair<double, double> MeanComputeAndQueuedUs(
    const std::vector<AttentionRequestRecord>& records) {
  absl::Duration compute, queued;
  for (size_t i = kWarmupRequests; i < records.size(); ++i) {
    compute += records[i].compute;
    queued += records[i].queued;
  }
  const double n = static_cast<double>(records.size() - kWarmupRequests);
  return {absl::ToDoubleMicroseconds(compute) / n, absl::ToDoubleMicroseconds(queued) / n};
}

double Percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(fraction * values.size()));
  return values[std::clamp<size_t>(rank, 1, values.size()) - 1];
}

// Times Start + Wait per iteration, cycling `layers`; returns the round
// trips in microseconds (empty after an error, reported to `state`).
std::vector<double> TimeRoundTrips(benchmark::State& state, RemoteAttention& channel, Batch& batch,
                                   int32_t layers) {
  for (int i = 0; i < kWarmupRequests; ++i) {
    const absl::Status status = RoundTrip(channel, batch.Call(i % layers));
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return {};
    }
  }
  std::vector<double> round_trips_us;
  int32_t layer = kWarmupRequests % layers;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    const absl::Status status = RoundTrip(channel, batch.Call(layer));
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return {};
    }
    state.SetIterationTime(seconds.count());
    round_trips_us.push_back(seconds.count() * 1e6);
    layer = (layer + 1) % layers;
  }
  return round_trips_us;
}

void BM_AttentionRoundTrip(benchmark::State& state) {
  const std::string transport = kTransports[state.range(0)];
  const auto num_sequences = static_cast<int32_t>(state.range(1));
  const auto context = static_cast<int32_t>(state.range(2));
  const bool kernel = state.range(3) != 0;
  state.SetLabel(absl::StrCat(transport, kernel ? " kernel" : " null"));

  NullComputer null_computer;
  std::unique_ptr<KernelSide> kernel_side;
  std::vector<uint64_t> handles(num_sequences);
  for (int32_t i = 0; i < num_sequences; ++i) handles[i] = i + 1;
  int32_t layers = kModelLayers;
  if (kernel) {
    absl::StatusOr<numa::SpinPool*> pool = KernelPool();
    layers = KvLayersFor(num_sequences, context);
    absl::StatusOr<std::unique_ptr<KernelSide>> side =
        pool.ok() ? BuildKernelSide(num_sequences, context, layers, *pool) : pool.status();
    if (!side.ok()) {
      state.SkipWithError(side.status().ToString().c_str());
      return;
    }
    kernel_side = *std::move(side);
    handles = kernel_side->handles;
    state.counters["threads"] = (*pool)->num_threads();
  }
  AttentionComputer* computer =
      kernel ? static_cast<AttentionComputer*>(kernel_side->computer.get()) : &null_computer;
  RecordLog log;
  UcxAttentionServerOptions options;
  options.on_request = [&log](const AttentionRequestRecord& record) { log.Add(record); };
  absl::StatusOr<std::unique_ptr<DataPlane>> plane =
      ConnectDataPlane(transport, computer, std::move(options));
  if (!plane.ok()) {
    state.SkipWithError(plane.status().ToString().c_str());
    return;
  }
  Batch batch(std::move(handles), context);
  const std::vector<double> round_trips_us =
      TimeRoundTrips(state, *(*plane)->channel, batch, layers);
  if (round_trips_us.empty()) return;
  if (!batch.OutIs(kernel ? kKvValue : 0.0f)) {
    state.SkipWithError("o is not what the KV implies");
    return;
  }
  const absl::StatusOr<std::vector<AttentionRequestRecord>> records =
      log.Take(kWarmupRequests + round_trips_us.size());
  if (!records.ok()) {
    state.SkipWithError(records.status().ToString().c_str());
    return;
  }
  double rt_us = 0;
  for (double us : round_trips_us) rt_us += us;
  rt_us /= static_cast<double>(round_trips_us.size());
  const auto [compute_us, queued_us] = MeanComputeAndQueuedUs(*records);
  const auto [bytes_out, bytes_back] = WireBytes(num_sequences);
  state.counters["rt_us"] = rt_us;
  state.counters["p50_us"] = Percentile(round_trips_us, 0.50);
  state.counters["p99_us"] = Percentile(round_trips_us, 0.99);
  state.counters["compute_us"] = compute_us;
  state.counters["queued_us"] = queued_us;
  state.counters["overhead_us"] = rt_us - compute_us;
  state.counters["per_step_ms"] = rt_us * kModelLayers / 1000.0;
  state.counters["bytes_out"] = static_cast<double>(bytes_out);
  state.counters["bytes_back"] = static_cast<double>(bytes_back);
  state.counters["layers"] = layers;
}

// Null rows at context 1; kernel rows at contexts 1, 320 (short sequences,
// where the per-request and per-sequence costs weigh most) and 4096 wherever
// one layer of the batch fits kKvBudgetBytes.
void Rows(benchmark::internal::Benchmark* b) {
  for (int64_t tls : {0, 1}) {
    for (int64_t sequences : {1, 4, 16, 64}) {
      b->Args({tls, sequences, 1, 0});
      for (int32_t context : {1, 320, 4096}) {
        if (KvLayersFor(sequences, context) > 0) b->Args({tls, sequences, context, 1});
      }
    }
  }
}

BENCHMARK(BM_AttentionRoundTrip)
    ->ArgNames({"tls", "seqs", "context", "kernel"})
    ->Apply(Rows)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::attention

// Google Benchmark takes its flags first; absl parses what is left
// (--threads).
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  absl::ParseCommandLine(argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
