#include "services/worker/offload/pipeline_planner.h"

#include <cstdio>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::worker {
namespace {

constexpr double kMs = 1e-3;

// A compute-bound backend: 2 ms of weights per layer pass plus 0.05 ms per
// token; its attention 1 ms per 100k context tokens; the service 0.15 ms
// per 1k context tokens, 0.1 ms round trip.
StepCosts ComputeBound() {
  StepCosts c;
  c.linear = CostCurve({{1, 2.05 * kMs}, {1024, (2 + 0.05 * 1024) * kMs}});
  c.local_attention = CostCurve({{0, 0}, {100000, 1 * kMs}});
  c.cpu_attention = CostCurve({{0, 0.02 * kMs}, {1000, 0.17 * kMs}});
  c.round_trip_seconds = 0.1 * kMs;
  return c;
}

// An H200-like step of an 8B model: 0.16 ms a layer whatever the batch (a
// weight pass); the service 0.091 ms per 1k context tokens (~45 GB/s at
// 4 KiB a token a layer) plus `round_trip_ms` a request.
StepCosts WeightPass(double round_trip_ms) {
  StepCosts c;
  c.linear = CostCurve({{1, 0.16 * kMs}, {64, 0.17 * kMs}});
  c.local_attention = CostCurve({{0, 0}, {100000, 0.1 * kMs}});
  c.cpu_attention = CostCurve({{0, 0}, {1000, 0.091 * kMs}});
  c.round_trip_seconds = round_trip_ms * kMs;
  c.pre_attention_share = PreAttentionShare(4096, 32, 8, 128, 14336);
  return c;
}

TEST(CostCurveTest, InterpolatesBetweenPointsAndExtrapolatesTheLastSegment) {
  const CostCurve curve({{100, 2}, {0, 1}, {200, 4}});
  EXPECT_DOUBLE_EQ(curve.At(-5), 1);
  EXPECT_DOUBLE_EQ(curve.At(50), 1.5);
  EXPECT_DOUBLE_EQ(curve.At(150), 3);
  EXPECT_DOUBLE_EQ(curve.At(300), 6);
  EXPECT_DOUBLE_EQ(CostCurve({{10, 7}}).At(1000), 7);
  EXPECT_DOUBLE_EQ(CostCurve().At(3), 0);
}

TEST(PipelinePlannerTest, ParsesModes) {
  EXPECT_EQ(*ParsePipelineMode("auto"), PipelineMode::kAuto);
  EXPECT_EQ(*ParsePipelineMode("always"), PipelineMode::kAlways);
  EXPECT_EQ(*ParsePipelineMode("never"), PipelineMode::kNever);
  EXPECT_FALSE(ParsePipelineMode("sometimes").ok());
}

TEST(PipelinePlannerTest, NoCpuSequencesNothingToPipeline) {
  const PipelinePlan plan = PlanPipeline({.local_tokens = 64, .local_context_tokens = 4096},
                                         ComputeBound(), PipelineMode::kAlways);
  EXPECT_EQ(plan.pipelined, 0);
  EXPECT_TRUE(plan.second.empty());
  EXPECT_EQ(plan.hidden_fraction, 0);
}

TEST(PipelinePlannerTest, ABigComputeBoundBatchHidesTheCpuAttention) {
  // 256 resident tokens, 64 CPU sequences of 1k context: one batch costs
  // their ~10 ms of service time on top of the 15 ms linear layers; half of
  // them in a second sub-batch hide under the first sub-batch's layer.
  StepShape shape{.local_tokens = 256, .local_context_tokens = 256 * 2048};
  shape.cpu_contexts.assign(64, 1024);
  const PipelinePlan plan = PlanPipeline(shape, ComputeBound(), PipelineMode::kAuto);
  std::printf("sequential %.3f ms, planned %.3f ms with %d of 64 pipelined, %.2f hidden\n",
              plan.sequential_seconds / kMs, plan.planned_seconds / kMs, plan.pipelined,
              plan.hidden_fraction);
  EXPECT_GT(plan.pipelined, 0);
  EXPECT_LT(plan.planned_seconds, plan.sequential_seconds);
  EXPECT_GT(plan.hidden_fraction, 0.5);
  int32_t marked = 0;
  for (bool b : plan.second) marked += b ? 1 : 0;
  EXPECT_EQ(marked, plan.pipelined);
}

TEST(PipelinePlannerTest, AMemoryBoundBackendDoesNotPayForASecondWeightPass) {
  // Linear time flat in the batch (weights read once a pass): a second
  // sub-batch costs a whole pass more than the attention it would hide.
  StepCosts costs = ComputeBound();
  costs.linear = CostCurve({{1, 3 * kMs}, {512, 3.1 * kMs}});
  StepShape shape{.local_tokens = 8, .local_context_tokens = 8 * 1024};
  shape.cpu_contexts = {4096, 8192};
  const PipelinePlan plan = PlanPipeline(shape, costs, PipelineMode::kAuto);
  EXPECT_EQ(plan.pipelined, 0);
  EXPECT_DOUBLE_EQ(plan.planned_seconds, plan.sequential_seconds);
  EXPECT_EQ(PlanPipeline(shape, costs, PipelineMode::kAlways).pipelined, 2);
  EXPECT_EQ(PlanPipeline(shape, costs, PipelineMode::kNever).pipelined, 0);
}

TEST(PipelinePlannerTest, TheServiceAnswersOneRequestAtATime) {
  // Flat 1 ms linear layers, half of them before attention; the service
  // takes 2 ms a request. Two CPU sequences and nothing resident: pipelined,
  // one goes second (its request out at 0.5 ms, answered at 2.5 ms) and the
  // other's request, ready at 1 ms, waits for it (answered at 4.5 ms); then
  // the first sub-batch's 0.5 ms after attention, then the second's.
  StepCosts costs;
  costs.linear = CostCurve({{1, 1 * kMs}});
  costs.local_attention = CostCurve({{0, 0}});
  costs.cpu_attention = CostCurve({{0, 2 * kMs}});
  costs.pre_attention_share = 0.5;
  StepShape shape;
  shape.cpu_contexts = {100, 100};
  const PipelinePlan pipelined = PlanPipeline(shape, costs, PipelineMode::kAlways);
  EXPECT_EQ(pipelined.pipelined, 1);
  EXPECT_NEAR(pipelined.planned_seconds, 5.5 * kMs, 1e-12);
  // The service works from 0.5 to 4.5 ms, the backend until 1 ms and
  // from 4.5 ms: 0.5 ms of the 4 are hidden.
  EXPECT_NEAR(pipelined.hidden_fraction, 0.5 / 4, 1e-9);
  // One batch: 1 ms of linear layers and one 2 ms request.
  const PipelinePlan planned = PlanPipeline(shape, costs, PipelineMode::kAuto);
  EXPECT_EQ(planned.pipelined, 0);
  EXPECT_NEAR(planned.planned_seconds, 3 * kMs, 1e-12);
}

TEST(PipelinePlannerTest, AWeightPassStepRunsManyShortCpuSequencesInOneBatch) {
  // 2 resident sequences and 14 CPU ones of 320 tokens. Split over two
  // sub-batches their requests would queue at the service behind each
  // other; all in the second, the service's 0.46 ms hide only the first's
  // layer, which a single batch overlaps anyway: no pipelined plan beats
  // one batch by kPipelineMargin, so one batch it is.
  const StepCosts costs = WeightPass(/*round_trip_ms=*/0.05);
  StepShape shape{.local_tokens = 2, .local_context_tokens = 2 * 320};
  shape.cpu_contexts.assign(14, 320);
  const PipelinePlan plan = PlanPipeline(shape, costs, PipelineMode::kAuto);
  std::printf("one batch %.3f ms a layer; pipelined at best %.3f ms\n",
              plan.sequential_seconds / kMs,
              PlanPipeline(shape, costs, PipelineMode::kAlways).planned_seconds / kMs);
  EXPECT_EQ(plan.pipelined, 0);
  EXPECT_GT(PlanPipeline(shape, costs, PipelineMode::kAlways).planned_seconds,
            (1 - kPipelineMargin) * plan.planned_seconds);
}

TEST(PipelinePlannerTest, PreAttentionShareIsTheQkvWeightsShare) {
  // Llama-3-8B: q/k/v 4096 x 6144 of 4096 x (6144 + 4096 + 3 x 14336).
  EXPECT_NEAR(PreAttentionShare(4096, 32, 8, 128, 14336),
              4096.0 * 6144 / (4096.0 * 6144 + 4096.0 * 4096 + 3 * 4096.0 * 14336), 1e-12);
  EXPECT_NEAR(PreAttentionShare(4096, 32, 8, 128, 14336), 0.115, 0.001);
  EXPECT_EQ(PreAttentionShare(0, 0, 0, 0, 0), kDefaultPreAttentionShare);
}

TEST(PipelinePlannerTest, WithoutResidentWorkOneCpuSequenceStaysInTheFirstSubBatch) {
  StepShape shape;
  shape.cpu_contexts = {100, 200, 300};
  const PipelinePlan plan = PlanPipeline(shape, ComputeBound(), PipelineMode::kAlways);
  EXPECT_EQ(plan.pipelined, 2);
  EXPECT_EQ(plan.second.size(), 3u);
  EXPECT_FALSE(plan.second[2]) << "the longest stays first";
  StepShape one;
  one.cpu_contexts = {100};
  EXPECT_EQ(PlanPipeline(one, ComputeBound(), PipelineMode::kAlways).pipelined, 0);
}

TEST(PipelinePlannerTest, ThePlanIsNeverWorseThanTheSequentialEstimate) {
  std::mt19937 rng(11);
  std::printf("seed 11\n");
  std::uniform_int_distribution<int> tokens(0, 512), seqs(0, 48), context(1, 32768);
  for (int trial = 0; trial < 500; ++trial) {
    StepShape shape{.local_tokens = tokens(rng)};
    shape.local_context_tokens = shape.local_tokens * int64_t{context(rng)};
    shape.cpu_contexts.resize(seqs(rng));
    for (int64_t& c : shape.cpu_contexts) c = context(rng);
    const PipelinePlan plan = PlanPipeline(shape, ComputeBound(), PipelineMode::kAuto);
    ASSERT_LE(plan.planned_seconds, plan.sequential_seconds) << trial;
    ASSERT_EQ(plan.second.size(), shape.cpu_contexts.size());
    ASSERT_GE(plan.hidden_fraction, 0);
    ASSERT_LE(plan.hidden_fraction, 1);
  }
}

TEST(MoveKeepsThroughputTest, MovesOnlyWhatTheStepCanCarry) {
  // 8 resident decode rows of 2k context; the compute-bound backend's
  // layer is ~2.4 ms, and the service attends 1k tokens in 0.17 ms.
  StepShape shape;
  shape.local_tokens = 8;
  shape.local_context_tokens = 8 * 2048;
  const StepCosts fast = ComputeBound();
  // A 2k-token sequence (~0.4 ms at the service) hides under the layer.
  EXPECT_TRUE(MoveKeepsThroughput(shape, fast, PipelineMode::kAuto, 2048));
  // A 64k-token one (~10 ms) would stretch the step far past 9/8 of it.
  EXPECT_FALSE(MoveKeepsThroughput(shape, fast, PipelineMode::kAuto, 65536));
  // A service ten times slower cannot carry even the short one.
  StepCosts slow = fast;
  slow.cpu_attention = CostCurve({{0, 0.2 * kMs}, {1000, 1.7 * kMs}});
  EXPECT_FALSE(MoveKeepsThroughput(shape, slow, PipelineMode::kAuto, 2048));
  // Each move counts the ones before it: the CPU share fills up.
  int moved = 0;
  while (moved < 100 && MoveKeepsThroughput(shape, fast, PipelineMode::kAuto, 2048)) {
    shape.cpu_contexts.push_back(2048);
    ++moved;
  }
  std::printf("2k-token sequences the compute-bound step carries beside 8 resident: %d\n", moved);
  EXPECT_GT(moved, 0);
  EXPECT_LT(moved, 100);
}

TEST(MoveKeepsThroughputTest, AFirstMovePaysForItsRoundTripWhenOthersCanFollow) {
  // A weight-pass step with 2 resident sequences; the service answers a
  // request in 0.08 ms plus 0.091 ms per 1k tokens. One 320-token CPU
  // sequence costs a whole round trip: alone
  // it slows the step more than it adds (0.27 ms for 3 against 0.16 for
  // 2); with one more behind it the round trip is shared (0.30 ms for 4),
  // and with 13 the step carries 16 in ~0.65 ms: the move pays.
  const StepCosts costs = WeightPass(/*round_trip_ms=*/0.08);
  const StepShape shape{.local_tokens = 2, .local_context_tokens = 2 * 320};
  EXPECT_FALSE(MoveKeepsThroughput(shape, costs, PipelineMode::kAuto, 320));
  EXPECT_TRUE(MoveKeepsThroughput(shape, costs, PipelineMode::kAuto, 320, /*backlog=*/1));
  EXPECT_TRUE(MoveKeepsThroughput(shape, costs, PipelineMode::kAuto, 320, /*backlog=*/13));
  // Unless the step-time target stops them first: at 0.25 ms a layer not
  // even the first fits.
  EXPECT_FALSE(MoveKeepsThroughput(shape, costs, PipelineMode::kAuto, 320, 13, 0.25 * kMs));
  EXPECT_TRUE(MoveKeepsThroughput(shape, costs, PipelineMode::kAuto, 320, 13, 1 * kMs));
  // Long sequences never pay here, whatever follows: a 2k-token one costs
  // more than a resident sequence's share of the step.
  EXPECT_FALSE(MoveKeepsThroughput(shape, costs, PipelineMode::kAuto, 2048, 64));
}

TEST(MoveKeepsThroughputTest, EachSequenceARequestCarriesIsPriced) {
  // 4 resident sequences: a resident one's share of the weight pass is
  // 0.04 ms a layer. A 320-token CPU sequence reads 0.029 ms of KV, so by
  // context alone 28 of them behind one round trip pay (1.03 ms for 32).
  // At 20 us a sequence for its rows, append and answer (what the H200
  // host's service measured) each costs 0.049 ms: none pays.
  StepCosts costs = WeightPass(/*round_trip_ms=*/0.05);
  const StepShape shape{.local_tokens = 4, .local_context_tokens = 4 * 320};
  EXPECT_TRUE(MoveKeepsThroughput(shape, costs, PipelineMode::kAuto, 320, /*backlog=*/28));
  costs.per_sequence_seconds = 0.02 * kMs;
  EXPECT_FALSE(MoveKeepsThroughput(shape, costs, PipelineMode::kAuto, 320, /*backlog=*/28));
  // The first sequence of a request pays none of it: one CPU sequence's
  // plan is the same either way.
  StepShape one = shape;
  one.cpu_contexts = {320};
  StepCosts without = costs;
  without.per_sequence_seconds = 0;
  EXPECT_DOUBLE_EQ(PlanPipeline(one, costs, PipelineMode::kNever).planned_seconds,
                   PlanPipeline(one, without, PipelineMode::kNever).planned_seconds);
  // Each one after it adds it once, scaled like the other CPU terms.
  one.cpu_contexts = {160, 160};
  costs.cpu_scale = 2;
  without.cpu_scale = 2;
  EXPECT_NEAR(PlanPipeline(one, costs, PipelineMode::kNever).cpu_seconds -
                  PlanPipeline(one, without, PipelineMode::kNever).cpu_seconds,
              2 * 0.02 * kMs, 1e-12);
}

TEST(MoveKeepsThroughputTest, JudgesTheDecodeStepNotAStepCarryingAPromptChunk) {
  // 4 resident sequences of 2k context, one of them computing a 2048-token
  // prompt chunk this step (2051 token rows); no CPU-resident one yet. The
  // steady decode step has 4 rows, and a 2k-token CPU sequence cannot hide
  // under it.
  StepCosts costs = ComputeBound();
  costs.cpu_attention = CostCurve({{0, 0.1 * kMs}, {2048, 1.5 * kMs}});
  const StepShape steady = SteadyDecodeShape(/*running=*/4, /*remote_running=*/0,
                                             /*batch_context_tokens=*/3 * 2048,
                                             /*remote_tokens=*/0);
  EXPECT_EQ(steady.local_tokens, 4);
  EXPECT_EQ(steady.local_context_tokens, 3 * 2048);
  EXPECT_TRUE(steady.cpu_contexts.empty());
  EXPECT_FALSE(MoveKeepsThroughput(steady, costs, PipelineMode::kAuto, 2048));
  // CPU-resident sequences enter at their mean context.
  const StepShape mixed = SteadyDecodeShape(6, 2, 4 * 2048 + 3000, 3000);
  EXPECT_EQ(mixed.local_tokens, 4);
  EXPECT_EQ(mixed.local_context_tokens, 4 * 2048);
  EXPECT_THAT(mixed.cpu_contexts, ::testing::ElementsAre(1500, 1500));
}

TEST(MoveKeepsStepTimeTest, MovesWhileTheStepStaysWithinTheTarget) {
  StepCosts costs = ComputeBound();
  costs.cpu_attention = CostCurve({{0, 0.1 * kMs}, {2048, 1.5 * kMs}});
  StepShape shape = SteadyDecodeShape(/*running=*/4, /*remote_running=*/0,
                                      /*batch_context_tokens=*/4 * 2048, /*remote_tokens=*/0);
  // The plan is per layer; the target is for a step of 32 layers.
  constexpr int32_t kLayers = 32;
  const double step = kLayers * PlanPipeline(shape, costs, PipelineMode::kAuto).planned_seconds;
  // No target, or no measured costs: every move.
  EXPECT_TRUE(MoveKeepsStepTime(shape, costs, PipelineMode::kAuto, 2048, kLayers, 0));
  EXPECT_TRUE(MoveKeepsStepTime(shape, StepCosts{}, PipelineMode::kAuto, 2048, kLayers, step));
  // The current step as the target: a move (which adds work) never fits.
  EXPECT_FALSE(MoveKeepsStepTime(shape, costs, PipelineMode::kAuto, 2048, kLayers, step));
  // A target three steps long takes moves until it is full, each counting
  // the ones before it.
  int moved = 0;
  while (moved < 100 &&
         MoveKeepsStepTime(shape, costs, PipelineMode::kAuto, 2048, kLayers, 3 * step)) {
    shape.cpu_contexts.push_back(2048);
    shape.local_tokens += 1;
    shape.local_context_tokens += 2048;
    ++moved;
  }
  std::printf("2k-token moves within 3x a 4-sequence step (%.2f ms): %d\n", step / kMs, moved);
  EXPECT_GT(moved, 0);
  EXPECT_LT(moved, 100);
  EXPECT_LE(kLayers * PlanPipeline(shape, costs, PipelineMode::kAuto).planned_seconds, 3 * step);
  // Judged per layer, the same target would have taken every move.
  EXPECT_TRUE(MoveKeepsStepTime(shape, costs, PipelineMode::kAuto, 2048, 1, 3 * step));
}

TEST(CpuScaleTest, ObservedServiceTimeScalesTheCpuTermsAndTheGuardFollows) {
  StepCosts costs = ComputeBound();
  costs.cpu_attention = CostCurve({{0, 0.1 * kMs}, {2048, 1.5 * kMs}});
  StepShape shape = SteadyDecodeShape(4, 0, 4 * 2048, 0);
  shape.cpu_contexts.push_back(2048);
  const PipelinePlan at_one = PlanPipeline(shape, costs, PipelineMode::kNever);
  costs.cpu_scale = 2;
  const PipelinePlan at_two = PlanPipeline(shape, costs, PipelineMode::kNever);
  EXPECT_NEAR(at_two.cpu_seconds, 2 * at_one.cpu_seconds, 1e-12);
  EXPECT_GT(at_two.planned_seconds, at_one.planned_seconds);
  // A target the table's step meets, but not the step at twice the CPU
  // time: the guard refuses once the scale says the service is slower.
  constexpr int32_t kLayers = 32;
  costs.cpu_scale = 1;
  const double target = kLayers * (at_one.planned_seconds + at_two.planned_seconds) / 2;
  StepShape before = shape;
  before.cpu_contexts.clear();
  before.local_tokens = 3;  // The move re-adds a resident sequence.
  before.local_context_tokens = 3 * 2048;
  EXPECT_TRUE(MoveKeepsStepTime(before, costs, PipelineMode::kNever, 2048, kLayers, target));
  costs.cpu_scale = 2;
  EXPECT_FALSE(MoveKeepsStepTime(before, costs, PipelineMode::kNever, 2048, kLayers, target));
}

TEST(CpuScaleTest, UpdatesTowardTheObservedRatioWithinBounds) {
  // Observed twice the plan at scale 1: one step moves it a fifth of the way.
  EXPECT_NEAR(UpdateCpuScale(1.0, 2.0, 1.0), 1.2, 1e-12);
  // The plan was made at scale 2 and matched: the scale holds.
  EXPECT_NEAR(UpdateCpuScale(2.0, 1.0, 1.0), 2.0, 1e-12);
  // A service steadily 3x the table (1 s planned at scale 1, so `scale` s
  // at the current scale; 3 s observed): the scale converges on 3.
  double scale = 1.0;
  for (int i = 0; i < 100; ++i) scale = UpdateCpuScale(scale, 3.0, 1.0 * scale);
  EXPECT_NEAR(scale, 3.0, 1e-6);
  // Nothing to learn from a step without CPU time; bounds hold.
  EXPECT_EQ(UpdateCpuScale(1.5, 0, 1.0), 1.5);
  EXPECT_EQ(UpdateCpuScale(1.5, 1.0, 0), 1.5);
  scale = 1.0;
  for (int i = 0; i < 100; ++i) scale = UpdateCpuScale(scale, 1000.0, 1e-3);
  EXPECT_EQ(scale, 8.0);
  for (int i = 0; i < 100; ++i) scale = UpdateCpuScale(scale, 1e-9, 1.0);
  EXPECT_EQ(scale, 0.25);
}

TEST(MoveKeepsThroughputTest, WithoutMeasuredCostsEveryMoveIsAllowed) {
  StepShape shape;
  shape.local_tokens = 4;
  EXPECT_TRUE(MoveKeepsThroughput(shape, StepCosts{}, PipelineMode::kAuto, 1 << 20));
  EXPECT_TRUE(MoveKeepsThroughput(StepShape{}, ComputeBound(), PipelineMode::kAuto, 1 << 20));
}

}  // namespace
}  // namespace trident::worker
