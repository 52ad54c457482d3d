// Small CUDA helpers the backend and its KV copiers share: a runtime error
// as a Status, the thread's current device restored on scope exit, and
// portable pinned host memory as a HostBuffer.

#ifndef TRIDENT_COMMON_BACKEND_CUDA_CUDA_UTIL_H_
#define TRIDENT_COMMON_BACKEND_CUDA_CUDA_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/backend/kv_copier.h"

namespace trident::backend {

inline absl::Status CudaCheck(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(err)));
}

// Makes `device` current on this thread, and restores the thread's previous
// device when it ends (also after the scope switched to other devices).
class DeviceGuard {
 public:
  explicit DeviceGuard(int32_t device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = CudaCheck(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// `size_bytes` (> 0) of page-locked host memory usable from any device.
// INVALID_ARGUMENT for 0; RESOURCE_EXHAUSTED when it cannot be had.
inline absl::StatusOr<std::unique_ptr<HostBuffer>> AllocatePinnedHost(size_t size_bytes) {
  if (size_bytes == 0) return absl::InvalidArgumentError("AllocateHost of 0 bytes");
  void* data = nullptr;
  if (cudaHostAlloc(&data, size_bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", size_bytes, " bytes of pinned host memory"));
  }
  return std::make_unique<HostBuffer>(data, size_bytes, [](void* p) { cudaFreeHost(p); });
}

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_CUDA_CUDA_UTIL_H_
