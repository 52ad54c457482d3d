// OpenMP thread setup for the CPU kernels: how many threads, and which CPU
// each one runs on.
//
//   TRIDENT_RETURN_IF_ERROR(cpu::ConfigureCpuThreads(/*num_threads=*/0, /*pin=*/true));
//   ... every later `#pragma omp parallel` (and oneDNN) on this thread uses
//   cpu::CpuThreadCount() threads, thread i on CPU placement.cpus[i].
//
// OpenMP (libgomp) keeps one thread pool per thread that opens parallel
// regions, so configure from the thread that will run the kernels (the engine
// thread); regions opened from other threads get their own, unpinned pool.

#ifndef TRIDENT_COMMON_CPU_THREADS_H_
#define TRIDENT_COMMON_CPU_THREADS_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trident::cpu {

// The CPUs of this process's affinity mask (sched_getaffinity), ordered for
// thread placement: first the lowest-numbered CPU of every physical core, in
// CPU order, then the remaining SMT siblings in CPU order.
struct CpuPlacement {
  std::vector<int> cpus;       // Every CPU of the mask, exactly once.
  int num_physical_cores = 0;  // Cores with at least one CPU in the mask.
};

// Reads the mask and /sys topology (a CPU whose topology cannot be read counts
// as its own core). kInternal if sched_getaffinity fails.
absl::StatusOr<CpuPlacement> GetCpuPlacement();

// Sets the OpenMP thread count to `num_threads`, or to one per physical core of
// the affinity mask when it is 0, and disables dynamic adjustment. With `pin`,
// thread i of the calling thread's OpenMP pool (the caller itself is thread 0)
// is bound to CPU `GetCpuPlacement()->cpus[i]` (sched_setaffinity from inside a
// parallel region); the mapping is logged. Later calls reconfigure, starting
// from the affinity mask the first call saw (pinning narrows the caller's).
// Without `pin`, threads keep whatever binding they already have.
//
// Returns kInvalidArgument if `num_threads` is negative, or if `pin` is set and
// `num_threads` exceeds the CPUs in the mask (two threads would share a CPU);
// kInternal if the mask cannot be read or a thread cannot be bound.
absl::Status ConfigureCpuThreads(int num_threads, bool pin);

// The number of threads the next parallel region of the calling thread uses
// (omp_get_max_threads()).
int CpuThreadCount();

}  // namespace trident::cpu

#endif  // TRIDENT_COMMON_CPU_THREADS_H_
