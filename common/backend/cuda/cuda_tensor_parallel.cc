// Tensor parallelism in the CUDA backend (cuda_backend_impl.h, TpGroup):
// loading a group of ranks, and driving a step on all of them from rank 0.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/backend/cuda/cuda_backend_impl.h"
#include "common/logging/log.h"
#include "common/model/tensor_parallel/tensor_parallel.h"
#include "common/numeric/dtype.h"
#include "common/parallel/nccl_group.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/peer_allreduce/peer_allreduce.h"

namespace trident::backend::cuda_internal {
namespace {

// The devices of a group's ranks: the option's list, or `device` onwards.
absl::StatusOr<std::vector<int>> RankDevices(const CudaBackendOptions& options) {
  const int n = options.tensor_parallel;
  if (n < 1 || n > kc::kMaxPeerAllReduceRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel=", n, ": want 1..", kc::kMaxPeerAllReduceRanks));
  }
  std::vector<int> devices(options.tensor_parallel_devices.begin(),
                           options.tensor_parallel_devices.end());
  if (devices.empty()) {
    for (int r = 0; r < n; ++r) devices.push_back(options.device + r);
  }
  if (static_cast<int>(devices.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism over ", n, " ranks given ", devices.size(), " devices"));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--tensor_parallel=", n, " needs CUDA device ", d, "; this machine has ", count));
    }
  }
  return devices;
}

// Every pair of distinct devices addresses the other's memory (the peer
// all-reduce and the head's writes into rank 0's logits).
absl::Status EnablePeerAccess(const std::vector<int>& devices) {
  for (int a : devices) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(a), "set device"));
    for (int b : devices) {
      if (a == b) continue;
      int can = 0;
      TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaDeviceCanAccessPeer(&can, a, b), "peer query"));
      if (!can) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor parallelism needs peer access between GPUs; cuda:", a,
                         " cannot reach cuda:", b));
      }
      const cudaError_t err = cudaDeviceEnablePeerAccess(b, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        TRIDENT_RETURN_IF_ERROR(CudaCheck(err, "enable peer access"));
      }
    }
  }
  return absl::OkStatus();
}

bool Distinct(std::vector<int> devices) {
  std::sort(devices.begin(), devices.end());
  return std::adjacent_find(devices.begin(), devices.end()) == devices.end();
}

