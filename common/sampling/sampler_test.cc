#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "common/sampling/philox.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::sampling {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::Pair;

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingParams Greedy() {
  SamplingParams params;
  params.temperature = 0.0f;
  return params;
}

std::vector<float> LogitsFromProbabilities(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (const double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

// Counts how often each token is drawn at output positions [0, n).
std::map<int32_t, int> Histogram(const std::vector<float>& logits, const SamplingParams& params,
                                 int n) {
  Sampler sampler;
  const PenaltyState none;
  std::map<int32_t, int> counts;
  for (int p = 0; p < n; ++p) ++counts[sampler.Sample(logits, params, none, p).token];
  return counts;
}

// Pearson's chi-square statistic of `counts` against `expected` probabilities.
double ChiSquare(const std::map<int32_t, int>& counts, const std::map<int32_t, double>& expected,
                 int n) {
  double chi2 = 0;
  for (const auto& [token, p] : expected) {
    const auto it = counts.find(token);
    const double observed = it == counts.end() ? 0 : it->second;
    chi2 += (observed - n * p) * (observed - n * p) / (n * p);
  }
  return chi2;
}

// A straightforward rendering of the pipeline in sampler.h (full sorts, no
// windows), against which the optimized Sampler is compared token for token.
int32_t ReferenceSample(std::vector<float> x, const SamplingParams& params,
                        const PenaltyState& penalties, int64_t position) {
  ApplyPenalties(absl::MakeSpan(x), params, penalties);
  const int32_t vocab = static_cast<int32_t>(x.size());
  for (float& v : x) {
    if (std::isnan(v)) v = -kInf;
  }
  if (params.temperature == 0.0f) {
    return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  }
  float m = -kInf;
  for (float& v : x) {
    v = v / params.temperature;
    m = std::max(m, v);
  }
  std::vector<float> w(vocab);
  for (int32_t i = 0; i < vocab; ++i) w[i] = x[i] == m ? 1.0f : std::exp(x[i] - m);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return w[a] > w[b]; });
  std::vector<bool> keep(vocab, true);
  int32_t kept = vocab;
  if (params.top_k > 0 && params.top_k < vocab) kept = params.top_k;
  if (params.top_p < 1.0f) {
    double total = 0;
    if (kept == vocab) {
      for (int32_t i = 0; i < vocab; ++i) total += w[i];  // Id order, as specified.
    } else {
      for (int32_t j = 0; j < kept; ++j) total += w[order[j]];
    }
    double mass = 0;
    int32_t j = 0;
    while (j < kept && mass < params.top_p * total) mass += w[order[j++]];
    kept = j;
  }
  for (int32_t j = kept; j < vocab; ++j) keep[order[j]] = false;
  for (int32_t i = 0; i < vocab; ++i) {
    if (w[i] < params.min_p) keep[i] = false;
  }
  double total = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (keep[i]) total += w[i];
  }
  const double target = UniformFromPhilox(params.seed, position) * total;
  double cumulative = 0;
  int32_t last = -1;
  for (int32_t i = 0; i < vocab; ++i) {
    if (!keep[i] || w[i] <= 0.0f) continue;
    cumulative += w[i];
    last = i;
    if (cumulative > target) return i;
  }
  return last;
}

TEST(SamplerTest, GreedyPicksTheLargestLogit) {
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.9f};
  EXPECT_EQ(Sample(logits, Greedy(), PenaltyState(), 0).token, 1);
}

TEST(SamplerTest, GreedyBreaksTiesTowardTheLowestId) {
  const std::vector<float> logits = {1.0f, 4.0f, 2.0f, 4.0f, 4.0f};
  for (int64_t p = 0; p < 5; ++p) EXPECT_EQ(Sample(logits, Greedy(), PenaltyState(), p).token, 1);
}

TEST(SamplerTest, GreedyIgnoresNaN) {
  const std::vector<float> logits = {std::nanf(""), 1.0f, std::nanf(""), 0.0f};
  EXPECT_EQ(Sample(logits, Greedy(), PenaltyState(), 0).token, 1);
}

TEST(SamplerTest, AllImpossibleLogitsGiveTokenZero) {
  const std::vector<float> logits = {-kInf, -kInf, std::nanf("")};
  SamplingParams params;
  params.seed = 3;
  EXPECT_EQ(Sample(logits, params, PenaltyState(), 0).token, 0);
  EXPECT_EQ(Sample(logits, Greedy(), PenaltyState(), 0).token, 0);
}

