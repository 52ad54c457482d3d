#include "kernels/cuda/testing/kernel_profile.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace trident::kernels::cuda::testing {
namespace {

std::string Demangled(std::string_view name) {
  if (name.substr(0, 2) != "_Z") return std::string(name);
  int status = 0;
  const std::string mangled(name);
  std::unique_ptr<char, void (*)(void*)> out(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && out != nullptr ? std::string(out.get()) : mangled;
}

// Each kernel's exposed time in one step (records in start order): the part
// of [start, end) past every earlier kernel's end.
std::vector<double> ExposedNs(const std::vector<const KernelRecord*>& step) {
  std::vector<double> exposed;
  uint64_t frontier = step.empty() ? 0 : step.front()->start_ns;
  for (const KernelRecord* r : step) {
    const uint64_t from = std::max(r->start_ns, frontier);
    exposed.push_back(r->end_ns > from ? static_cast<double>(r->end_ns - from) : 0.0);
    frontier = std::max(frontier, r->end_ns);
  }
  return exposed;
}

// The longest run of `layers` repeats of one period in `names`: the period
// and where the run starts, or {0, 0}.
std::pair<int, int> FindLayers(const std::vector<std::string>& names, int layers) {
  const int n = static_cast<int>(names.size());
  if (layers < 2) return {0, 0};
  for (int p = n / layers; p >= 1; --p) {
    for (int s = 0; s + layers * p <= n; ++s) {
      bool repeats = true;
      for (int i = s; repeats && i < s + (layers - 1) * p; ++i) repeats = names[i] == names[i + p];
      if (repeats) return {p, s};
    }
  }
  return {0, 0};
}

KernelCost MeanOf(const std::string& name, const std::vector<double>& exposed,
                  const std::vector<double>& duration, const std::vector<int>& at) {
  KernelCost cost{name, 0, 0};
  for (int i : at) {
    cost.exposed_us += exposed[i] / 1e3;
    cost.duration_us += duration[i] / 1e3;
  }
  cost.exposed_us /= static_cast<double>(at.size());
  cost.duration_us /= static_cast<double>(at.size());
  return cost;
}

void AppendRows(std::string& out, const char* part, const std::vector<KernelCost>& costs,
                int times) {
  double exposed = 0;
  for (const KernelCost& c : costs) {
    absl::StrAppendFormat(&out, "| %s | %s | %.2f | %.2f | %.1f |\n", part, c.name, c.exposed_us,
                          c.duration_us, c.exposed_us * times);
    exposed += c.exposed_us;
  }
  if (!costs.empty()) {
    absl::StrAppendFormat(&out, "| %s | (all) | %.2f | - | %.1f |\n", part, exposed,
                          exposed * times);
  }
}

}  // namespace

std::string ShortKernelName(std::string_view name) {
  std::string full = absl::StrReplaceAll(Demangled(name), {{"(anonymous namespace)::", ""}});
  if (full.rfind("void ", 0) == 0) full.erase(0, 5);
  std::string out;
  int depth = 0;
  for (size_t i = 0; i < full.size(); ++i) {
    const char c = full[i];
    if (c == '(' && depth == 0 && !out.empty()) break;  // the parameter list
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if (c == ':' && i + 1 < full.size() && full[i + 1] == ':') {
      // Drop the qualifier just written (back to a delimiter) and the "::".
      const size_t cut = out.find_last_of(" <(,");
      out.erase(cut == std::string::npos ? 0 : cut + 1);
      ++i;
      continue;
    }
    out.push_back(c);
  }
  if (out.size() > 72) out = out.substr(0, 69) + "...";
  return out;
}

absl::StatusOr<StepProfile> ProfileSteps(std::vector<KernelRecord> records,
                                         const std::vector<uint64_t>& boundaries, int layers) {
  if (boundaries.size() < 2 || !std::is_sorted(boundaries.begin(), boundaries.end())) {
    return absl::InvalidArgumentError("need at least two ascending step boundaries");
  }
  std::sort(records.begin(), records.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  const int steps = static_cast<int>(boundaries.size()) - 1;
  std::vector<std::vector<const KernelRecord*>> by_step(steps);
  for (const KernelRecord& r : records) {
    const auto it = std::upper_bound(boundaries.begin(), boundaries.end(), r.start_ns);
    if (it == boundaries.begin() || it == boundaries.end()) continue;
    by_step[it - boundaries.begin() - 1].push_back(&r);
  }
  StepProfile profile;
  profile.steps = steps;
  profile.kernels_per_step = static_cast<int>(by_step[0].size());
  if (profile.kernels_per_step == 0) return absl::NotFoundError("no kernel in the first step");
  const size_t n = by_step[0].size();
  std::vector<double> exposed(n, 0), duration(n, 0);
  for (int s = 0; s < steps; ++s) {
    const auto& step = by_step[s];
    if (step.size() != n) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", s, " ran ", step.size(), " kernels, step 0 ran ", n));
    }
    const std::vector<double> e = ExposedNs(step);
    uint64_t last_end = 0;
    for (size_t i = 0; i < n; ++i) {
      if (step[i]->name != by_step[0][i]->name) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step ", s, " kernel ", i, " is ", step[i]->name, ", not ", by_step[0][i]->name));
      }
      exposed[i] += e[i];
      duration[i] += static_cast<double>(step[i]->end_ns - step[i]->start_ns);
      profile.busy_us += e[i] / 1e3;
      last_end = std::max(last_end, step[i]->end_ns);
    }
    profile.span_us += static_cast<double>(last_end - step.front()->start_ns) / 1e3;
    profile.wall_us += static_cast<double>(boundaries[s + 1] - boundaries[s]) / 1e3;
  }
  profile.busy_us /= steps;
  profile.span_us /= steps;
  profile.wall_us /= steps;
  for (size_t i = 0; i < n; ++i) {
    exposed[i] /= steps;
    duration[i] /= steps;
  }
  std::vector<std::string> names;
  for (const KernelRecord* r : by_step[0]) names.push_back(ShortKernelName(r->name));
  // The first or last layer may run other kernels (the embedding's add
  // fused into layer 0's norm, the head's norm): fold the rest then.
  auto [period, first] = FindLayers(names, layers);
  if (period == 0) {
    --layers;
    std::tie(period, first) = FindLayers(names, layers);
  }
  profile.layer_kernels = period;
  const int layer_end = first + layers * period;
  for (int i = 0; i < static_cast<int>(n); ++i) {
    if (period > 0 && i >= first && i < first + period) {
      std::vector<int> at;
      for (int l = 0; l < layers; ++l) at.push_back(i + l * period);
      profile.layer.push_back(MeanOf(names[i], exposed, duration, at));
    } else if (period == 0 || i < first) {
      profile.before.push_back(MeanOf(names[i], exposed, duration, {i}));
    } else if (i >= layer_end) {
      profile.after.push_back(MeanOf(names[i], exposed, duration, {i}));
    }
  }
  return profile;
}

std::string FormatStepProfile(const StepProfile& p) {
  const int layers = p.layer_kernels > 0 ? (p.kernels_per_step - static_cast<int>(p.before.size()) -
                                            static_cast<int>(p.after.size())) /
                                               p.layer_kernels
                                         : 0;
  std::string out = absl::StrFormat(
      "%d steps of %d kernels (%d layers of %d): per step %.1f µs wall, %.1f µs from the first "
      "kernel's start to the last one's end, %.1f µs with a kernel running\n\n"
      "| part | kernel | exposed µs | duration µs | exposed µs, all layers |\n"
      "| --- | --- | --- | --- | --- |\n",
      p.steps, p.kernels_per_step, layers, p.layer_kernels, p.wall_us, p.span_us, p.busy_us);
  AppendRows(out, "before", p.before, 1);
  AppendRows(out, "layer", p.layer, layers);
  AppendRows(out, "after", p.after, 1);
  return out;
}

}  // namespace trident::kernels::cuda::testing
