#ifndef TRIDENT_COMMON_NUMA_SPIN_POOL_H_
#define TRIDENT_COMMON_NUMA_SPIN_POOL_H_

// A fixed set of worker threads, each pinned to one CPU, that run one
// function on every thread index per call: the fork-join shape of a per-layer
// decode-attention kernel.
//
//   TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<numa::SpinPool> pool,
//                            numa::SpinPool::CreateOnNode(topology, node));
//   pool->Run([&](int thread) { AttendSlice(thread, pool->num_threads()); });
//
// Who runs what: all N indices run on the pool's own threads; the caller only
// waits. The attention service calls Run from its UCX progress thread, which
// is not one of the pinned cores, so it cannot usefully take an index.
//
// Waiting: after a job a worker spins (with _mm_pause) on a generation
// counter for `spin_window` and only then blocks in the kernel (futex), so
// back-to-back layers never pay a sleep and a wake-up (tens of microseconds
// each). A spinning thread yields its CPU (sched_yield) every few tens of
// microseconds, so a thread sharing its core is not starved for a whole time
// slice. A worker that has blocked is woken by the next Run, which then costs
// one futex wake. The caller waits for the workers the same way: it spins for
// `spin_window`, then blocks until the last worker wakes it. Spinning burns
// its core, so a window longer than the gap between layers but far shorter
// than the gap between requests is the aim (5 ms by default, after vLLM's
// KMP_BLOCKTIME lesson: 1 ms slept too often).
//
// Threading: Run is thread-safe; concurrent calls are serialized by a mutex
// (one job at a time). `fn` must not call Run on the same pool (deadlock).
// Lifetime: the destructor wakes and joins every worker; it must not run
// while a Run is in progress.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/numa/numa_topology.h"

namespace trident::numa {

struct SpinPoolOptions {
  // One worker per entry, worker i bound to CPU cpus[i] alone. The CPUs must
  // be distinct and allowed by the affinity mask of the creating thread. Pass
  // one CPU per physical core (NumaTopology::PhysicalCores): two spinning
  // workers on SMT siblings of one core slow each other down.
  std::vector<int> cpus;
  // How long an idle worker (and a waiting caller) spins before blocking.
  // Zero: block at once (no spinning at all). absl::InfiniteDuration(): never
  // block.
  absl::Duration spin_window = absl::Milliseconds(5);
  // Worker threads are named "<name>/<index>" (truncated to the kernel's 15
  // characters).
  std::string name = "spin";
};

class SpinPool {
 public:
  // Starts one worker per CPU of `options.cpus` and waits until each has bound
  // itself to its CPU. kInvalidArgument if `cpus` is empty, holds a CPU twice
  // or a CPU outside the creating thread's affinity mask (in particular when
  // it asks for more threads than the mask has CPUs), or if `spin_window` is
  // negative; kInternal if a worker cannot bind itself (no thread is left
  // running then).
  static absl::StatusOr<std::unique_ptr<SpinPool>> Create(SpinPoolOptions options);

  // A pool on the first `num_threads` physical cores of `node`
  // (topology.PhysicalCores), or on every one when `num_threads` is 0.
  // kInvalidArgument if the node does not exist, `num_threads` is negative
  // or exceeds the node's allowed physical cores (SMT siblings are never
  // used); kFailedPrecondition if the mask allows no CPU of the node; and
  // Create's errors.
  static absl::StatusOr<std::unique_ptr<SpinPool>> CreateOnNode(
      const NumaTopology& topology, int node, int num_threads = 0,
      absl::Duration spin_window = absl::Milliseconds(5));

  SpinPool(const SpinPool&) = delete;
  SpinPool& operator=(const SpinPool&) = delete;
  ~SpinPool();

  // Runs fn(i) once for every i in [0, num_threads()), fn(i) on worker i, and
  // returns when all have returned. Everything fn wrote is visible to the
  // caller afterwards, and everything the caller wrote before Run is visible
  // to fn. `fn` must not throw.
  void Run(absl::FunctionRef<void(int thread_index)> fn) ABSL_LOCKS_EXCLUDED(run_mu_);

  int num_threads() const { return static_cast<int>(cpus_.size()); }
  // threads()[i] is the CPU worker i is bound to.
  const std::vector<int>& threads() const { return cpus_; }
  absl::Duration spin_window() const { return spin_window_; }

  // How many times a worker has gone to block in the kernel since creation
  // (entered the futex wait, whether or not it then slept), and how many
  // workers are in (or entering) that wait now. For tests and benchmarks.
  int64_t num_worker_sleeps() const { return num_worker_sleeps_.load(); }
  int num_sleeping_workers_for_testing() const { return num_sleeping_.load(); }

 private:
  SpinPool(std::vector<int> cpus, absl::Duration spin_window);

  void WorkerLoop(int index);
  // Returns once `word` differs from `seen`: spins for `spin_window_`, then
  // blocks on the futex of `word`. `sleepers` counts the waiters blocking.
  void WaitForChange(const std::atomic<uint32_t>& word, uint32_t seen, std::atomic<int>& sleepers,
                     bool count_sleeps);
  void Stop();

  const std::vector<int> cpus_;
  const absl::Duration spin_window_;

  absl::Mutex run_mu_;  // Serializes Run.

  // Written by Run before it bumps `generation_`; read by workers after.
  const absl::FunctionRef<void(int)>* job_ = nullptr;
  std::atomic<bool> stopping_{false};

  // Each hot word on its own cache line: workers poll `generation_` while the
  // last of them writes `finished_`.
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
  alignas(64) std::atomic<uint32_t> finished_{0};
  alignas(64) std::atomic<int> num_sleeping_{0};  // Workers blocked on `generation_`.
  std::atomic<int> caller_sleeping_{0};           // 1 while Run blocks on `finished_`.
  std::atomic<int64_t> num_worker_sleeps_{0};

  std::vector<std::thread> workers_;
};

}  // namespace trident::numa

#endif  // TRIDENT_COMMON_NUMA_SPIN_POOL_H_