TEST(SamplerTest, NegativeInfinityIsNeverSampled) {
  const std::vector<float> logits = {-kInf, 0.0f, -kInf, 0.0f, std::nanf("")};
  SamplingParams params;
  params.seed = 99;
  const std::map<int32_t, int> counts = Histogram(logits, params, 2000);
  EXPECT_EQ(counts.count(0) + counts.count(2) + counts.count(4), 0u);
  EXPECT_GT(counts.at(1), 800);
  EXPECT_GT(counts.at(3), 800);
}

TEST(SamplerTest, TinyTemperatureBehavesLikeGreedy) {
  const std::vector<float> logits = {0.1f, 0.3f, 0.25f, 0.29f};
  for (const float t : {1e-3f, 1e-20f, 1e-38f}) {
    SamplingParams params;
    params.temperature = t;
    params.seed = 7;
    EXPECT_THAT(Histogram(logits, params, 500), ElementsAre(Pair(1, 500))) << "t=" << t;
  }
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  std::mt19937 rng(1234);  // Seed printed by the test name; fixed.
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = normal(rng);
  const int32_t greedy = Sample(logits, Greedy(), PenaltyState(), 0).token;
  SamplingParams params;
  params.top_k = 1;
  params.seed = 5;
  EXPECT_THAT(Histogram(logits, params, 300), ElementsAre(Pair(greedy, 300)));
}

TEST(SamplerTest, TinyTopPEqualsGreedy) {
  std::mt19937 rng(4321);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(5000);
  for (float& x : logits) x = normal(rng);
  const int32_t greedy = Sample(logits, Greedy(), PenaltyState(), 0).token;
  SamplingParams params;
  params.top_p = 1e-6f;
  params.seed = 11;
  EXPECT_THAT(Histogram(logits, params, 300), ElementsAre(Pair(greedy, 300)));
}

TEST(SamplerTest, SampledFrequenciesMatchTheSoftmax) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  SamplingParams params;
  params.seed = 20240601;
  constexpr int kDraws = 20000;
  const std::map<int32_t, int> counts = Histogram(LogitsFromProbabilities(probs), params, kDraws);
  // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
  EXPECT_LT(ChiSquare(counts, {{0, 0.1}, {1, 0.2}, {2, 0.3}, {3, 0.4}}, kDraws), 16.27)
      << "seed " << params.seed;
}

TEST(SamplerTest, TemperatureSharpensTheDistribution) {
  // At temperature 0.5, probabilities go as p^2: 1, 4, 9, 16 over 30.
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  SamplingParams params;
  params.temperature = 0.5f;
  params.seed = 77;
  constexpr int kDraws = 20000;
  const std::map<int32_t, int> counts = Histogram(LogitsFromProbabilities(probs), params, kDraws);
  EXPECT_LT(
      ChiSquare(counts, {{0, 1 / 30.0}, {1, 4 / 30.0}, {2, 9 / 30.0}, {3, 16 / 30.0}}, kDraws),
      16.27)
      << "seed " << params.seed;
}

TEST(SamplerTest, TopKRenormalizesOverTheKLargest) {
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  SamplingParams params;
  params.top_k = 2;
  params.seed = 8;
  constexpr int kDraws = 20000;
  const std::map<int32_t, int> counts = Histogram(LogitsFromProbabilities(probs), params, kDraws);
  ASSERT_EQ(counts.size(), 2u);
  // 1 degree of freedom: P(chi2 > 10.83) = 0.001.
  EXPECT_LT(ChiSquare(counts, {{2, 3 / 7.0}, {3, 4 / 7.0}}, kDraws), 10.83);
}

TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  // Sorted: 0.4 (id 3), 0.3 (id 0), 0.2 (id 2), 0.1 (id 1). top_p 0.6 keeps
  // ids 3 and 0 (0.4 < 0.6 before id 0; 0.7 >= 0.6 before id 2).
  const std::vector<double> probs = {0.3, 0.1, 0.2, 0.4};
  SamplingParams params;
  params.top_p = 0.6f;
  params.seed = 9;
  constexpr int kDraws = 20000;
  const std::map<int32_t, int> counts = Histogram(LogitsFromProbabilities(probs), params, kDraws);
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_LT(ChiSquare(counts, {{0, 3 / 7.0}, {3, 4 / 7.0}}, kDraws), 10.83);
}

