#include "common/backend/cuda/cuda_peer_lane.h"

#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_util.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/block_copy/block_copy.h"

namespace trident::backend {
namespace {

// A peer's ranks mapped into this process (on `device`).
class CudaPeerPool final : public KvPeerPool {
 public:
  CudaPeerPool(int32_t device, std::optional<model::KvView> view, uint64_t bytes)
      : device_(device), view_(std::move(view)), bytes_(bytes) {}
  ~CudaPeerPool() override {
    DeviceGuard guard(device_);
    for (char* base : bases_) cudaIpcCloseMemHandle(base);
  }
  uint64_t bytes() const override { return bytes_; }

  model::KvPoolSide side() const { return {view_.has_value() ? &*view_ : nullptr, bytes_}; }
  const std::vector<char*>& bases() const { return bases_; }
  std::vector<char*>& mutable_bases() { return bases_; }

 private:
  const int32_t device_;
  const std::optional<model::KvView> view_;
  const uint64_t bytes_;
  std::vector<char*> bases_;
};

bool Aligned16(uint64_t v) { return v % 16 == 0; }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaKvPeerLane>> CudaKvPeerLane::Create(
    const model::ModelConfig& config, const kv::KvCacheSpec& spec, std::vector<RankPool> ranks,
    CudaPeerLaneOptions options) {
  if (ranks.empty()) return absl::InvalidArgumentError("a KV peer lane over no pools");
  std::optional<model::KvView> view;
  uint64_t rank_bytes = spec.TotalBytes();
  if (ranks.size() > 1) {
    TRIDENT_ASSIGN_OR_RETURN(
        model::KvView v, model::KvView::ForPool(config, static_cast<int32_t>(ranks.size()), spec));
    rank_bytes = v.rank_spec().TotalBytes();
    view = std::move(v);
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].base == nullptr || ranks[r].bytes < rank_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", r, "'s KV pool is smaller than its layout's ", rank_bytes));
    }
  }
  if (options.streams < 1 || options.streams > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV peer lane streams is ", options.streams, "; want 1 to 8"));
  }
  std::unique_ptr<CudaKvPeerLane> lane(
      new CudaKvPeerLane(config, spec, std::move(view), std::move(ranks), options));
  {
    DeviceGuard guard(lane->ranks_[0].device);
    TRIDENT_RETURN_IF_ERROR(guard.status());
    absl::MutexLock lock(&lane->mu_);
    for (int32_t i = 0; i < options.streams; ++i) {
      Stream s;
      TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
                                        "KV peer lane stream"));
      lane->streams_.push_back(s);
    }
  }
  lane->completion_ = std::thread([l = lane.get()] { l->CompletionLoop(); });
  return lane;
}

CudaKvPeerLane::CudaKvPeerLane(const model::ModelConfig& config, const kv::KvCacheSpec& spec,
                               std::optional<model::KvView> view, std::vector<RankPool> ranks,
                               CudaPeerLaneOptions options)
    : config_(config),
      spec_(spec),
      view_(std::move(view)),
      ranks_(std::move(ranks)),
      options_(options) {}

CudaKvPeerLane::~CudaKvPeerLane() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (completion_.joinable()) completion_.join();
  DeviceGuard guard(ranks_[0].device);
  absl::MutexLock lock(&mu_);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  for (Stream& s : streams_) {
    cudaStreamDestroy(s.stream);
    if (s.pointers != nullptr) cudaFree(s.pointers);
  }
}

absl::StatusOr<KvPeerExport> CudaKvPeerLane::Export() const {
  KvPeerExport out;
  out.spec = spec_;
  for (const RankPool& pool : ranks_) {
    DeviceGuard guard(pool.device);
    TRIDENT_RETURN_IF_ERROR(guard.status());
    cudaIpcMemHandle_t handle;
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaIpcGetMemHandle(&handle, pool.base), "cudaIpcGetMemHandle"));
    out.rank_handles.emplace_back(reinterpret_cast<const char*>(&handle), sizeof(handle));
  }
  return out;
}