// Each rank's shard and workspace. On distinct devices every rank loads at
// once, on a start-up thread of its own: reading and converting a shard is
// host work (a checkpoint's pages, bf16 conversion) that one rank at a time
// would leave idle n - 1 times over. Ranks sharing a device load in turn,
// each budgeting from the memory the ones before it left free.
absl::Status LoadShards(const TpGroup& g, const model::TensorReader& weights,
                        const model::ModelConfig& config, const std::string& source, bool at_once) {
  auto load = [&](Impl* rank) -> absl::Status {
    TRIDENT_LOG(INFO) << "tensor-parallel rank " << rank->tp.rank() << " of " << g.ranks.size()
                      << " on cuda:" << rank->options.device << ": loading its shard";
    TRIDENT_RETURN_IF_ERROR(rank->LoadWeights(weights, config, source));
    return rank->AllocateWorkspace();
  };
  if (!at_once) {
    for (Impl* rank : g.ranks) TRIDENT_RETURN_IF_ERROR(load(rank));
    return absl::OkStatus();
  }
  std::vector<absl::Status> loaded(g.ranks.size());
  std::vector<std::thread> loaders;
  for (size_t r = 0; r < g.ranks.size(); ++r) {
    loaders.emplace_back([&, r] { loaded[r] = load(g.ranks[r]); });
  }
  for (std::thread& loader : loaders) loader.join();
  for (const absl::Status& status : loaded) TRIDENT_RETURN_IF_ERROR(status);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Impl>> LoadTensorParallel(const model::TensorReader& weights,
                                                         const model::ModelConfig& config,
                                                         const std::string& source,
                                                         const CudaBackendOptions& options) {
  TRIDENT_ASSIGN_OR_RETURN(const std::vector<int> devices, RankDevices(options));
  const int n = static_cast<int>(devices.size());
  TRIDENT_RETURN_IF_ERROR(EnablePeerAccess(devices));
  auto group = std::make_unique<TpGroup>();
  TpGroup* g = group.get();
  g->nccl_min_bytes = options.tensor_parallel_nccl_min_bytes;
  std::unique_ptr<Impl> first;
  for (int r = 0; r < n; ++r) {
    auto impl = std::make_unique<Impl>();
    impl->options = options;
    impl->options.device = devices[r];
    if (!Distinct(devices)) {
      // Ranks sharing a device: a kernel launched early by PDL would hold
      // SMs waiting behind a sum that spins for the other rank, whose own
      // kernels then find no room.
      impl->options.pdl = false;
      impl->options.pdl_chain = false;
    }
    TRIDENT_ASSIGN_OR_RETURN(impl->tp.layout, model::MakeTensorParallelLayout(config, n, r));
    impl->tp.group = g;
    g->ranks.push_back(impl.get());
    if (r == 0) {
      first = std::move(impl);
    } else {
      g->owned.push_back(std::move(impl));
    }
  }
  first->tp.owned_group = std::move(group);
  TRIDENT_RETURN_IF_ERROR(LoadShards(*g, weights, config, source, Distinct(devices)));
  // Block ids are shared: every rank's pool holds as many as the smallest.
  int32_t blocks = INT32_MAX;
  for (Impl* rank : g->ranks) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(rank->options.device), "set device"));
    TRIDENT_ASSIGN_OR_RETURN(const int32_t available, rank->KvBlocksAvailable());
    blocks = std::min(blocks, available);
  }
  for (Impl* rank : g->ranks) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(rank->options.device), "set device"));
    TRIDENT_RETURN_IF_ERROR(rank->AllocateKv(blocks));
  }
  if (Distinct(devices) && n > 1) {
    absl::StatusOr<std::unique_ptr<parallel::NcclGroup>> nccl =
        parallel::NcclGroup::Create(devices);
    if (nccl.ok()) {
      g->nccl = *std::move(nccl);
    } else {
      TRIDENT_LOG(WARNING) << "NCCL unavailable (" << nccl.status().message()
                           << "); every tensor-parallel sum takes the peer kernel";
    }
  }
  for (Impl* rank : g->ranks) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(rank->options.device), "set device"));
    TRIDENT_RETURN_IF_ERROR(rank->CaptureGraphs());
  }
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(devices[0]), "set device"));
  TRIDENT_LOG(INFO) << "tensor parallelism over " << n
                    << " ranks (cuda:" << absl::StrJoin(devices, ",cuda:") << "), sums of "
                    << (g->nccl != nullptr
                            ? absl::StrCat("at least ", g->nccl_min_bytes, " bytes through NCCL")
                            : std::string("every size through the peer kernel"));
  return first;
}

absl::Status Impl::EnqueuePeerSum(Pass& pass, bool down) {
  const TpGroup& g = *tp.group;
  kc::PeerAllReduceArgs a;
  a.rank = tp.rank();
  a.ranks = static_cast<int>(g.ranks.size());
  for (int q = 0; q < a.ranks; ++q) {
    a.in[q] = g.ranks[q]->Partial(down);
    a.signals[q] = g.ranks[q]->tp.signals.get();
  }
  a.out = pass.residual.get<float>();
  a.count = pass.shape.total * config.hidden_size;
  a.accumulate = true;
  // The o and down sums alternate between the two halves of the partials,
  // so a rank writes a half again only after every peer started the next
  // sum, that is, finished reading this one: no closing barrier needed.
  a.skip_end_barrier = true;
  return kc::LaunchPeerAllReduce(a, stream);
}

absl::Status Impl::EnqueueHeadBarrier() {
  const TpGroup& g = *tp.group;
  kc::PeerAllReduceArgs a;
  a.rank = tp.rank();
  a.ranks = static_cast<int>(g.ranks.size());
  for (int q = 0; q < a.ranks; ++q) {
    a.in[q] = g.ranks[q]->tp.barrier.get<float>();
    a.signals[q] = g.ranks[q]->tp.signals.get();
  }
  a.out = tp.barrier.get<float>() + 4;
  a.count = 0;  // Only the barriers: every rank's head columns are written.
  return kc::LaunchPeerAllReduce(a, stream);
}

absl::Status Impl::SumOverRanks(bool down, int32_t layer) {
  TpGroup& g = *tp.group;
  if (tp.nccl_step) {
    std::vector<void*> buffers;
    std::vector<cudaStream_t> streams;
    for (Impl* r : g.ranks) {
      buffers.push_back(r->passes[0].residual.get());
      streams.push_back(r->stream);
    }
    const size_t count = static_cast<size_t>(passes[0].shape.total) * config.hidden_size;
    TRIDENT_RETURN_IF_ERROR(g.nccl->AllReduceSum(buffers, count, numeric::DType::kF32, streams));
  } else {
    for (Impl* r : g.ranks) {
      TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(r->options.device), "set device"));
      TRIDENT_RETURN_IF_ERROR(r->EnqueuePeerSum(r->passes[0], down));
    }
  }
  if (down) return absl::OkStatus();
  // Every rank's KV of this layer precedes its part of the sum.
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(options.device), "set device"));
  return ReportLayer(passes[0], layer);
}

