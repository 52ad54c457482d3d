#include "common/cpu/cpu_features.h"

#include <cpuid.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace trident::cpu {
namespace {

// xgetbv without -mxsave, so this file needs no target flags.
uint64_t ReadXcr0() {
  uint32_t eax = 0;
  uint32_t edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool ReadFile(const std::string& path, std::string* contents) {
  std::ifstream in(path);
  if (!in) return false;
  std::getline(in, *contents);
  return true;
}

// Parses a kernel CPU list such as "0-3,8,10-11".
std::vector<int> ParseCpuList(absl::string_view text) {
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(absl::StripAsciiWhitespace(text), ',')) {
    if (part.empty()) continue;
    std::pair<absl::string_view, absl::string_view> range = absl::StrSplit(part, '-');
    int first = 0;
    int last = 0;
    if (!absl::SimpleAtoi(range.first, &first)) return {};
    if (range.second.empty()) {
      last = first;
    } else if (!absl::SimpleAtoi(range.second, &last)) {
      return {};
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

void DetectTopology(CpuFeatures* features) {
  std::string online;
  std::vector<int> cpus;
  if (ReadFile("/sys/devices/system/cpu/online", &online)) cpus = ParseCpuList(online);
  if (cpus.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int cpu = 0; cpu < (n > 0 ? n : 1); ++cpu) cpus.push_back(cpu);
  }
  std::set<std::pair<int, int>> cores;
  bool topology_known = true;
  for (int cpu : cpus) {
    const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/");
    std::string package_text;
    std::string core_text;
    int package = 0;
    int core = 0;
    if (!ReadFile(dir + "physical_package_id", &package_text) ||
        !ReadFile(dir + "core_id", &core_text) || !absl::SimpleAtoi(package_text, &package) ||
        !absl::SimpleAtoi(core_text, &core)) {
      topology_known = false;
      break;
    }
    cores.emplace(package, core);
  }
  features->logical_cpus = static_cast<int>(cpus.size());
  features->physical_cores =
      topology_known ? static_cast<int>(cores.size()) : features->logical_cpus;
}

CpuFeatures Detect() {
  CpuFeatures features;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    const bool osxsave = (ecx & (1u << 27)) != 0;
    const bool avx = (ecx & (1u << 28)) != 0;
    const uint64_t xcr0 = osxsave ? ReadXcr0() : 0;
    // XCR0 bits: 1-2 SSE/AVX state, 5-7 opmask and ZMM state, 17-18 AMX tiles.
    const bool ymm_state = (xcr0 & 0x6) == 0x6;
    const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
    const bool tile_state = (xcr0 & (3ull << 17)) == (3ull << 17);
    features.fma = avx && ymm_state && (ecx & (1u << 12)) != 0;
    features.f16c = avx && ymm_state && (ecx & (1u << 29)) != 0;
    unsigned max_subleaf = 0;
    if (__get_cpuid_count(7, 0, &max_subleaf, &ebx, &ecx, &edx)) {
      features.avx2 = avx && ymm_state && (ebx & (1u << 5)) != 0;
      features.avx512f = zmm_state && (ebx & (1u << 16)) != 0;
      features.amx_tile = tile_state && (edx & (1u << 24)) != 0;
      features.amx_bf16 = features.amx_tile && (edx & (1u << 22)) != 0;
      if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) {
        features.avx512_bf16 = features.avx512f && (eax & (1u << 5)) != 0;
      }
    }
  }
  DetectTopology(&features);
  return features;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures* const features = new CpuFeatures(Detect());
  return *features;
}

std::string CpuFeaturesString(const CpuFeatures& features) {
  std::string out;
  for (const auto& [present, name] : {std::pair<bool, const char*>{features.avx2, "avx2"},
                                      {features.fma, "fma"},
                                      {features.f16c, "f16c"},
                                      {features.avx512f, "avx512f"},
                                      {features.avx512_bf16, "avx512_bf16"},
                                      {features.amx_tile, "amx_tile"},
                                      {features.amx_bf16, "amx_bf16"}}) {
    if (present) absl::StrAppend(&out, out.empty() ? "" : " ", name);
  }
  if (out.empty()) out = "no avx2";
  absl::StrAppend(&out, "; ", features.physical_cores, " physical cores, ", features.logical_cpus,
                  " logical CPUs");
  return out;
}

std::vector<std::string> CpuFeatureNames(const CpuFeatures& f) {
  std::vector<std::string> names;
  const std::pair<bool, const char*> all[] = {
      {f.avx2, "avx2"},         {f.fma, "fma"},           {f.f16c, "f16c"},
      {f.avx512f, "avx512f"},   {f.avx512_bf16, "avx512_bf16"},
      {f.amx_tile, "amx_tile"}, {f.amx_bf16, "amx_bf16"}};
  for (const auto& [present, name] : all) {
    if (present) names.emplace_back(name);
  }
  return names;
}

}  // namespace trident::cpu
