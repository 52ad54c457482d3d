// Load-aware scheduling of a decode step with CPU-resident sequences (NEO's
// asymmetric pipelining): a pure function of the step's shape and cost
// tables measured at start-up, tested without an engine.
//
// A step is modelled per layer. Unpipelined, every sequence is in one batch
// and the CPU sequences' attention (with its round trip) overlaps only the
// local attention:
//
//   T_seq = linear(N + C) + max(local_attention(L), cpu(C) + round_trip)
//
// Pipelined, k CPU sequences form a second sub-batch whose q/k/v are
// computed first; its request is answered at the service while the backend
// computes the first sub-batch's layer. The price is a second pass over
// the layer's weights, and the service is one server: it answers requests
// one at a time, in the order they were sent, so CPU sequences left in the
// first sub-batch wait behind the second's. With the linear layers split
// at attention (share p before it: the q/k/v projection),
//
//   sent_2  = p linear(k);          done_2 = sent_2 + cpu(k) + rt
//   sent_1  = sent_2 + p linear(N + C - k)
//   ready_1 = max(sent_1 + local_attention(L),
//                 max(sent_1, done_2) + cpu(C - k) + rt)   [C > k]
//   T_pipe  = max(ready_1 + (1 - p) linear(N + C - k), done_2)
//             + (1 - p) linear(k)
//
// (N local tokens, L their context tokens, C the CPU sequences; cpu(S) the
// service's time for the context tokens of S, plus a per-sequence cost for
// each sequence of S after the first.) The planner picks the k (0:
// unpipelined) with the least estimated time, a pipelined one only when it
// beats one batch by kPipelineMargin. Where the backend's layer is
// a weight pass (linear flat in the batch), T_pipe is never below T_seq:
// pipelining pays only where the second pass is cheap against the CPU work
// it hides. Every CPU sequence runs every step, hidden or not: none starves.

#ifndef TRIDENT_SERVICES_WORKER_OFFLOAD_PIPELINE_PLANNER_H_
#define TRIDENT_SERVICES_WORKER_OFFLOAD_PIPELINE_PLANNER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trident::worker {

// Seconds as a piecewise-linear function of one size (tokens), through
// measured points; extrapolated along the last segment (flat below the
// first point).
class CostCurve {
 public:
  CostCurve() = default;
  // Points need not be sorted; sizes must be distinct and >= 0.
  explicit CostCurve(std::vector<std::pair<double, double>> points);
  double At(double size) const;
  bool empty() const { return points_.empty(); }
  const std::vector<std::pair<double, double>>& points() const { return points_; }

 private:
  std::vector<std::pair<double, double>> points_;
};

// How much faster than one batch a pipelined plan must be estimated, as a
// share of the step, to be chosen: a second sub-batch costs launches and
// synchronisation the tables do not hold.
inline constexpr double kPipelineMargin = 0.03;

// Llama-3-8B's q/k/v weights over its layer's (0.115), rounded up.
inline constexpr double kDefaultPreAttentionShare = 0.12;

// Share of a decoder layer's linear weights before attention: the q/k/v
// projection against it, the output projection and a gated MLP.
double PreAttentionShare(int64_t hidden_size, int64_t num_q_heads, int64_t num_kv_heads,
                         int64_t head_dim, int64_t intermediate_size);

// Per-layer costs of one decode step.
struct StepCosts {
  // The backend's linear layers (everything but attention) vs batch tokens.
  CostCurve linear;
  // The backend's attention vs the context tokens of its resident sequences.
  CostCurve local_attention;
  // An attention service's time vs the context tokens of one request.
  CostCurve cpu_attention;
  // Transport of one request and its answer, beyond the service's compute.
  double round_trip_seconds = 0;
  // What each sequence of a request adds beyond the first, whatever its
  // context: its rows on the wire both ways, the append of its new k/v,
  // its answer's conversion. Many short sequences cost more than one long
  // one of the same context tokens by this much each.
  double per_sequence_seconds = 0;
  // Share of `linear` before attention (the q/k/v projection's weights
  // among the layer's), which a pipelined step runs for both sub-batches
  // before the first request goes out.
  double pre_attention_share = kDefaultPreAttentionShare;
  // What the CPU terms (cpu_attention, round_trip_seconds,
  // per_sequence_seconds) are multiplied by: the observed service time over the planned one while
  // serving (UpdateCpuScale), since a start-up probe alone can be off 2x.
  double cpu_scale = 1.0;
};