TEST(SamplerTest, MinPDropsTokensBelowFractionOfTheTopProbability) {
  // min_p 0.5 of the top 0.5 keeps probabilities >= 0.25: ids 0 and 1.
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  SamplingParams params;
  params.min_p = 0.5f;
  params.seed = 10;
  constexpr int kDraws = 20000;
  const std::map<int32_t, int> counts = Histogram(LogitsFromProbabilities(probs), params, kDraws);
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_LT(ChiSquare(counts, {{0, 5 / 8.0}, {1, 3 / 8.0}}, kDraws), 10.83);
}

TEST(SamplerTest, PenaltiesHaveExactValues) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
  PenaltyState state(std::vector<int32_t>{0, 0});
  state.AddOutputToken(1);
  state.AddOutputToken(2);
  state.AddOutputToken(2);
  state.AddOutputToken(99);  // Outside the vocabulary: ignored.
  SamplingParams params;
  params.repetition_penalty = 2.0f;
  params.frequency_penalty = 0.5f;
  params.presence_penalty = 0.25f;
  ApplyPenalties(absl::MakeSpan(logits), params, state);
  EXPECT_THAT(logits, ElementsAre(FloatEq(1.0f),    // 2 / 2 (prompt only).
                                  FloatEq(-4.75f),  // -2 * 2 - 0.5 * 1 - 0.25.
                                  FloatEq(-0.75f),  // 1 / 2 - 0.5 * 2 - 0.25.
                                  FloatEq(0.5f),    // Never seen.
                                  FloatEq(3.0f)));  // Never seen.
  EXPECT_EQ(state.OutputCount(2), 2);
  EXPECT_EQ(state.OutputCount(0), 0);
  EXPECT_EQ(state.num_output_tokens(), 4);
}

TEST(SamplerTest, PenaltiesChangeTheGreedyChoiceButNotTheLogprobs) {
  const std::vector<float> logits = {2.0f, 1.9f};
  PenaltyState state;
  state.AddOutputToken(0);
  SamplingParams params = Greedy();
  params.presence_penalty = 0.5f;
  params.logprobs = true;
  const SampledToken sampled = Sample(logits, params, state, 0);
  EXPECT_EQ(sampled.token, 1);
  // log_softmax of the raw logits: 1.9 - log(e^2 + e^1.9).
  EXPECT_NEAR(sampled.logprob, 1.9 - std::log(std::exp(2.0) + std::exp(1.9)), 1e-6);
}

TEST(SamplerTest, LogprobsAndTopLogprobs) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  SamplingParams params = Greedy();
  params.top_logprobs = 3;
  const SampledToken sampled = Sample(logits, params, PenaltyState(), 0);
  const double log_z = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  EXPECT_EQ(sampled.token, 1);
  EXPECT_NEAR(sampled.logprob, 3.0 - log_z, 1e-6);
  ASSERT_EQ(sampled.top_logprobs.size(), 3u);
  EXPECT_EQ(sampled.top_logprobs[0].first, 1);
  EXPECT_EQ(sampled.top_logprobs[1].first, 3);
  EXPECT_EQ(sampled.top_logprobs[2].first, 2);
  EXPECT_NEAR(sampled.top_logprobs[0].second, 3.0 - log_z, 1e-6);
  EXPECT_NEAR(sampled.top_logprobs[2].second, 2.0 - log_z, 1e-6);
}

TEST(SamplerTest, NoLogprobsUnlessAsked) {
  const std::vector<float> logits = {1.0f, 3.0f};
  const SampledToken sampled = Sample(logits, Greedy(), PenaltyState(), 0);
  EXPECT_EQ(sampled.logprob, 0.0f);
  EXPECT_TRUE(sampled.top_logprobs.empty());
}

TEST(SamplerTest, TopLogprobsLargerThanVocabularyReturnsEveryToken) {
  const std::vector<float> logits = {0.0f, 1.0f};
  SamplingParams params;
  params.top_logprobs = 20;
  EXPECT_EQ(Sample(logits, params, PenaltyState(), 0).top_logprobs.size(), 2u);
}

