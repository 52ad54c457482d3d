#include "services/worker/offload/pipeline_planner.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace trident::worker {

CostCurve::CostCurve(std::vector<std::pair<double, double>> points) : points_(std::move(points)) {
  std::sort(points_.begin(), points_.end());
}

double CostCurve::At(double size) const {
  if (points_.empty()) return 0;
  if (points_.size() == 1 || size <= points_.front().first) return points_.front().second;
  size_t i = 1;
  while (i + 1 < points_.size() && points_[i].first < size) ++i;
  const auto& [x0, y0] = points_[i - 1];
  const auto& [x1, y1] = points_[i];
  const double y = y0 + (y1 - y0) * (size - x0) / (x1 - x0);
  return std::max(0.0, y);
}

absl::StatusOr<PipelineMode> ParsePipelineMode(absl::string_view name) {
  if (name == "auto") return PipelineMode::kAuto;
  if (name == "always") return PipelineMode::kAlways;
  if (name == "never") return PipelineMode::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("pipelining mode \"", name, "\": expected auto, always or never"));
}

namespace {

struct Estimate {
  double seconds = 0;
  double hidden = 0;  // seconds of CPU attention (round trip included) hidden
  double cpu = 0;     // seconds of CPU attention in all
};

// The model of the header comment for the first `k` CPU sequences (by
// `order`) in the second sub-batch.
Estimate EstimateStep(const StepShape& shape, const StepCosts& costs,
                      const std::vector<size_t>& order, size_t k) {
  const size_t c = order.size();
  int64_t second_context = 0, first_context = 0;
  for (size_t i = 0; i < c; ++i) {
    (i < k ? second_context : first_context) += shape.cpu_contexts[order[i]];
  }
  auto cpu = [&](size_t n, int64_t context) {
    if (n == 0) return 0.0;
    return (costs.cpu_attention.At(static_cast<double>(context)) + costs.round_trip_seconds +
            static_cast<double>(n - 1) * costs.per_sequence_seconds) *
           costs.cpu_scale;
  };
  const double local =
      shape.local_context_tokens > 0
          ? costs.local_attention.At(static_cast<double>(shape.local_context_tokens))
          : 0.0;
  const double first_cpu = cpu(c - k, first_context);
  const double first_linear = costs.linear.At(static_cast<double>(shape.local_tokens + (c - k)));
  Estimate e;
  e.cpu = first_cpu + cpu(k, second_context);
  if (k == 0) {
    e.seconds = first_linear + std::max(local, first_cpu);
    e.hidden = std::min(first_cpu, local);
    return e;
  }
  // Times from the layer's start. The second sub-batch's q/k/v come first
  // and its request goes out at once; the service answers requests one at
  // a time, in order, so the first sub-batch's request (if it has CPU
  // sequences) waits behind it, and the first sub-batch's projections after
  // attention wait for that answer.
  const double pre = std::clamp(costs.pre_attention_share, 0.0, 1.0);
  const double second_linear = costs.linear.At(static_cast<double>(k));
  const double second_sent = pre * second_linear;
  const double second_done = second_sent + cpu(k, second_context);
  const double first_sent = second_sent + pre * first_linear;
  double first_ready = first_sent + local;
  if (c > k) first_ready = std::max(first_ready, std::max(first_sent, second_done) + first_cpu);
  const double first_done = first_ready + (1 - pre) * first_linear;
  e.seconds = std::max(first_done, second_done) + (1 - pre) * second_linear;
  // What the backend waits for is the CPU work it did not hide.
  const double busy = first_linear + second_linear + local;
  e.hidden = std::clamp(e.cpu - (e.seconds - busy), 0.0, e.cpu);
  return e;
}

}  // namespace

PipelinePlan PlanPipeline(const StepShape& shape, const StepCosts& costs, PipelineMode mode) {
  const size_t c = shape.cpu_contexts.size();
  PipelinePlan plan;
  plan.second.assign(c, false);
  // Shortest contexts first (the most sequences under a given time), and
  // longest first (the most work hidden when the first sub-batch is long).
  std::vector<size_t> ascending(c);
  std::iota(ascending.begin(), ascending.end(), 0);
  std::stable_sort(ascending.begin(), ascending.end(), [&](size_t a, size_t b) {
    return shape.cpu_contexts[a] < shape.cpu_contexts[b];
  });
  const std::vector<size_t> descending(ascending.rbegin(), ascending.rend());
  const Estimate sequential = EstimateStep(shape, costs, ascending, 0);
  plan.sequential_seconds = sequential.seconds;
  size_t best = 0;
  const std::vector<size_t>* best_order = &ascending;
  Estimate chosen = sequential;
  // A second sub-batch needs a first one: something must stay behind.
  const size_t most = shape.local_tokens > 0 ? c : (c > 0 ? c - 1 : 0);
  if (mode == PipelineMode::kAlways) {
    best = most;
    chosen = EstimateStep(shape, costs, ascending, best);
  } else if (mode == PipelineMode::kAuto) {
    for (const std::vector<size_t>* order :
         {static_cast<const std::vector<size_t>*>(&ascending), &descending}) {
      for (size_t k = 1; k <= most; ++k) {
        const Estimate e = EstimateStep(shape, costs, *order, k);
        if (e.seconds < chosen.seconds && e.seconds < (1 - kPipelineMargin) * sequential.seconds) {
          chosen = e;
          best = k;
          best_order = order;
        }
      }
    }
  }
  for (size_t i = 0; i < best; ++i) plan.second[(*best_order)[i]] = true;
  plan.pipelined = static_cast<int32_t>(best);
  plan.planned_seconds = chosen.seconds;
  plan.hidden_fraction = chosen.cpu > 0 ? chosen.hidden / chosen.cpu : 0;
  plan.cpu_seconds = chosen.cpu;
  return plan;
}