absl::StatusOr<std::shared_ptr<KvPeerPool>> CudaKvPeerLane::Open(const KvPeerExport& peer) {
  const size_t n = peer.rank_handles.size();
  if (n == 0) return absl::InvalidArgumentError("a KV peer pool of no ranks");
  kv::KvCacheSpec same = peer.spec;
  same.num_blocks = spec_.num_blocks;
  if (!(same == spec_)) {
    return absl::InvalidArgumentError(
        "a KV peer pool laid out unlike this one (beyond its block count)");
  }
  std::optional<model::KvView> view;
  if (n > 1) {
    TRIDENT_ASSIGN_OR_RETURN(model::KvView v,
                             model::KvView::ForPool(config_, static_cast<int32_t>(n), peer.spec));
    view = std::move(v);
  }
  auto pool =
      std::make_shared<CudaPeerPool>(ranks_[0].device, std::move(view), peer.spec.TotalBytes());
  DeviceGuard guard(ranks_[0].device);
  TRIDENT_RETURN_IF_ERROR(guard.status());
  for (size_t r = 0; r < n; ++r) {
    cudaIpcMemHandle_t handle;
    if (peer.rank_handles[r].size() != sizeof(handle)) {
      return absl::InvalidArgumentError(absl::StrCat("KV peer pool rank ", r, "'s handle is ",
                                                     peer.rank_handles[r].size(), " bytes; want ",
                                                     sizeof(handle)));
    }
    std::memcpy(&handle, peer.rank_handles[r].data(), sizeof(handle));
    void* base = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return absl::FailedPreconditionError(
          absl::StrCat("cannot map KV peer pool rank ", r,
                       " (cudaIpcOpenMemHandle): ", cudaGetErrorString(err)));
    }
    pool->mutable_bases().push_back(static_cast<char*>(base));
  }
  return std::shared_ptr<KvPeerPool>(std::move(pool));
}

void CudaKvPeerLane::Copy(const std::shared_ptr<KvPeerPool>& peer,
                          absl::Span<const KvPeerCopy> copies,
                          std::function<void(absl::Status)> done) {
  auto* pool = static_cast<CudaPeerPool*>(peer.get());
  std::vector<model::KvCopyRun> planned;
  const model::KvPoolSide local{view_.has_value() ? &*view_ : nullptr, spec_.TotalBytes()};
  for (const KvPeerCopy& c : copies) {
    absl::StatusOr<std::vector<model::KvCopyRun>> rank_copies =
        model::PlanRankCopies(local, c.local_offset, pool->side(), c.peer_offset, c.bytes);
    if (!rank_copies.ok()) {
      done(rank_copies.status());
      return;
    }
    planned.insert(planned.end(), rank_copies->begin(), rank_copies->end());
  }
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(ranks_[0].device);
  Stream& stream = streams_[next_stream_];
  next_stream_ = (next_stream_ + 1) % streams_.size();
  absl::Status status = guard.status();
  if (status.ok()) status = Enqueue(planned, pool->bases(), stream);
  Pending p;
  if (status.ok() && !free_events_.empty()) {
    p.event = free_events_.back();
    free_events_.pop_back();
  } else if (status.ok()) {
    status = CudaCheck(
        cudaEventCreateWithFlags(&p.event, cudaEventDisableTiming | cudaEventBlockingSync),
        "KV peer lane event");
  }
  if (status.ok()) {
    status = CudaCheck(cudaEventRecord(p.event, stream.stream), "KV peer lane event");
  }
  if (!status.ok()) {
    // Whatever was enqueued ends before the failure is reported.
    cudaStreamSynchronize(stream.stream);
    if (p.event != nullptr) cudaEventDestroy(p.event);
    done(status);
    return;
  }
  p.done = std::move(done);
  p.peer = peer;
  pending_.push_back(std::move(p));
}

