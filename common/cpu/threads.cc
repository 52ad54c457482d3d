#include "common/cpu/threads.h"

#include <omp.h>
#include <sched.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging/log.h"

namespace trident::cpu {
namespace {

bool ReadInt(const std::string& path, int* value) {
  std::ifstream in(path);
  std::string text;
  return in && std::getline(in, text) && absl::SimpleAtoi(text, value);
}

}  // namespace

absl::StatusOr<CpuPlacement> GetCpuPlacement() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  CpuPlacement placement;
  std::vector<int> siblings;
  std::map<std::pair<int, int>, int> cores;  // (package, core) -> first CPU.
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/");
    int package = 0;
    int core = 0;
    if (!ReadInt(dir + "physical_package_id", &package) || !ReadInt(dir + "core_id", &core)) {
      // Unknown topology: a core of its own, keyed apart from every real core.
      package = -1;
      core = cpu;
    }
    if (cores.emplace(std::make_pair(package, core), cpu).second) {
      placement.cpus.push_back(cpu);
    } else {
      siblings.push_back(cpu);
    }
  }
  placement.num_physical_cores = static_cast<int>(placement.cpus.size());
  placement.cpus.insert(placement.cpus.end(), siblings.begin(), siblings.end());
  return placement;
}

absl::Status ConfigureCpuThreads(int num_threads, bool pin) {
  if (num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConfigureCpuThreads: num_threads is ", num_threads, "; want >= 0"));
  }
  // Pinning narrows the caller's own mask to one CPU, so a later call starts
  // again from the mask the first call saw.
  static absl::Mutex mu(absl::kConstInit);
  static CpuPlacement* initial_placement ABSL_GUARDED_BY(mu) = nullptr;
  absl::StatusOr<CpuPlacement> placement;
  {
    absl::MutexLock lock(&mu);
    if (initial_placement == nullptr) {
      placement = GetCpuPlacement();
      if (!placement.ok()) return placement.status();
      initial_placement = new CpuPlacement(*placement);
    }
    placement = *initial_placement;
  }
  const int num_cpus = static_cast<int>(placement->cpus.size());
  const int n = num_threads == 0 ? placement->num_physical_cores : num_threads;
  if (pin && n > num_cpus) {
    return absl::InvalidArgumentError(absl::StrCat("ConfigureCpuThreads: cannot pin ", n,
                                                   " threads to the ", num_cpus,
                                                   " CPUs of this process's affinity mask"));
  }
  omp_set_dynamic(0);
  omp_set_num_threads(n);
  if (!pin) {
    TRIDENT_LOG(INFO) << "CPU threads: " << n << " OpenMP threads, unpinned ("
                      << placement->num_physical_cores << " physical cores, " << num_cpus
                      << " CPUs in the affinity mask)";
    return absl::OkStatus();
  }
  std::vector<int> errors(n, 0);
  int team_size = 0;
#pragma omp parallel num_threads(n)
  {
    const int thread = omp_get_thread_num();
    if (thread == 0) team_size = omp_get_num_threads();
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(placement->cpus[thread], &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) errors[thread] = errno;
  }
  if (team_size != n) {
    return absl::InternalError(
        absl::StrCat("ConfigureCpuThreads: asked OpenMP for ", n, " threads, got ", team_size));
  }
  std::string mapping;
  for (int thread = 0; thread < n; ++thread) {
    if (errors[thread] != 0) {
      return absl::InternalError(absl::StrCat("ConfigureCpuThreads: binding thread ", thread,
                                              " to CPU ", placement->cpus[thread], ": ",
                                              std::strerror(errors[thread])));
    }
    absl::StrAppend(&mapping, thread == 0 ? "" : " ", thread, "->", placement->cpus[thread]);
  }
  TRIDENT_LOG(INFO) << "CPU threads: " << n << " OpenMP threads pinned (thread->CPU) " << mapping
                    << " (" << placement->num_physical_cores << " physical cores, " << num_cpus
                    << " CPUs in the affinity mask)";
  return absl::OkStatus();
}

int CpuThreadCount() { return omp_get_max_threads(); }

}  // namespace trident::cpu
