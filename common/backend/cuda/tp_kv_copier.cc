#include "common/backend/cuda/tp_kv_copier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_util.h"
#include "common/status/status_macros.h"

namespace trident::backend {

absl::StatusOr<std::unique_ptr<TensorParallelKvCopier>> TensorParallelKvCopier::Create(
    model::KvView view, std::vector<RankPool> ranks) {
  if (static_cast<int32_t>(ranks.size()) != view.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV view of ", view.size(), " ranks given ", ranks.size(), " pools"));
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (ranks[r].base == nullptr || ranks[r].bytes < view.rank_spec().TotalBytes()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r,
                                                     "'s KV pool is smaller than its spec's ",
                                                     view.rank_spec().TotalBytes(), " bytes"));
    }
  }
  std::unique_ptr<TensorParallelKvCopier> copier(
      new TensorParallelKvCopier(std::move(view), std::move(ranks)));
  DeviceGuard restore(copier->ranks_[0].device);
  absl::MutexLock to(&copier->to_host_mu_);
  absl::MutexLock from(&copier->from_host_mu_);
  for (const RankPool& pool : copier->ranks_) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(pool.device), "cudaSetDevice"));
    for (auto* streams : {&copier->to_host_, &copier->from_host_}) {
      cudaStream_t stream = nullptr;
      TRIDENT_RETURN_IF_ERROR(
          CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "KV copy stream"));
      streams->push_back(stream);
    }
  }
  return copier;
}

TensorParallelKvCopier::~TensorParallelKvCopier() {
  DeviceGuard restore(ranks_[0].device);
  absl::MutexLock to(&to_host_mu_);
  absl::MutexLock from(&from_host_mu_);
  for (auto* streams : {&to_host_, &from_host_}) {
    for (size_t r = 0; r < streams->size(); ++r) {
      cudaSetDevice(ranks_[r].device);
      cudaStreamSynchronize((*streams)[r]);
      cudaStreamDestroy((*streams)[r]);
    }
  }
}

absl::StatusOr<std::unique_ptr<HostBuffer>> TensorParallelKvCopier::AllocateHost(
    size_t size_bytes) {
  DeviceGuard guard(ranks_[0].device);
  TRIDENT_RETURN_IF_ERROR(guard.status());
  return AllocatePinnedHost(size_bytes);
}

absl::Status TensorParallelKvCopier::Copy(absl::Span<const KvRange> ranges, char* host,
                                          bool to_host, const std::vector<cudaStream_t>& streams) {
  TRIDENT_RETURN_IF_ERROR(CheckKvRanges(ranges, view_.spec().TotalBytes()));
  DeviceGuard restore(ranks_[0].device);
  std::vector<bool> used(ranks_.size(), false);
  absl::Status status;
  uint64_t host_at = 0;
  for (const KvRange& range : ranges) {
    absl::StatusOr<std::vector<model::KvViewPiece>> pieces =
        view_.Map(range.offset_bytes, range.length_bytes, /*write=*/!to_host);
    if (!pieces.ok()) {
      status = pieces.status();
      break;
    }
    for (const model::KvViewPiece& p : *pieces) {
      const RankPool& pool = ranks_[p.rank];
      char* h = host + host_at + (p.view_offset - range.offset_bytes);
      char* d = pool.base + p.rank_offset;
      status.Update(CudaCheck(cudaSetDevice(pool.device), "cudaSetDevice"));
      if (!status.ok()) break;
      status.Update(CudaCheck(
          to_host ? cudaMemcpyAsync(h, d, p.bytes, cudaMemcpyDeviceToHost, streams[p.rank])
                  : cudaMemcpyAsync(d, h, p.bytes, cudaMemcpyHostToDevice, streams[p.rank]),
          to_host ? "KV copy to host" : "KV copy from host"));
      used[p.rank] = true;
    }
    host_at += range.length_bytes;
    if (!status.ok()) break;
  }
  // Every copy enqueued ends before the call does (even after a failure).
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!used[r]) continue;
    cudaSetDevice(ranks_[r].device);
    status.Update(CudaCheck(cudaStreamSynchronize(streams[r]), "KV copy"));
  }
  return status;
}

absl::Status TensorParallelKvCopier::CopyToHost(absl::Span<const KvRange> ranges, void* dst) {
  absl::MutexLock lock(&to_host_mu_);
  return Copy(ranges, static_cast<char*>(dst), /*to_host=*/true, to_host_);
}

absl::Status TensorParallelKvCopier::CopyFromHost(const void* src,
                                                  absl::Span<const KvRange> ranges) {
  absl::MutexLock lock(&from_host_mu_);
  return Copy(ranges, const_cast<char*>(static_cast<const char*>(src)), /*to_host=*/false,
              from_host_);
}

}  // namespace trident::backend