double PreAttentionShare(int64_t hidden_size, int64_t num_q_heads, int64_t num_kv_heads,
                         int64_t head_dim, int64_t intermediate_size) {
  const double qkv = static_cast<double>(hidden_size) * (num_q_heads + 2 * num_kv_heads) * head_dim;
  const double out = static_cast<double>(num_q_heads) * head_dim * hidden_size;
  const double mlp = 3.0 * static_cast<double>(hidden_size) * intermediate_size;
  const double total = qkv + out + mlp;
  return total > 0 ? qkv / total : kDefaultPreAttentionShare;
}

bool MoveKeepsThroughput(const StepShape& shape, const StepCosts& costs, PipelineMode mode,
                         int64_t context, int32_t backlog, double max_layer_seconds) {
  const double sequences =
      static_cast<double>(shape.local_tokens) + static_cast<double>(shape.cpu_contexts.size());
  if (costs.cpu_attention.empty() || costs.linear.empty() || sequences == 0) return true;
  const double before = PlanPipeline(shape, costs, mode).planned_seconds;
  // Enough to see the round trip shared; a longer backlog changes little.
  constexpr int32_t kMostFollowing = 64;
  const auto after = [&](int32_t j) {
    StepShape after_shape = shape;
    after_shape.cpu_contexts.insert(after_shape.cpu_contexts.end(), j, context);
    return PlanPipeline(after_shape, costs, mode).planned_seconds;
  };
  const auto pays = [&](int32_t j, double seconds) {
    return seconds * sequences <= before * (sequences + j);
  };
  const double one = after(1);
  if (max_layer_seconds > 0 && one > max_layer_seconds) return false;
  if (pays(1, one)) return true;
  // The step grows with every sequence that follows, and the gain per
  // sequence is steadiest at the end of the run: judge the most that may
  // follow within the step-time target (found by bisection; the plans are
  // O(C^2) each, and this runs on the engine's loop).
  int32_t lo = 1, hi = 1 + std::clamp(backlog, 0, kMostFollowing);
  double at_lo = one;
  if (max_layer_seconds > 0) {
    while (lo < hi) {
      const int32_t mid = (lo + hi + 1) / 2;
      const double seconds = after(mid);
      if (seconds <= max_layer_seconds) {
        lo = mid;
        at_lo = seconds;
      } else {
        hi = mid - 1;
      }
    }
  } else {
    lo = hi;
    at_lo = after(hi);
  }
  return lo > 1 && pays(lo, at_lo);
}

double PlannedStepSeconds(const StepShape& shape, const StepCosts& costs, PipelineMode mode,
                          int64_t context, int32_t num_layers) {
  if (costs.cpu_attention.empty() || costs.linear.empty()) return 0;
  StepShape after = shape;
  after.cpu_contexts.push_back(context);
  after.local_tokens += 1;
  after.local_context_tokens += context;
  // The cost tables, and so the plan, are per layer.
  return PlanPipeline(after, costs, mode).planned_seconds * num_layers;
}

bool MoveKeepsStepTime(const StepShape& shape, const StepCosts& costs, PipelineMode mode,
                       int64_t context, int32_t num_layers, double max_step_seconds,
                       double* planned_seconds) {
  const double planned = PlannedStepSeconds(shape, costs, mode, context, num_layers);
  if (planned_seconds != nullptr) *planned_seconds = planned;
  // No target, or no measured costs (planned 0): every move.
  return max_step_seconds <= 0 || planned <= max_step_seconds;
}

double UpdateCpuScale(double scale, double observed, double planned) {
  if (observed <= 0 || planned <= 0) return scale;
  constexpr double kAlpha = 0.2;
  // `planned` was at `scale`: the ratio at scale 1 is observed / planned
  // times it.
  const double sample = scale * observed / planned;
  return std::clamp((1 - kAlpha) * scale + kAlpha * sample, 0.25, 8.0);
}

StepShape SteadyDecodeShape(int32_t running, int32_t remote_running, int64_t batch_context_tokens,
                            int64_t remote_tokens) {
  StepShape shape;
  const int64_t remote = std::max(0, remote_running);
  shape.local_tokens = std::max<int64_t>(0, running - remote);
  shape.local_context_tokens = std::max<int64_t>(0, batch_context_tokens - remote_tokens);
  shape.cpu_contexts.assign(remote, remote > 0 ? remote_tokens / remote : 0);
  return shape;
}

}  // namespace trident::worker
