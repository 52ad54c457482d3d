// What the running CPU can do, detected once per process: the instruction
// sets the CPU kernels dispatch on, and the core counts that thread setup
// starts from.

#ifndef TRIDENT_COMMON_CPU_CPU_FEATURES_H_
#define TRIDENT_COMMON_CPU_CPU_FEATURES_H_

#include <string>
#include <vector>

namespace trident::cpu {

// An instruction set counts as present only when both the CPU reports it
// (cpuid) and the operating system saves its registers (XCR0 via xgetbv), so a
// kernel may use it whenever the flag is true. `amx_tile` and `amx_bf16`
// additionally need a per-process permission request on Linux
// (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)), which oneDNN makes
// itself before using AMX and //kernels/cpu/decode_attention makes in Create().
struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;  // vcvtph2ps / vcvtps2ph.
  bool avx512f = false;
  bool avx512_bf16 = false;
  bool amx_tile = false;  // Tile registers, ldtilecfg, tileloadd.
  bool amx_bf16 = false;  // tdpbf16ps; implies amx_tile.
  // Distinct (package, core) pairs among the online CPUs, from
  // /sys/devices/system/cpu/cpu*/topology; equal to `logical_cpus` where the
  // topology cannot be read.
  int physical_cores = 1;
  // Online CPUs (hardware threads) of the machine, not of this process's
  // affinity mask.
  int logical_cpus = 1;
};

// Detected on the first call; later calls return the same object. Thread-safe.
const CpuFeatures& GetCpuFeatures();

// The features present, by the names the Linux kernel gives them in
// /proc/cpuinfo ("avx2", "fma", "f16c", "avx512f", "avx512_bf16",
// "amx_tile", "amx_bf16"), in that order.
std::vector<std::string> CpuFeatureNames(const CpuFeatures& features);

// One line for logs, e.g. "avx2 fma avx512f; 16 physical cores, 32 logical CPUs".
std::string CpuFeaturesString(const CpuFeatures& features);

}  // namespace trident::cpu

#endif  // TRIDENT_COMMON_CPU_CPU_FEATURES_H_
