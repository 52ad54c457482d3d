#include "common/backend/cuda/cuda_kv_copier.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_util.h"
#include "common/status/status_macros.h"

namespace trident::backend {
namespace {

// `ranges` with neighbours that are adjacent in the pool merged (they are
// adjacent on the host side too: host bytes are back to back).
std::vector<KvRange> Coalesce(absl::Span<const KvRange> ranges) {
  std::vector<KvRange> out;
  out.reserve(ranges.size());
  for (const KvRange& r : ranges) {
    if (!out.empty() && out.back().offset_bytes + out.back().length_bytes == r.offset_bytes) {
      out.back().length_bytes += r.length_bytes;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

// One direction's stream, and for copies from host its bounce buffers with
// an event each (recorded after the copy that reads the buffer).
struct CudaKvCopier::Direction {
  cudaStream_t stream = nullptr;
  std::vector<void*> bounce;
  std::vector<cudaEvent_t> events;

  ~Direction() {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    for (void* b : bounce) cudaFreeHost(b);
  }

  absl::Status Init(int32_t num_bounce, size_t bounce_bytes) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                      "cudaStreamCreateWithFlags"));
    for (int32_t i = 0; i < num_bounce; ++i) {
      void* b = nullptr;
      if (cudaHostAlloc(&b, bounce_bytes, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();  // Clears the (non-sticky) allocation error.
        return absl::ResourceExhaustedError(absl::StrCat(
            "cannot allocate ", bounce_bytes, " bytes of pinned host memory (bounce buffer)"));
      }
      bounce.push_back(b);
      cudaEvent_t e = nullptr;
      TRIDENT_RETURN_IF_ERROR(
          CudaCheck(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate"));
      events.push_back(e);
    }
    return absl::OkStatus();
  }
};

CudaKvCopier::CudaKvCopier(const KvMemory& memory, const CudaKvCopierOptions& options,
                           std::unique_ptr<Direction> to_host, std::unique_ptr<Direction> from_host)
    : base_(static_cast<char*>(memory.base)),
      bytes_(memory.bytes),
      device_(memory.device_ordinal),
      options_(options),
      to_host_(std::move(to_host)),
      from_host_(std::move(from_host)) {}

CudaKvCopier::~CudaKvCopier() {
  // The Directions' destructors free their streams and buffers on our device.
  DeviceGuard guard(device_);
}

absl::StatusOr<std::unique_ptr<CudaKvCopier>> CudaKvCopier::Create(const KvMemory& memory,
                                                                   CudaKvCopierOptions options) {
  if (!memory.device || memory.base == nullptr || memory.bytes == 0) {
    return absl::InvalidArgumentError(
        "CudaKvCopier needs a KV pool in device memory (KvMemory.device, base and bytes set)");
  }
  const bool bounce = options.from_host == CudaKvCopierOptions::FromHost::kPinnedBounce;
  if (bounce && (options.bounce_buffers < 1 || options.bounce_buffer_bytes == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaKvCopierOptions: ", options.bounce_buffers, " bounce buffers of ",
                     options.bounce_buffer_bytes, " bytes; need at least one of > 0 bytes"));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || memory.device_ordinal < 0 ||
      memory.device_ordinal >= count) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", memory.device_ordinal, " not present (", count, " devices)"));
  }
  DeviceGuard guard(memory.device_ordinal);
  TRIDENT_RETURN_IF_ERROR(guard.status());
  auto to_host = std::make_unique<Direction>();
  TRIDENT_RETURN_IF_ERROR(to_host->Init(0, 0));
  auto from_host = std::make_unique<Direction>();
  TRIDENT_RETURN_IF_ERROR(
      from_host->Init(bounce ? options.bounce_buffers : 0, options.bounce_buffer_bytes));
  return std::unique_ptr<CudaKvCopier>(
      new CudaKvCopier(memory, options, std::move(to_host), std::move(from_host)));
}

absl::StatusOr<std::unique_ptr<HostBuffer>> CudaKvCopier::AllocateHost(size_t size_bytes) {
  DeviceGuard guard(device_);
  TRIDENT_RETURN_IF_ERROR(guard.status());
  return AllocatePinnedHost(size_bytes);
}

absl::Status CudaKvCopier::CopyToHost(absl::Span<const KvRange> ranges, void* dst) {
  TRIDENT_RETURN_IF_ERROR(CheckKvRanges(ranges, bytes_));
  absl::MutexLock lock(&to_host_mu_);
  DeviceGuard guard(device_);
  TRIDENT_RETURN_IF_ERROR(guard.status());
  const cudaStream_t stream = to_host_->stream;
  absl::Status status;
  char* out = static_cast<char*>(dst);
  for (const KvRange& r : Coalesce(ranges)) {
    status = CudaCheck(cudaMemcpyAsync(out, base_ + r.offset_bytes, r.length_bytes,
                                       cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpyAsync (KV to host)");
    if (!status.ok()) break;
    out += r.length_bytes;
  }
  // Wait even after an error: nothing may still write `dst` when we return.
  const absl::Status synced =
      CudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize (KV to host)");
  return status.ok() ? synced : status;
}

absl::Status CudaKvCopier::CopyFromHost(const void* src, absl::Span<const KvRange> ranges) {
  TRIDENT_RETURN_IF_ERROR(CheckKvRanges(ranges, bytes_));
  absl::MutexLock lock(&from_host_mu_);
  DeviceGuard guard(device_);
  TRIDENT_RETURN_IF_ERROR(guard.status());
  Direction& d = *from_host_;
  const char* in = static_cast<const char*>(src);
  absl::Status status;
  if (options_.from_host == CudaKvCopierOptions::FromHost::kPageable) {
    for (const KvRange& r : Coalesce(ranges)) {
      status = CudaCheck(cudaMemcpyAsync(base_ + r.offset_bytes, in, r.length_bytes,
                                         cudaMemcpyHostToDevice, d.stream),
                         "cudaMemcpyAsync (KV from host)");
      if (!status.ok()) break;
      in += r.length_bytes;
    }
  } else {
    // Chunks go round the bounce buffers; a buffer is refilled once the copy
    // that last read it (its event) is done. Every event of the previous call
    // completed before it returned, so any buffer may come first.
    const size_t chunk = options_.bounce_buffer_bytes;
    size_t next = 0;
    for (const KvRange& r : Coalesce(ranges)) {
      for (uint64_t done = 0; done < r.length_bytes && status.ok();) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, r.length_bytes - done));
        status = CudaCheck(cudaEventSynchronize(d.events[next]), "cudaEventSynchronize");
        if (!status.ok()) break;
        std::memcpy(d.bounce[next], in, n);
        status = CudaCheck(cudaMemcpyAsync(base_ + r.offset_bytes + done, d.bounce[next], n,
                                           cudaMemcpyHostToDevice, d.stream),
                           "cudaMemcpyAsync (KV from host)");
        if (!status.ok()) break;
        status = CudaCheck(cudaEventRecord(d.events[next], d.stream), "cudaEventRecord");
        next = (next + 1) % d.bounce.size();
        in += n;
        done += n;
      }
      if (!status.ok()) break;
    }
  }
  // Wait even after an error: the bounce buffers and `src` must be free
  // when we return, and later work on the pool must see the bytes.
  const absl::Status synced =
      CudaCheck(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize (KV from host)");
  return status.ok() ? synced : status;
}

}  // namespace trident::backend