absl::Status CudaKvPeerLane::Enqueue(const std::vector<model::KvCopyRun>& copies,
                                     const std::vector<char*>& peer_bases, Stream& stream) {
  // Copies of one size, 16-byte aligned, go together as a kernel when there
  // are enough of them.
  std::map<uint64_t, std::vector<const model::KvCopyRun*>> by_size;
  for (const model::KvCopyRun& c : copies) {
    if (Aligned16(c.bytes) && Aligned16(c.src_offset) && Aligned16(c.dst_offset)) {
      by_size[c.bytes].push_back(&c);
    }
  }
  std::vector<bool> in_kernel(copies.size(), false);
  for (const auto& [bytes, group] : by_size) {
    if (static_cast<int32_t>(group.size()) < options_.kernel_min_copies) continue;
    TRIDENT_RETURN_IF_ERROR(LaunchKernel(group, peer_bases, stream));
    for (const model::KvCopyRun* c : group) in_kernel[c - copies.data()] = true;
    kernel_copies_ += static_cast<int64_t>(group.size());
  }
  for (size_t i = 0; i < copies.size(); ++i) {
    if (in_kernel[i]) continue;
    const model::KvCopyRun& c = copies[i];
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMemcpyAsync(peer_bases[c.dst_rank] + c.dst_offset,
                                                      ranks_[c.src_rank].base + c.src_offset,
                                                      c.bytes, cudaMemcpyDefault, stream.stream),
                                      "KV peer copy"));
    ++engine_copies_;
  }
  return absl::OkStatus();
}

absl::Status CudaKvPeerLane::LaunchKernel(const std::vector<const model::KvCopyRun*>& copies,
                                          const std::vector<char*>& peer_bases, Stream& stream) {
  const int64_t n = static_cast<int64_t>(copies.size());
  if (n > stream.capacity) {
    // The stream's last launch must have read the arrays before they go.
    if (stream.pointers != nullptr) {
      cudaStreamSynchronize(stream.stream);
      cudaFree(stream.pointers);
    }
    stream.pointers = nullptr;
    stream.capacity = 0;
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaMalloc(reinterpret_cast<void**>(&stream.pointers), 2 * n * sizeof(void*)),
                  "KV peer lane"));
    stream.capacity = n;
  }
  std::vector<void*> host(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    host[i] = ranks_[copies[i]->src_rank].base + copies[i]->src_offset;
    host[n + i] = peer_bases[copies[i]->dst_rank] + copies[i]->dst_offset;
  }
  // From pageable memory: returns once the bytes are taken, and lands in
  // the stream's order, after its previous launch read the arrays.
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpyAsync(stream.pointers, host.data(), 2 * n * sizeof(void*),
                                cudaMemcpyHostToDevice, stream.stream),
                "KV peer lane pointers"));
  kernels::cuda::BlockCopyArgs args;
  args.src = stream.pointers;
  args.dst = stream.pointers + n;
  args.num_blocks = n;
  args.block_bytes = static_cast<int64_t>(copies.front()->bytes);
  return kernels::cuda::LaunchBlockCopy(args, stream.stream);
}

void CudaKvPeerLane::CompletionLoop() {
  while (true) {
    Pending p;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CudaKvPeerLane* l)
               ABSL_NO_THREAD_SAFETY_ANALYSIS { return l->stopping_ || !l->pending_.empty(); },
          this));
      if (pending_.empty()) return;  // stopping, nothing left
      p = std::move(pending_.front());
      pending_.pop_front();
    }
    absl::Status status;
    {
      DeviceGuard guard(ranks_[0].device);
      status = CudaCheck(cudaEventSynchronize(p.event), "KV peer copy");
    }
    {
      absl::MutexLock lock(&mu_);
      free_events_.push_back(p.event);
    }
    p.peer.reset();
    p.done(status);
  }
}

int64_t CudaKvPeerLane::kernel_copies() const {
  absl::MutexLock lock(&mu_);
  return kernel_copies_;
}

int64_t CudaKvPeerLane::engine_copies() const {
  absl::MutexLock lock(&mu_);
  return engine_copies_;
}

}  // namespace trident::backend