enum class PipelineMode { kAuto, kAlways, kNever };
absl::StatusOr<PipelineMode> ParsePipelineMode(absl::string_view name);

struct StepShape {
  int64_t local_tokens = 0;          // token rows of resident sequences
  int64_t local_context_tokens = 0;  // context of resident sequences
  // Context tokens of each CPU-resident sequence.
  std::vector<int64_t> cpu_contexts;
};

struct PipelinePlan {
  // For each entry of StepShape::cpu_contexts: whether it goes to the second
  // sub-batch.
  std::vector<bool> second;
  int32_t pipelined = 0;  // how many do
  // Estimated per-layer seconds, unpipelined and as planned.
  double sequential_seconds = 0;
  double planned_seconds = 0;
  // Estimated share of the CPU sequences' attention time (round trip
  // included) hidden under the backend's work, as planned.
  double hidden_fraction = 0;
  // Estimated per-layer seconds of the CPU sequences' requests (round
  // trips included, hidden or not), as planned.
  double cpu_seconds = 0;
};

PipelinePlan PlanPipeline(const StepShape& shape, const StepCosts& costs, PipelineMode mode);

// The next cpu_scale after a step whose CPU requests took `observed`
// seconds in all against `planned` (PipelinePlan::cpu_seconds times the
// layers, at `scale`): an average weighted 0.2 to the newest step, kept in
// [0.25, 8]. `scale` unchanged when either is not positive.
double UpdateCpuScale(double scale, double observed, double planned);

// The decode step a running batch settles into, from the engine's counts
// (EngineStats: running and CPU-resident sequences, the context of those
// past their prompt, the CPU-resident ones' tokens): one token per resident
// sequence, and the CPU-resident ones at their mean context.
StepShape SteadyDecodeShape(int32_t running, int32_t remote_running, int64_t batch_context_tokens,
                            int64_t remote_tokens);

// Whether one more CPU-resident sequence of `context` tokens keeps the
// step's throughput: a sequence moved out lets a waiting one take its
// blocks, so the batch grows by one; the move pays when the planned step
// with it, per sequence, is no slower than the planned step without it
// ((B + 1) sequences in `after` seconds against B in `before`). The first
// CPU sequence pays a whole round trip a layer, which the ones after it
// share: with `backlog` more waiting sequences that could follow it (of as
// many tokens), the move also pays when the most of them that keep the
// planned step (per layer) within `max_layer_seconds` (0: no limit; at
// most 1 + 64) do. Judge it on SteadyDecodeShape, not on a step that carries prompt
// chunks: a move made while a prompt is computed lasts for every decode
// step after it. True when the costs were not measured (nothing to judge
// by) or the batch is empty.
bool MoveKeepsThroughput(const StepShape& shape, const StepCosts& costs, PipelineMode mode,
                         int64_t context, int32_t backlog = 0, double max_layer_seconds = 0);

// The planned step of `num_layers` layers, in seconds, after one more
// CPU-resident sequence of `context` tokens and, in its freed blocks, one
// more resident sequence of as many; 0 when the costs were not measured.
double PlannedStepSeconds(const StepShape& shape, const StepCosts& costs, PipelineMode mode,
                          int64_t context, int32_t num_layers);

// Whether the planned step of `num_layers` layers stays within
// `max_step_seconds` (a decode step is one token of every sequence: the TPOT
// target) after one more CPU-resident sequence of `context` tokens and, in
// its freed blocks, one more resident sequence of as many. Judge it on
// SteadyDecodeShape, as above. True when max_step_seconds <= 0 (no target)
// or the costs were not measured.
// With `planned_seconds`, also sets *planned_seconds to PlannedStepSeconds.
bool MoveKeepsStepTime(const StepShape& shape, const StepCosts& costs, PipelineMode mode,
                       int64_t context, int32_t num_layers, double max_step_seconds,
                       double* planned_seconds = nullptr);

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_OFFLOAD_PIPELINE_PLANNER_H_
