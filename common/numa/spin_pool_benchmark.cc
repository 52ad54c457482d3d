// Dispatch latency of an empty fork-join: SpinPool::Run with workers hot
// (spinning within their window) against a condition-variable pool with the
// same pinned workers, in the same run. Time per iteration is one Run: wake
// every worker, run an empty job on each, and see that all finished. Rows
// take the number of workers; the benchmark thread itself is pinned to the
// node's first physical core and the workers to the following ones, so no
// two of them share a core. Variants:
//   BM_SpinPoolHot         spin_window 5 ms: workers never block between runs
//   BM_SpinPoolAsleep      spin_window 0: every run wakes workers from a futex
//   BM_CondVarPool         std::mutex + std::condition_variable baseline
// A row is skipped when the node has too few physical cores for it.

#include <sched.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "common/numa/numa_topology.h"
#include "common/numa/spin_pool.h"

namespace trident::numa {
namespace {

// The node's first physical core, for the benchmark thread, then one core
// per worker; empty if the node has too few.
std::vector<int> PickCpus(int num_workers) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  if (!topology.ok()) return {};
  absl::StatusOr<std::vector<int>> cores = topology->PhysicalCores(topology->DefaultNode());
  if (!cores.ok() || static_cast<int>(cores->size()) < num_workers + 1) return {};
  cores->resize(num_workers + 1);
  return *std::move(cores);
}

void PinCaller(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  sched_setaffinity(0, sizeof(one), &one);
}

// Undoes PinCaller (the kernel intersects the mask with the CPUs allowed).
void UnpinCaller() {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &all);
  sched_setaffinity(0, sizeof(all), &all);
}

void RunSpinPool(benchmark::State& state, absl::Duration spin_window) {
  const std::vector<int> cpus = PickCpus(static_cast<int>(state.range(0)));
  if (cpus.empty()) {
    state.SkipWithError("too few physical cores on the node");
    return;
  }
  absl::StatusOr<std::unique_ptr<SpinPool>> pool = SpinPool::Create(
      {.cpus = {cpus.begin() + 1, cpus.end()}, .spin_window = spin_window, .name = "bench"});
  if (!pool.ok()) {
    state.SkipWithError(pool.status().ToString().c_str());
    return;
  }
  PinCaller(cpus[0]);
  (*pool)->Run([](int) {});  // Workers are up and past their first wake-up.
  const int64_t sleeps_before = (*pool)->num_worker_sleeps();
  for (auto _ : state) (*pool)->Run([](int) {});
  state.counters["worker_sleeps_per_run"] =
      benchmark::Counter(static_cast<double>((*pool)->num_worker_sleeps() - sleeps_before) /
                         static_cast<double>(state.iterations()));
  UnpinCaller();
}

void BM_SpinPoolHot(benchmark::State& state) { RunSpinPool(state, absl::Milliseconds(5)); }
void BM_SpinPoolAsleep(benchmark::State& state) { RunSpinPool(state, absl::ZeroDuration()); }

// The baseline: the textbook pool. Workers wait on a condition variable for
// a new generation; the caller waits on another for the last one to finish.
class CondVarPool {
 public:
  explicit CondVarPool(const std::vector<int>& cpus) {
    for (size_t i = 0; i < cpus.size(); ++i) {
      workers_.emplace_back([this, i, cpu = cpus[i]] {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        sched_setaffinity(0, sizeof(one), &one);
        Loop(static_cast<int>(i));
      });
    }
  }

  ~CondVarPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      ++generation_;
    }
    work_.notify_all();
    for (std::thread& worker : workers_) worker.join();
  }

  void Run(const std::function<void(int)>& fn) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &fn;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
    work_.notify_all();
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void Loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      work_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stopping_) return;
      const std::function<void(int)>* job = job_;
      lock.unlock();
      (*job)(index);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::condition_variable done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

void BM_CondVarPool(benchmark::State& state) {
  const std::vector<int> cpus = PickCpus(static_cast<int>(state.range(0)));
  if (cpus.empty()) {
    state.SkipWithError("too few physical cores on the node");
    return;
  }
  const std::function<void(int)> empty = [](int) {};
  {
    CondVarPool pool({cpus.begin() + 1, cpus.end()});
    PinCaller(cpus[0]);
    pool.Run(empty);
    for (auto _ : state) pool.Run(empty);
  }
  UnpinCaller();
}

void WorkerCounts(benchmark::internal::Benchmark* benchmark) {
  for (int workers : {1, 2, 4, 8, 15, 31, 63}) benchmark->Arg(workers);
  benchmark->ArgName("workers")->UseRealTime();
}

BENCHMARK(BM_SpinPoolHot)->Apply(WorkerCounts);
BENCHMARK(BM_SpinPoolAsleep)->Apply(WorkerCounts);
BENCHMARK(BM_CondVarPool)->Apply(WorkerCounts);

}  // namespace
}  // namespace trident::numa
