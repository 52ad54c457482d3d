// Where a repeated step's device time goes, from a kernel trace (start and
// end of every kernel, as CUPTI's activity records give them): per step, the
// span from the first kernel's start to the last one's end, the time some
// kernel ran, and each kernel's exposed time, the part of it no kernel
// ahead of it covers. With programmatic dependent launch a kernel starts
// early and waits; its exposed time is what it adds to the critical path,
// its duration includes the wait. A decoder's steps repeat one layer's
// kernels: those are folded into one row per position in the layer, the
// mean over layers and steps.

#ifndef TRIDENT_KERNELS_CUDA_TESTING_KERNEL_PROFILE_H_
#define TRIDENT_KERNELS_CUDA_TESTING_KERNEL_PROFILE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace trident::kernels::cuda::testing {

struct KernelRecord {
  std::string name;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

// One kernel's mean cost per occurrence, in µs.
struct KernelCost {
  std::string name;
  double exposed_us = 0;
  double duration_us = 0;
};

struct StepProfile {
  int steps = 0;
  int kernels_per_step = 0;
  double wall_us = 0;  // mean from one step's boundary to the next
  double span_us = 0;  // mean first start to last end
  double busy_us = 0;  // mean time at least one kernel ran
  // Kernels per layer (0: no repeat of `layers` or `layers` - 1 layers was
  // found, and every kernel is in `before`). Where only `layers` - 1 repeat,
  // the odd layer's kernels are in `before` or `after`.
  int layer_kernels = 0;
  std::vector<KernelCost> before;  // the kernels ahead of the layers
  std::vector<KernelCost> layer;   // one per position in a layer
  std::vector<KernelCost> after;   // the kernels past the layers
};

// The records of steps[i] are those that start in [boundaries[i],
// boundaries[i + 1]); boundaries holds steps + 1 times on the records'
// clock. Every step must run the same kernels in the same order.
absl::StatusOr<StepProfile> ProfileSteps(std::vector<KernelRecord> records,
                                         const std::vector<uint64_t>& boundaries, int layers);

// A table of the profile, one row per kernel (Markdown).
std::string FormatStepProfile(const StepProfile& profile);

// A kernel's name without namespaces, its return type and its parameter
// list, demangled where it is a mangled C++ name, at most 72 characters.
std::string ShortKernelName(std::string_view name);

}  // namespace trident::kernels::cuda::testing

#endif  // TRIDENT_KERNELS_CUDA_TESTING_KERNEL_PROFILE_H_
