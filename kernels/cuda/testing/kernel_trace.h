// A trace of the kernels a process runs on its GPUs, through CUPTI's
// activity records (each kernel's start and end on the device's clock,
// graph replays and programmatic dependent launches included, without
// serializing them). One trace at a time per process.

#ifndef TRIDENT_KERNELS_CUDA_TESTING_KERNEL_TRACE_H_
#define TRIDENT_KERNELS_CUDA_TESTING_KERNEL_TRACE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/testing/kernel_profile.h"

namespace trident::kernels::cuda::testing {

class KernelTrace {
 public:
  // Starts recording; fails where another trace is running or CUPTI is
  // unavailable.
  static absl::StatusOr<std::unique_ptr<KernelTrace>> Start();
  ~KernelTrace();
  KernelTrace(const KernelTrace&) = delete;
  KernelTrace& operator=(const KernelTrace&) = delete;

  // Now, on the records' clock (to mark step boundaries; take it after the
  // work before it has finished).
  uint64_t Now() const;

  // Stops recording and returns the kernels that ended since Start().
  absl::StatusOr<std::vector<KernelRecord>> Stop();

 private:
  KernelTrace() = default;
  bool stopped_ = false;
};

}  // namespace trident::kernels::cuda::testing

#endif  // TRIDENT_KERNELS_CUDA_TESTING_KERNEL_TRACE_H_
