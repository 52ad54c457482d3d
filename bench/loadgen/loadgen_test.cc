// Unit tests of the load generator's pure logic. Every random input comes
// from a fixed seed, printed by `Seed()`, and time from a FakeClock.

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"
#include "common/status/error_details.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident::loadgen {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::Le;
using ::testing::Not;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;
using ::trident::testing::TestTmpPath;

uint64_t Seed(uint64_t seed) {
  std::printf("seed=%llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

LengthDistribution Fixed(int32_t n) {
  LengthDistribution d;
  d.kind = LengthDistribution::Kind::kFixed;
  d.min_tokens = d.max_tokens = n;
  d.spec = absl::StrCat("fixed:", n);
  return d;
}

WorkloadSpec BasicSpec(uint64_t seed) {
  WorkloadSpec spec;
  spec.seed = seed;
  spec.arrival = {.kind = ArrivalKind::kPoisson, .rate_per_s = 10};
  spec.num_requests = 100;
  spec.prompt_tokens = Fixed(8);
  spec.output_tokens = Fixed(4);
  spec.qos = {QosClassSpec{}};
  return spec;
}

std::string WriteFile(const std::string& name, const std::string& content) {
  const std::string path = TestTmpPath(name);
  std::ofstream(path) << content;
  return path;
}

// Mean and coefficient of variation of the gaps between arrivals.
std::pair<double, double> GapMeanAndCv(const std::vector<PlannedRequest>& schedule) {
  std::vector<double> gaps;
  absl::Duration prev = absl::ZeroDuration();
  for (const PlannedRequest& r : schedule) {
    gaps.push_back(absl::ToDoubleSeconds(r.send_offset - prev));
    prev = r.send_offset;
  }
  double mean = 0;
  for (double g : gaps) mean += g;
  mean /= static_cast<double>(gaps.size());
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= static_cast<double>(gaps.size() - 1);
  return {mean, std::sqrt(var) / mean};
}

// ---------------------------------------------------------------------------
// Arrivals and the schedule.

TEST(ArrivalTest, PoissonGapsHaveMeanOneOverRateAndUnitCv) {
  WorkloadSpec spec = BasicSpec(Seed(42));
  spec.num_requests = 20000;
  absl::StatusOr<std::vector<PlannedRequest>> schedule = GenerateSchedule(spec);
  ASSERT_THAT(schedule, IsOk());
  ASSERT_EQ(schedule->size(), 20000u);
  const auto [mean, cv] = GapMeanAndCv(*schedule);
  EXPECT_THAT(mean, DoubleNear(0.1, 0.003));
  EXPECT_THAT(cv, DoubleNear(1.0, 0.03));
}

TEST(ArrivalTest, GammaShapeSetsBurstinessAtTheSameRate) {
  for (double shape : {0.25, 1.0, 4.0}) {
    WorkloadSpec spec = BasicSpec(Seed(7));
    spec.arrival = {.kind = ArrivalKind::kGamma, .rate_per_s = 20, .gamma_shape = shape};
    spec.num_requests = 20000;
    absl::StatusOr<std::vector<PlannedRequest>> schedule = GenerateSchedule(spec);
    ASSERT_THAT(schedule, IsOk());
    const auto [mean, cv] = GapMeanAndCv(*schedule);
    EXPECT_THAT(mean, DoubleNear(0.05, 0.05 * 0.04)) << "shape " << shape;
    EXPECT_THAT(cv, DoubleNear(1.0 / std::sqrt(shape), 0.05 / std::sqrt(shape)))
        << "shape " << shape;
  }
}

TEST(ArrivalTest, RejectsBadRateAndShape) {
  WorkloadSpec spec = BasicSpec(Seed(1));
  spec.arrival.rate_per_s = 0;
  EXPECT_THAT(GenerateSchedule(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--rate")));
  spec.arrival = {.kind = ArrivalKind::kGamma, .rate_per_s = 1, .gamma_shape = -1};
  EXPECT_THAT(GenerateSchedule(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--gamma_shape")));
  EXPECT_THAT(ParseArrivalKind("bursty"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--arrival")));
  EXPECT_THAT(ParseArrivalKind("gamma"), IsOk());
}

TEST(ScheduleTest, SameSeedGivesTheSameScheduleAndAnotherSeedDoesNot) {
  WorkloadSpec spec = BasicSpec(Seed(1234));
  spec.prompt_tokens.kind = LengthDistribution::Kind::kUniform;
  spec.prompt_tokens.min_tokens = 1;
  spec.prompt_tokens.max_tokens = 1000;
  absl::StatusOr<std::vector<PlannedRequest>> a = GenerateSchedule(spec);
  absl::StatusOr<std::vector<PlannedRequest>> b = GenerateSchedule(spec);
  spec.seed = 1235;
  absl::StatusOr<std::vector<PlannedRequest>> c = GenerateSchedule(spec);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  ASSERT_THAT(c, IsOk());
  ASSERT_EQ(a->size(), b->size());
  int differing = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].send_offset, (*b)[i].send_offset);
    EXPECT_EQ((*a)[i].prompt_tokens, (*b)[i].prompt_tokens);
    EXPECT_EQ((*a)[i].prompt_seed, (*b)[i].prompt_seed);
    EXPECT_EQ((*a)[i].index, static_cast<int64_t>(i));
    if ((*a)[i].send_offset != (*c)[i].send_offset) ++differing;
    if (i > 0) {
      EXPECT_GE((*a)[i].send_offset, (*a)[i - 1].send_offset);
    }
  }
  EXPECT_GT(differing, 90);
}

TEST(ScheduleTest, ChangingTheLengthsLeavesArrivalTimesUnchanged) {
  WorkloadSpec spec = BasicSpec(Seed(99));
  absl::StatusOr<std::vector<PlannedRequest>> a = GenerateSchedule(spec);
  spec.output_tokens.kind = LengthDistribution::Kind::kUniform;
  spec.output_tokens.min_tokens = 1;
  spec.output_tokens.max_tokens = 50;
  absl::StatusOr<std::vector<PlannedRequest>> b = GenerateSchedule(spec);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  std::set<int32_t> outputs;
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].send_offset, (*b)[i].send_offset);
    outputs.insert((*b)[i].output_tokens);
  }
  EXPECT_GT(outputs.size(), 20u);
}

TEST(ScheduleTest, DurationStopsArrivalsAndFirstStopConditionWins) {
  WorkloadSpec spec = BasicSpec(Seed(5));
  spec.num_requests = 0;
  spec.duration = absl::Seconds(100);
  absl::StatusOr<std::vector<PlannedRequest>> by_duration = GenerateSchedule(spec);
  ASSERT_THAT(by_duration, IsOk());
  // 1000 expected; Poisson sd ~32.
  EXPECT_THAT(static_cast<int>(by_duration->size()), AllOf(Ge(880), Le(1120)));
  EXPECT_LT(by_duration->back().send_offset, absl::Seconds(100));

  spec.num_requests = 10;
  absl::StatusOr<std::vector<PlannedRequest>> both = GenerateSchedule(spec);
  ASSERT_THAT(both, IsOk());
  EXPECT_EQ(both->size(), 10u);

  spec.num_requests = 0;
  spec.duration = absl::ZeroDuration();
  EXPECT_THAT(GenerateSchedule(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--num_requests")));
}

TEST(ScheduleTest, RequestsBeforeTheWarmupAreNotMeasured) {
  WorkloadSpec spec = BasicSpec(Seed(11));
  spec.warmup = absl::Seconds(3);
  absl::StatusOr<std::vector<PlannedRequest>> schedule = GenerateSchedule(spec);
  ASSERT_THAT(schedule, IsOk());
  int warm = 0;
  for (const PlannedRequest& r : *schedule) {
    EXPECT_EQ(r.measured, r.send_offset >= absl::Seconds(3));
    warm += r.measured ? 0 : 1;
  }
  EXPECT_GT(warm, 10);
  EXPECT_LT(warm, 100);
}

// ---------------------------------------------------------------------------
// Lengths.

TEST(LengthTest, FixedAndUniformStayInRangeAndReachBothEnds) {
  absl::StatusOr<LengthDistribution> fixed =
      ParseLengthDistribution("fixed:17", LengthColumn::kPrompt, "--prompt_tokens");
  absl::StatusOr<LengthDistribution> uniform =
      ParseLengthDistribution("uniform:3:9", LengthColumn::kOutput, "--output_tokens");
  ASSERT_THAT(fixed, IsOk());
  ASSERT_THAT(uniform, IsOk());
  WorkloadSpec spec = BasicSpec(Seed(3));
  spec.num_requests = 2000;
  spec.prompt_tokens = *fixed;
  spec.output_tokens = *uniform;
  absl::StatusOr<std::vector<PlannedRequest>> schedule = GenerateSchedule(spec);
  ASSERT_THAT(schedule, IsOk());
  std::set<int32_t> outputs;
  for (const PlannedRequest& r : *schedule) {
    EXPECT_EQ(r.prompt_tokens, 17);
    outputs.insert(r.output_tokens);
  }
  EXPECT_THAT(outputs, ElementsAre(3, 4, 5, 6, 7, 8, 9));
}

TEST(LengthTest, RejectsMalformedSpecsNamingTheFlag) {
  for (const char* bad :
       {"fixed:0", "uniform:5:3", "fixed:abc", "poisson:3", "uniform:4", "csv:"}) {
    EXPECT_THAT(ParseLengthDistribution(bad, LengthColumn::kPrompt, "--prompt_tokens"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--prompt_tokens")))
        << bad;
  }
}

TEST(LengthTest, CsvRowsAreSampledJointlyWithReplacement) {
  const std::string path = WriteFile(
      "lengths.csv", "note,output_tokens,prompt_tokens\r\nx,1,100\r\n\r\ny,2,200\nz,3,300\n");
  absl::StatusOr<LengthDistribution> prompt =
      ParseLengthDistribution("csv:" + path, LengthColumn::kPrompt, "--prompt_tokens");
  absl::StatusOr<LengthDistribution> output =
      ParseLengthDistribution("csv:" + path, LengthColumn::kOutput, "--output_tokens");
  ASSERT_THAT(prompt, IsOk());
  ASSERT_THAT(output, IsOk());
  ASSERT_EQ(prompt->csv_rows.size(), 3u);
  WorkloadSpec spec = BasicSpec(Seed(21));
  spec.prompt_tokens = *prompt;
  spec.output_tokens = *output;
  absl::StatusOr<std::vector<PlannedRequest>> schedule = GenerateSchedule(spec);
  ASSERT_THAT(schedule, IsOk());
  std::set<int32_t> seen;
  for (const PlannedRequest& r : *schedule) {
    // Both lengths come from one row of the file.
    EXPECT_EQ(r.prompt_tokens, 100 * r.output_tokens);
    seen.insert(r.output_tokens);
  }
  EXPECT_THAT(seen, ElementsAre(1, 2, 3));
}

TEST(LengthTest, BadCsvRowsNameTheFileAndLine) {
  EXPECT_THAT(
      ParseLengthCsv("prompt_tokens,output_tokens\n5,6\n7\n", "a.csv"),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a.csv:3: expected 2 fields")));
  EXPECT_THAT(ParseLengthCsv("prompt_tokens,output_tokens\n5,six\n", "b.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b.csv:2: output_tokens \"six\" is not an integer")));
  EXPECT_THAT(ParseLengthCsv("prompt_tokens,output_tokens\n\n0,4\n", "c.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("c.csv:3: prompt_tokens must be at least 1")));
  EXPECT_THAT(ParseLengthCsv("prompt,output\n5,6\n", "d.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("d.csv:1: the header")));
  EXPECT_THAT(ParseLengthCsv("prompt_tokens,output_tokens\n", "e.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("e.csv: no data rows")));
  EXPECT_THAT(ParseLengthCsv("", "f.csv"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("f.csv: empty")));
  const std::string missing = TestTmpPath("no-such.csv");
  EXPECT_THAT(ParseLengthDistribution("csv:" + missing, LengthColumn::kOutput, "--output_tokens"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("--output_tokens"), HasSubstr(missing))));
}

// ---------------------------------------------------------------------------
// QoS.

TEST(QosTest, ParsesAMixWithPerClassTargetsAndDefaults) {
  const SloTargets defaults{.ttft = absl::Milliseconds(1000), .tpot = std::nullopt};
  absl::StatusOr<std::vector<QosClassSpec>> mix =
      ParseQosMix("interactive:3:ttft=200:tpot=50,batch:7", defaults);
  ASSERT_THAT(mix, IsOk());
  ASSERT_EQ(mix->size(), 2u);
  EXPECT_EQ((*mix)[0].name, "interactive");
  EXPECT_DOUBLE_EQ((*mix)[0].weight, 0.3);
  EXPECT_EQ((*mix)[0].slo.ttft, absl::Milliseconds(200));
  EXPECT_EQ((*mix)[0].slo.tpot, absl::Milliseconds(50));
  EXPECT_EQ((*mix)[1].name, "batch");
  EXPECT_DOUBLE_EQ((*mix)[1].weight, 0.7);
  EXPECT_EQ((*mix)[1].slo.ttft, absl::Milliseconds(1000));
  EXPECT_FALSE((*mix)[1].slo.tpot.has_value());

  absl::StatusOr<std::vector<QosClassSpec>> none = ParseQosMix("", defaults);
  ASSERT_THAT(none, IsOk());
  ASSERT_EQ(none->size(), 1u);
  EXPECT_EQ((*none)[0].name, "");
  EXPECT_EQ((*none)[0].slo.ttft, absl::Milliseconds(1000));
}

TEST(QosTest, RejectsBadMixes) {
  for (const char* bad :
       {"a:1,a:2", "a:-1", "a:0", "a:1:ttft=0", "a:1:latency=5", "a:1:2", ":1", "has space:1"}) {
    EXPECT_THAT(ParseQosMix(bad, SloTargets{}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--qos")))
        << bad;
  }
}

TEST(QosTest, ScheduleDrawsClassesInProportion) {
  WorkloadSpec spec = BasicSpec(Seed(77));
  spec.num_requests = 10000;
  absl::StatusOr<std::vector<QosClassSpec>> mix =
      ParseQosMix("interactive:0.3:ttft=200,batch:0.7:ttft=5000", SloTargets{});
  ASSERT_THAT(mix, IsOk());
  spec.qos = *mix;
  absl::StatusOr<std::vector<PlannedRequest>> schedule = GenerateSchedule(spec);
  ASSERT_THAT(schedule, IsOk());
  int interactive = 0;
  for (const PlannedRequest& r : *schedule) {
    if (r.qos_class == "interactive") {
      ++interactive;
      EXPECT_EQ(r.slo.ttft, absl::Milliseconds(200));
    } else {
      EXPECT_EQ(r.qos_class, "batch");
      EXPECT_EQ(r.slo.ttft, absl::Milliseconds(5000));
    }
  }
  // 3000 expected; binomial sd ~46.
  EXPECT_THAT(interactive, AllOf(Ge(2800), Le(3200)));
}

// ---------------------------------------------------------------------------
// Prompts and pacing.

TEST(PromptTest, IdsAreDeterministicInRangeAndAvoidSpecialTokens) {
  const PromptVocabulary vocab{.vocab_size = 16, .excluded_ids = {0, 15, 7, 7, 99}};
  absl::StatusOr<std::vector<int32_t>> a = MakePromptTokenIds(Seed(8), 5000, vocab);
  absl::StatusOr<std::vector<int32_t>> b = MakePromptTokenIds(8, 5000, vocab);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(*a, *b);
  const std::set<int32_t> seen(a->begin(), a->end());
  EXPECT_THAT(seen, ElementsAre(1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14));
  EXPECT_THAT(MakePromptTokenIds(1, 4, PromptVocabulary{.vocab_size = 2, .excluded_ids = {0, 1}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab_size 2")));
}

TEST(OpenLoopPacerTest, ReleasesEachRequestAtItsTimeRegardlessOfResponses) {
  FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  OpenLoopPacer pacer({absl::Milliseconds(10), absl::Milliseconds(10), absl::Milliseconds(25),
                       absl::Milliseconds(40)},
                      clock.Now());
  EXPECT_TRUE(pacer.TakeDue(clock.Now()).empty());
  EXPECT_EQ(pacer.next_send_time(), clock.Now() + absl::Milliseconds(10));
  clock.Advance(absl::Milliseconds(10));
  EXPECT_THAT(pacer.TakeDue(clock.Now()), ElementsAre(0, 1));
  clock.Advance(absl::Milliseconds(14));
  EXPECT_TRUE(pacer.TakeDue(clock.Now()).empty());
  // A late sender catches up with everything due at once.
  clock.Advance(absl::Milliseconds(30));
  EXPECT_THAT(pacer.TakeDue(clock.Now()), ElementsAre(2, 3));
  EXPECT_TRUE(pacer.done());
}

// ---------------------------------------------------------------------------
// Metrics.

TEST(StatsTest, PercentilesInterpolateLikeNumpy) {
  std::vector<double> values;
  for (int i = 100; i >= 1; --i) values.push_back(i);
  const LatencyStats s = ComputeStats(values);
  EXPECT_EQ(s.count, 100);
  EXPECT_DOUBLE_EQ(s.mean_ms, 50.5);
  EXPECT_DOUBLE_EQ(s.p50_ms, 50.5);
  EXPECT_THAT(s.p90_ms, DoubleNear(90.1, 1e-9));
  EXPECT_THAT(s.p99_ms, DoubleNear(99.01, 1e-9));
  EXPECT_DOUBLE_EQ(s.max_ms, 100);
  const LatencyStats one = ComputeStats({4.0});
  EXPECT_DOUBLE_EQ(one.p50_ms, 4.0);
  EXPECT_DOUBLE_EQ(one.p99_ms, 4.0);
  EXPECT_EQ(ComputeStats({}).count, 0);
}

TEST(StatsTest, RejectionReasonsGroupMessagesThatDifferInNumbers) {
  EXPECT_EQ(RejectionReason(absl::ResourceExhaustedError("predicted TTFT 312 ms  > target 200 ms")),
            "predicted TTFT # ms > target # ms");
  EXPECT_EQ(
      RejectionReason(absl::ResourceExhaustedError("predicted TTFT 290.5 ms > target 200 ms")),
      "predicted TTFT #.# ms > target # ms");
  EXPECT_EQ(RejectionReason(absl::UnavailableError("")), "(no message)");
  EXPECT_EQ(RejectionReason(absl::UnknownError(std::string(300, 'x'))).size(), 120u);
}

// Builds records through RequestRecorder with a FakeClock per request, so
// every latency is known exactly.
class SummaryTest : public ::testing::Test {
 protected:
  // A request scheduled at `offset_ms` and sent then, whose tokens arrive in
  // chunks `chunk_ms` after the send (`tokens_per_chunk` each).
  RequestRecord Completed(int64_t index, int offset_ms, std::vector<int> chunk_ms,
                          SloTargets slo = {}, int tokens_per_chunk = 1, bool measured = true) {
    FakeClock clock(start_);
    RequestRecorder recorder(&clock, Planned(index, offset_ms, slo, measured));
    const absl::Time sent = start_ + absl::Milliseconds(offset_ms);
    clock.SetTime(sent);
    recorder.Sent();
    for (int ms : chunk_ms) {
      clock.SetTime(sent + absl::Milliseconds(ms));
      recorder.Chunk(tokens_per_chunk);
    }
    recorder.Chunk(0);  // An empty chunk is no token.
    const int32_t tokens = static_cast<int32_t>(chunk_ms.size()) * tokens_per_chunk;
    recorder.Complete(FinishReason::kLength, tokens);
    clock.SetTime(sent + absl::Milliseconds(chunk_ms.back() + 1));
    return recorder.Done(absl::OkStatus());
  }

  RequestRecord Rejected(int64_t index, int offset_ms, int reject_after_ms, absl::Status status) {
    FakeClock clock(start_);
    RequestRecorder recorder(&clock, Planned(index, offset_ms, {}, true));
    clock.SetTime(start_ + absl::Milliseconds(offset_ms));
    recorder.Sent();
    clock.Advance(absl::Milliseconds(reject_after_ms));
    return recorder.Done(std::move(status));
  }

  RequestRecord Planned(int64_t index, int offset_ms, SloTargets slo, bool measured) {
    RequestRecord r;
    r.planned.index = index;
    r.planned.send_offset = absl::Milliseconds(offset_ms);
    r.planned.prompt_tokens = 10;
    r.planned.output_tokens = 4;
    r.planned.slo = slo;
    r.planned.measured = measured;
    r.scheduled = start_ + r.planned.send_offset;
    return r;
  }

  const absl::Time start_ = absl::FromUnixSeconds(1'700'000'000);
};

TEST_F(SummaryTest, LatenciesOfOneRequestFollowTheirDefinitions) {
  // Sent at 0; tokens at 100, 110, 130, 160 ms after the send.
  const RequestRecord r = Completed(0, 0, {100, 110, 130, 160});
  EXPECT_EQ(OutcomeOf(r), Outcome::kCompleted);
  EXPECT_EQ(TimeToFirstToken(r), absl::Milliseconds(100));
  EXPECT_EQ(TimePerOutputToken(r), absl::Milliseconds(20));
  EXPECT_THAT(InterTokenLatencies(r),
              ElementsAre(absl::Milliseconds(10), absl::Milliseconds(20), absl::Milliseconds(30)));
  // Two tokens per chunk: the gap is split over the chunk's tokens.
  const RequestRecord pairs = Completed(1, 0, {50, 70}, {}, /*tokens_per_chunk=*/2);
  EXPECT_EQ(TimePerOutputToken(pairs), absl::Milliseconds(20) / 3);
  EXPECT_THAT(InterTokenLatencies(pairs),
              ElementsAre(absl::Milliseconds(10), absl::Milliseconds(10)));
}

TEST_F(SummaryTest, GoodputCountsOnlyRequestsThatMetEverySlo) {
  const SloTargets slo{.ttft = absl::Milliseconds(150), .tpot = absl::Milliseconds(25)};
  std::vector<RequestRecord> records;
  // Met both targets.
  records.push_back(Completed(0, 0, {100, 110, 130, 160}, slo));
  // TTFT 200 > 150.
  records.push_back(Completed(1, 1000, {200, 210, 220, 230}, slo));
  // TPOT 50 > 25.
  records.push_back(Completed(2, 2000, {100, 150, 200, 250}, slo));
  // No targets: met.
  records.push_back(Completed(3, 3000, {10, 20, 30, 40}));
  // Rejected twice for overload with RetryInfo (numbers differ), once invalid.
  records.push_back(
      Rejected(4, 3500, 2, ResourceExhaustedWithRetry("predicted TTFT 900 ms", absl::Seconds(1))));
  records.push_back(
      Rejected(5, 3600, 4, ResourceExhaustedWithRetry("predicted TTFT 950 ms", absl::Seconds(3))));
  records.push_back(Rejected(6, 3700, 1, absl::InvalidArgumentError("prompt: too long")));
  // Failed after a token: not rejected, counts against attainment.
  RequestRecord failed = Completed(7, 3800, {10});
  failed.finish_reason = FinishReason::kError;
  records.push_back(failed);
  // Dropped at the client.
  RequestRecord dropped = Planned(8, 3900, {}, true);
  dropped.dropped = true;
  records.push_back(dropped);
  // Warmup: never counted.
  records.push_back(Completed(9, 0, {1, 2, 3, 4}, slo, 1, /*measured=*/false));

  const Report report = Summarize(records, start_, absl::ZeroDuration());
  EXPECT_EQ(report.num_scheduled, 10);
  EXPECT_EQ(report.num_warmup, 1);
  EXPECT_EQ(report.num_measured, 9);
  EXPECT_EQ(report.num_completed, 4);
  EXPECT_EQ(report.num_rejected, 3);
  EXPECT_EQ(report.num_failed, 1);
  EXPECT_EQ(report.num_dropped, 1);
  EXPECT_EQ(report.num_slo_met, 2);
  EXPECT_EQ(report.num_wrong_length, 0);
  // The window ends when the last measured request ends: 3900 ms for the
  // drop's schedule, but request 3 ended at 3041 and request 7 at 3811.
  EXPECT_DOUBLE_EQ(report.measured_window_s, 3.9);
  EXPECT_DOUBLE_EQ(report.goodput_rps, 2 / 3.9);
  EXPECT_DOUBLE_EQ(report.request_throughput_rps, 4 / 3.9);
  EXPECT_DOUBLE_EQ(report.output_tokens_per_s, 17 / 3.9);
  EXPECT_DOUBLE_EQ(report.input_tokens_per_s, 40 / 3.9);
  ASSERT_TRUE(report.slo_attainment.has_value());
  EXPECT_DOUBLE_EQ(*report.slo_attainment, 2.0 / 5.0);
  EXPECT_EQ(report.ttft.count, 4);
  EXPECT_DOUBLE_EQ(report.ttft.p50_ms, 100);
  EXPECT_DOUBLE_EQ(report.ttft.max_ms, 200);
  EXPECT_DOUBLE_EQ(report.tpot.max_ms, 50);
  EXPECT_EQ(report.itl.count, 12);
  EXPECT_DOUBLE_EQ(report.e2e.max_ms, 251);
  // E2E per output token: 161/4, 231/4, 251/4 and 41/4 ms.
  EXPECT_EQ(report.normalized.count, 4);
  EXPECT_DOUBLE_EQ(report.normalized.mean_ms, (161.0 + 231 + 251 + 41) / 16);
  EXPECT_DOUBLE_EQ(report.normalized.max_ms, 251.0 / 4);

  EXPECT_EQ(report.rejections_by_code.at("RESOURCE_EXHAUSTED"), 2);
  EXPECT_EQ(report.rejections_by_code.at("INVALID_ARGUMENT"), 1);
  ASSERT_EQ(report.rejections.size(), 2u);
  const RejectionGroup& overload = report.rejections[0];
  EXPECT_EQ(overload.code, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(overload.reason, "predicted TTFT # ms");
  EXPECT_EQ(overload.count, 2);
  EXPECT_EQ(overload.with_retry_info, 2);
  EXPECT_DOUBLE_EQ(overload.time_to_reject.p50_ms, 3);
  EXPECT_DOUBLE_EQ(overload.time_to_reject.max_ms, 4);
  EXPECT_DOUBLE_EQ(overload.retry_delay.p50_ms, 2000);
  EXPECT_EQ(report.rejections[1].with_retry_info, 0);

  const nlohmann::json json = ReportToJson(report, {{"seed", 1}});
  EXPECT_EQ(json["config"]["seed"], 1);
  EXPECT_EQ(json["requests"]["completed"], 4);
  EXPECT_EQ(json["rejections"]["by_code"]["RESOURCE_EXHAUSTED"], 2);
  EXPECT_EQ(json["rejections"]["groups"][0]["time_to_reject_ms"]["p99"].get<double>(),
            overload.time_to_reject.p99_ms);
  EXPECT_DOUBLE_EQ(json["slo"]["attainment"].get<double>(), 0.4);
  EXPECT_EQ(json["per_class"]["(default)"]["failed"], 1);
  for (const char* metric : {"ttft", "tpot", "itl", "e2e", "normalized_per_token", "send_lag"}) {
    for (const char* field : {"count", "mean", "p50", "p90", "p99", "max"}) {
      EXPECT_TRUE(json["latency_ms"][metric].contains(field)) << metric << "." << field;
    }
  }
  EXPECT_THAT(FormatReport(report), HasSubstr("SLO attainment: 40.0% (2 of 5 accepted)"));
}

TEST_F(SummaryTest, WarmupShiftsTheWindowAndWrongLengthsAreCounted) {
  std::vector<RequestRecord> records;
  records.push_back(Completed(0, 500, {10, 20}, {}, 1, /*measured=*/false));
  records.push_back(Completed(1, 1500, {10, 20, 30}));  // Asked for 4, got 3.
  const Report report = Summarize(records, start_, absl::Seconds(1));
  EXPECT_EQ(report.num_measured, 1);
  EXPECT_EQ(report.num_wrong_length, 1);
  EXPECT_DOUBLE_EQ(report.measured_window_s, 0.531);
  EXPECT_THAT(FormatReport(report), HasSubstr("wrong output length"));
}

TEST_F(SummaryTest, NothingAcceptedGivesNullAttainment) {
  std::vector<RequestRecord> records;
  records.push_back(Rejected(0, 10, 1, absl::UnavailableError("draining")));
  const Report report = Summarize(records, start_, absl::ZeroDuration());
  EXPECT_FALSE(report.slo_attainment.has_value());
  EXPECT_TRUE(ReportToJson(report, {})["slo"]["attainment"].is_null());
  EXPECT_EQ(report.goodput_rps, 0);
}

TEST_F(SummaryTest, RequestsCsvHasAMeasuredRowEachWithItsLatencies) {
  const SloTargets slo{.ttft = absl::Milliseconds(150), .tpot = absl::Milliseconds(25)};
  std::vector<RequestRecord> records;
  records.push_back(Completed(0, 0, {1, 2, 3, 4}, slo, 1, /*measured=*/false));
  // TTFT 100, TPOT 20, E2E 161 ms; meets the targets.
  records.push_back(Completed(1, 1500, {100, 110, 130, 160}, slo));
  records.push_back(Rejected(2, 2250, 3, absl::ResourceExhaustedError("full")));
  records.back().planned.qos_class = "batch";
  EXPECT_EQ(RequestsCsv(records, start_),
            "index,qos_class,scheduled_s,outcome,prompt_tokens,output_tokens,tokens_received,"
            "ttft_ms,tpot_ms,e2e_ms,slo_met\n"
            "1,,1.500000,completed,10,4,4,100.000,20.000,161.000,1\n"
            "2,batch,2.250000,rejected,10,4,0,,,,0\n");
}

TEST_F(SummaryTest, ClientDeadlineIsAFailureNotARejection) {
  const RequestRecord r = Rejected(0, 0, 5, absl::DeadlineExceededError("Deadline Exceeded"));
  EXPECT_EQ(OutcomeOf(r), Outcome::kFailed);
}

// ---------------------------------------------------------------------------
// RecordBook.

TEST(RecordBookTest, DropsOverTheInFlightCapInsteadOfDelaying) {
  RecordBook book(/*max_in_flight=*/2);
  RequestRecord r;
  for (int i = 0; i < 3; ++i) {
    r.planned.index = i;
    EXPECT_EQ(book.TryAdmit(r), i < 2) << i;
  }
  EXPECT_EQ(book.progress().in_flight, 2);
  EXPECT_EQ(book.progress().dropped, 1);
  // Still busy: the wait gives up at once at a deadline in the past.
  EXPECT_FALSE(book.AwaitIdle(absl::InfinitePast()));
  r.planned.index = 0;
  book.Finish(r);
  r.planned.index = 1;
  r.status = absl::ResourceExhaustedError("full");
  book.Finish(r);
  EXPECT_TRUE(book.AwaitIdle(absl::InfinitePast()));
  const Progress p = book.progress();
  EXPECT_EQ(p.sent, 2);
  EXPECT_EQ(p.done, 1);
  EXPECT_EQ(p.rejected, 1);
  EXPECT_EQ(FormatProgress(absl::Seconds(3), p),
            "t=3s sent=2 in_flight=0 done=1 rejected=1 dropped=1");
  // A slot freed: the next request is admitted.
  r.planned.index = 3;
  EXPECT_TRUE(book.TryAdmit(r));
  book.Finish(r);
  std::vector<RequestRecord> records = book.TakeRecords();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_TRUE(records[2].dropped);
  EXPECT_EQ(records[3].planned.index, 3);
}

}  // namespace
}  // namespace trident::loadgen