TEST(SamplerTest, SameSeedAndPositionGiveTheSameTokenRegardlessOfHistory) {
  std::mt19937 rng(555);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(8000);
  for (float& x : logits) x = normal(rng);
  SamplingParams params;
  params.seed = 0xdeadbeef;
  params.top_p = 0.9f;

  Sampler fresh;
  std::vector<int32_t> first;
  for (int64_t p = 0; p < 50; ++p) first.push_back(fresh.Sample(logits, params, {}, p).token);

  // A reused sampler that sampled other things in between, positions in reverse.
  Sampler reused;
  SamplingParams other;
  other.seed = 1;
  other.top_k = 5;
  for (int64_t p = 49; p >= 0; --p) {
    reused.Sample(logits, other, {}, p);
    EXPECT_EQ(reused.Sample(logits, params, {}, p).token, first[p]) << "position " << p;
  }
  // Draws vary with position: 50 positions over a flat distribution are not all equal.
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 10u);

  SamplingParams reseeded = params;
  reseeded.seed = params.seed + 1;
  int same = 0;
  for (int64_t p = 0; p < 50; ++p) same += fresh.Sample(logits, reseeded, {}, p).token == first[p];
  EXPECT_LT(same, 10);
}

struct ReferenceCase {
  int32_t vocab;
  float scale;  // Logit standard deviation.
  SamplingParams params;
};

TEST(SamplerTest, MatchesTheReferencePipelineTokenForToken) {
  std::vector<ReferenceCase> cases;
  for (const int32_t vocab : {1, 7, 300, 3000, 20000}) {
    for (const float scale : {0.01f, 1.0f, 8.0f}) {
      SamplingParams p;
      p.seed = 1000 + vocab;
      cases.push_back({vocab, scale, p});
      p.top_k = 40;
      cases.push_back({vocab, scale, p});
      p.top_p = 0.8f;
      cases.push_back({vocab, scale, p});
      p.top_k = 0;
      cases.push_back({vocab, scale, p});  // top_p alone: windowed nucleus search.
      p.top_p = 0.999f;
      cases.push_back({vocab, scale, p});
      p.min_p = 0.05f;
      p.temperature = 0.7f;
      cases.push_back({vocab, scale, p});
      p.top_p = 1.0f;
      p.repetition_penalty = 1.3f;
      p.frequency_penalty = 0.4f;
      p.presence_penalty = -0.2f;
      cases.push_back({vocab, scale, p});
    }
  }
  std::mt19937 rng(2718);  // Fixed seed for the logits.
  PenaltyState penalties(std::vector<int32_t>{0, 3, 5});
  for (int32_t t = 0; t < 40; ++t) penalties.AddOutputToken(t % 9);
  Sampler sampler;
  for (size_t c = 0; c < cases.size(); ++c) {
    const ReferenceCase& rc = cases[c];
    std::normal_distribution<float> normal(0.0f, rc.scale);
    std::vector<float> logits(rc.vocab);
    for (float& x : logits) x = normal(rng);
    const int64_t positions = rc.vocab > 5000 ? 6 : 20;
    for (int64_t p = 0; p < positions; ++p) {
      ASSERT_EQ(sampler.Sample(logits, rc.params, penalties, p).token,
                ReferenceSample(logits, rc.params, penalties, p))
          << "case " << c << " vocab " << rc.vocab << " scale " << rc.scale << " top_k "
          << rc.params.top_k << " top_p " << rc.params.top_p << " min_p " << rc.params.min_p
          << " position " << p;
    }
  }
}

TEST(PenaltyStateTest, TracksDistinctTokensInFirstSeenOrder) {
  PenaltyState state(std::vector<int32_t>{5, 3, 5});
  state.AddOutputToken(7);
  state.AddOutputToken(3);
  state.AddOutputToken(7);
  EXPECT_THAT(state.seen_tokens(), ElementsAre(5, 3, 7));
  EXPECT_THAT(state.output_counts(), ElementsAre(Pair(7, 2), Pair(3, 1)));
  EXPECT_EQ(state.OutputCount(5), 0);
  EXPECT_EQ(state.OutputCount(7), 2);
}

}  // namespace
}  // namespace trident::sampling