absl::Status Impl::EnqueueTensorParallel() {
  TpGroup& g = *tp.group;
  const int64_t bytes = passes[0].shape.total * int64_t{config.hidden_size} * 4;
  const bool nccl = g.nccl != nullptr && bytes >= g.nccl_min_bytes;
  if (nccl) ++g.nccl_steps;
  // Phase by phase over the ranks (never a whole step of one rank ahead of
  // the others: its stream's queue would fill while it waits for them).
  auto each = [&](auto&& enqueue) -> absl::Status {
    for (Impl* r : g.ranks) {
      TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(r->options.device), "set device"));
      TRIDENT_RETURN_IF_ERROR(enqueue(*r, r->passes[0]));
    }
    return absl::OkStatus();
  };
  TRIDENT_RETURN_IF_ERROR(each([&](Impl& r, Pass& p) {
    r.tp.nccl_step = nccl;
    return r.EnqueueEmbedding(p);
  }));
  for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
    TRIDENT_RETURN_IF_ERROR(each([&](Impl& r, Pass& p) {
      TRIDENT_RETURN_IF_ERROR(r.EnqueuePreAttention(p, l));
      TRIDENT_RETURN_IF_ERROR(r.EnqueueLocalAttention(p, l));
      return r.EnqueueOProj(p, l);
    }));
    TRIDENT_RETURN_IF_ERROR(SumOverRanks(/*down=*/false, l));
    TRIDENT_RETURN_IF_ERROR(each([&](Impl& r, Pass& p) { return r.EnqueueMlp(p, l); }));
    TRIDENT_RETURN_IF_ERROR(SumOverRanks(/*down=*/true, l));
  }
  return each([&](Impl& r, Pass& p) {
    TRIDENT_RETURN_IF_ERROR(r.EnqueueHead(p));
    r.tp.nccl_step = false;
    return r.EnqueueHeadBarrier();
  });
}

absl::StatusOr<int64_t> Impl::RunTensorParallel(absl::Span<const StepSequence> batch) {
  TpGroup& g = *tp.group;
  for (const StepSequence& s : batch) {
    if (s.remote.service != nullptr) {
      return absl::InvalidArgumentError(
          "a tensor-parallel backend serves no CPU-resident sequences");
    }
  }
  // Every rank stages the same step into its own metadata.
  bool use_graph = false;
  for (Impl* r : g.ranks) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(r->options.device), "set device"));
    TRIDENT_RETURN_IF_ERROR(r->Split(batch));
    if (r->passes[0].order.empty()) break;
    r->passes[0].logits_row0 = 0;
    TRIDENT_ASSIGN_OR_RETURN(use_graph, r->Stage(r->passes[0], batch, /*graphable=*/true));
  }
  absl::Status status = absl::OkStatus();
  if (passes[0].order.empty()) {
  } else if (use_graph && graphs.contains(GraphKey(passes[0].shape))) {
    for (Impl* r : g.ranks) {
      status.Update(CudaCheck(cudaSetDevice(r->options.device), "set device"));
      r->tp.nccl_step = false;
      if (status.ok()) status.Update(r->LaunchGraph(r->passes[0]));
    }
  } else {
    if (use_graph) graph_misses.fetch_add(1, std::memory_order_relaxed);
    status = EnqueueTensorParallel();
  }
  if (!status.ok()) RecoverTensorParallel();
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(options.device), "set device"));
  TRIDENT_RETURN_IF_ERROR(status);
  return static_cast<int64_t>(row_origin.size());
}

void Impl::RecoverTensorParallel() {
  // Ranks that enqueued their part of a sum whose peers never will wait
  // until the kernel's timeout; then the flag words start again from zero.
  for (Impl* r : tp.group->ranks) {
    cudaSetDevice(r->options.device);
    cudaStreamSynchronize(r->stream);
  }
  for (Impl* r : tp.group->ranks) {
    cudaSetDevice(r->options.device);
    cudaMemset(r->tp.signals.get(), 0, r->tp.signals.bytes());
    cudaDeviceSynchronize();
    cudaGetLastError();
  }
  TRIDENT_LOG(WARNING) << "tensor-parallel step failed; ranks synchronised and their all-reduce "
                          "flags reset";
}

}  // namespace trident::backend::cuda_internal
