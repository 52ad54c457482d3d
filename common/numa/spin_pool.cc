#include "common/numa/spin_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/logging/log.h"
#include "common/numa/numa_topology.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace trident::numa {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "futex words are plain 32-bit integers");

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

void FutexWait(const std::atomic<uint32_t>& word, uint32_t expected) {
  // Returns at once (EAGAIN) if `word` no longer holds `expected`; spurious
  // returns are fine, the caller re-checks.
  syscall(SYS_futex, reinterpret_cast<const uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
          nullptr, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

// Spinning checks the clock every kSpinsPerClockCheck pauses (a pause is
// 10-140 cycles, so about every 1-4 us) and yields the CPU every
// kSpinsPerYield (tens of microseconds): alone on its core a spinner pays one
// cheap syscall there, and a thread sharing the core (an oversubscribed host,
// the unpinned caller, a test) waits microseconds instead of a time slice.
constexpr int kSpinsPerClockCheck = 64;
constexpr int kSpinsPerYield = 1024;

absl::StatusOr<cpu_set_t> CallerAffinity() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  return mask;
}

absl::Status ValidateOptions(const SpinPoolOptions& options) {
  if (options.cpus.empty()) return absl::InvalidArgumentError("SpinPool: no CPUs given");
  if (options.spin_window < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SpinPool: spin_window ", absl::FormatDuration(options.spin_window), " is negative"));
  }
  absl::StatusOr<cpu_set_t> mask = CallerAffinity();
  if (!mask.ok()) return mask.status();
  const int allowed = CPU_COUNT(&*mask);
  if (static_cast<int>(options.cpus.size()) > allowed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SpinPool: ", options.cpus.size(), " threads asked for, but the affinity mask holds only ",
        allowed, " CPUs (one thread per CPU)"));
  }
  std::set<int> seen;
  for (int cpu : options.cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &*mask)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SpinPool: CPU ", cpu, " is not in the affinity mask"));
    }
    if (!seen.insert(cpu).second) {
      return absl::InvalidArgumentError(absl::StrCat("SpinPool: CPU ", cpu, " given twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

SpinPool::SpinPool(std::vector<int> cpus, absl::Duration spin_window)
    : cpus_(std::move(cpus)), spin_window_(spin_window) {}

absl::StatusOr<std::unique_ptr<SpinPool>> SpinPool::Create(SpinPoolOptions options) {
  if (absl::Status valid = ValidateOptions(options); !valid.ok()) return valid;
  std::unique_ptr<SpinPool> pool(new SpinPool(options.cpus, options.spin_window));
  const int n = pool->num_threads();
  // Shared with the workers: the last of them may still be inside
  // DecrementCount when Wait returns here.
  struct Startup {
    explicit Startup(int n) : started(n), errors(n, 0) {}
    absl::BlockingCounter started;
    std::vector<int> errors;  // errno of each worker's binding, 0 if bound.
  };
  auto startup = std::make_shared<Startup>(n);
  pool->workers_.reserve(n);
  for (int i = 0; i < n; ++i) {
    const std::string name = absl::StrCat(options.name, "/", i).substr(0, 15);
    pool->workers_.emplace_back([pool = pool.get(), i, name, startup] {
      pthread_setname_np(pthread_self(), name.c_str());
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(pool->cpus_[i], &one);
      if (sched_setaffinity(0, sizeof(one), &one) != 0) startup->errors[i] = errno;
      startup->started.DecrementCount();
      pool->WorkerLoop(i);
    });
  }
  startup->started.Wait();
  for (int i = 0; i < n; ++i) {
    if (startup->errors[i] != 0) {
      return absl::InternalError(absl::StrCat("SpinPool: binding worker ", i, " to CPU ",
                                              pool->cpus_[i], ": ",
                                              std::strerror(startup->errors[i])));
    }
  }
  TRIDENT_LOG(INFO) << "SpinPool " << options.name << ": " << n << " workers on CPUs "
                    << absl::StrJoin(pool->cpus_, ",") << ", spin window "
                    << absl::FormatDuration(pool->spin_window_);
  return pool;
}

absl::StatusOr<std::unique_ptr<SpinPool>> SpinPool::CreateOnNode(const NumaTopology& topology,
                                                                 int node, int num_threads,
                                                                 absl::Duration spin_window) {
  absl::StatusOr<std::vector<int>> cores = topology.PhysicalCores(node);
  if (!cores.ok()) return cores.status();
  if (num_threads < 0 || num_threads > static_cast<int>(cores->size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("SpinPool: ", num_threads, " threads asked for on NUMA node ", node,
                     ", which has ", cores->size(), " physical cores in the affinity mask (CPUs ",
                     absl::StrJoin(*cores, ","), "; SMT siblings are not used)"));
  }
  if (num_threads > 0) cores->resize(num_threads);
  SpinPoolOptions options;
  options.cpus = *std::move(cores);
  options.spin_window = spin_window;
  options.name = absl::StrCat("spin", node);
  return Create(std::move(options));
}

SpinPool::~SpinPool() { Stop(); }

void SpinPool::Stop() {
  stopping_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (num_sleeping_.load(std::memory_order_seq_cst) > 0) FutexWakeAll(generation_);
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
}

void SpinPool::WaitForChange(const std::atomic<uint32_t>& word, uint32_t seen,
                             std::atomic<int>& sleepers, bool count_sleeps) {
  if (spin_window_ > absl::ZeroDuration()) {
    const bool forever = spin_window_ == absl::InfiniteDuration();
    const auto deadline =
        std::chrono::steady_clock::now() +
        (forever ? std::chrono::nanoseconds(0) : absl::ToChronoNanoseconds(spin_window_));
    for (int spins = 1;; ++spins) {
      if (word.load(std::memory_order_acquire) != seen) return;
      CpuRelax();
      if (spins % kSpinsPerClockCheck != 0) continue;
      if (spins % kSpinsPerYield == 0) sched_yield();
      if (!forever && std::chrono::steady_clock::now() >= deadline) break;
    }
  }
  // The waker changes `word`, then wakes if it sees a sleeper; a sleeper
  // counts itself, then waits only while `word` is unchanged (the futex
  // re-checks in the kernel). Both sides are seq_cst, so at least one of them
  // sees the other: no wake-up is lost.
  while (word.load(std::memory_order_seq_cst) == seen) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (count_sleeps) num_worker_sleeps_.fetch_add(1, std::memory_order_relaxed);
    if (word.load(std::memory_order_seq_cst) == seen) FutexWait(word, seen);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void SpinPool::WorkerLoop(int index) {
  uint32_t seen = 0;
  for (;;) {
    WaitForChange(generation_, seen, num_sleeping_, /*count_sleeps=*/true);
    // Run bumps the generation only once every worker finished the last job,
    // so this is exactly one past `seen`.
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_.load(std::memory_order_relaxed)) return;
    (*job_)(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      finished_.store(seen, std::memory_order_seq_cst);
      if (caller_sleeping_.load(std::memory_order_seq_cst) > 0) FutexWakeAll(finished_);
    }
  }
}

void SpinPool::Run(absl::FunctionRef<void(int thread_index)> fn) {
  absl::MutexLock lock(&run_mu_);
  job_ = &fn;
  pending_.store(num_threads(), std::memory_order_relaxed);
  const uint32_t previous = generation_.fetch_add(1, std::memory_order_seq_cst);
  if (num_sleeping_.load(std::memory_order_seq_cst) > 0) FutexWakeAll(generation_);
  WaitForChange(finished_, previous, caller_sleeping_, /*count_sleeps=*/false);
  job_ = nullptr;
}

}  // namespace trident::numa
