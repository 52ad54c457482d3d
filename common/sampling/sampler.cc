#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "common/logging/log.h"
#include "common/sampling/philox.h"

namespace trident::sampling {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// NaN sorts and compares as -inf, so comparators stay strict weak orders.
inline float Key(float x) { return std::isnan(x) ? kNegInf : x; }

// Lowest id among the largest values.
int32_t Argmax(absl::Span<const float> values) {
  int32_t best = 0;
  float best_value = Key(values[0]);
  for (size_t i = 1; i < values.size(); ++i) {
    const float v = Key(values[i]);
    if (v > best_value) {
      best_value = v;
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

// Larger value first, lower id first among equals. Values are never NaN.
struct ByWeightDescending {
  const float* weights;
  bool operator()(int32_t a, int32_t b) const {
    return weights[a] > weights[b] || (weights[a] == weights[b] && a < b);
  }
};

// The first index j of order[0, n) with (sum of weights before j) >= target;
// n when the prefix never reaches it. Always >= 1 when target > 0.
int32_t NucleusCut(const float* weights, const int32_t* order, int32_t n, double target,
                   double& mass) {
  for (int32_t j = 0; j < n; ++j) {
    if (mass >= target) return j;
    mass += weights[order[j]];
  }
  return n;
}

// Rearranges `order` so that its first n entries are the nucleus (in no
// particular order) and returns n: the smallest n such that the n
// largest weights (in ByWeightDescending order) sum to >= target, or
// order.size() if all of them do not. Quickselect on mass: each round
// partitions the undecided range around its median with nth_element and
// keeps the half the cut is in, so the expected cost is O(V), not a sort.
int32_t SelectNucleus(const float* weights, absl::Span<int32_t> order, double target) {
  const ByWeightDescending by_weight{weights};
  int32_t lo = 0;
  int32_t hi = static_cast<int32_t>(order.size());
  // Mass of order[0, lo), all of which is kept; invariant: mass < target.
  double mass = 0;
  constexpr int32_t kSortBelow = 256;
  while (hi - lo > kSortBelow) {
    const int32_t mid = lo + (hi - lo) / 2;
    std::nth_element(order.begin() + lo, order.begin() + mid, order.begin() + hi, by_weight);
    double left = 0;
    for (int32_t j = lo; j < mid; ++j) left += weights[order[j]];
    if (mass + left >= target) {
      hi = mid;  // The cut is in (lo, mid].
    } else {
      mass += left;
      lo = mid;
    }
  }
  std::sort(order.begin() + lo, order.begin() + hi, by_weight);
  return lo + NucleusCut(weights, order.data() + lo, hi - lo, target, mass);
}

// Sets `ids` to the ids of the n largest entries of `values` (NaN-free),
// ties going to lower ids, in ascending id order. Selects on plain floats in
// `tmp` (cheaper than selecting indices through a comparator) to find the
// n-th largest value, then keeps everything above it and the lowest ids
// among the ties at it. REQUIRES: 0 < n <= values.size().
void SelectTopN(absl::Span<const float> values, int32_t n, std::vector<float>& tmp,
                std::vector<int32_t>& ids) {
  tmp.assign(values.begin(), values.end());
  std::nth_element(tmp.begin(), tmp.begin() + (n - 1), tmp.end(), std::greater<float>());
  const float threshold = tmp[n - 1];
  int32_t ties_kept = n;
  for (const float v : values) ties_kept -= v > threshold;
  ids.clear();
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] > threshold || (values[i] == threshold && ties_kept-- > 0)) {
      ids.push_back(static_cast<int32_t>(i));
    }
  }
}

}  // namespace

void PenaltyState::AddPromptTokens(absl::Span<const int32_t> tokens) {
  for (const int32_t token : tokens) {
    if (index_.try_emplace(token, -1).second) seen_tokens_.push_back(token);
  }
}

void PenaltyState::AddOutputToken(int32_t token) {
  ++num_output_tokens_;
  auto [it, inserted] = index_.try_emplace(token, -1);
  if (inserted) seen_tokens_.push_back(token);
  if (it->second < 0) {
    it->second = static_cast<int32_t>(output_counts_.size());
    output_counts_.emplace_back(token, 0);
  }
  ++output_counts_[it->second].second;
}

int32_t PenaltyState::OutputCount(int32_t token) const {
  const auto it = index_.find(token);
  return it == index_.end() || it->second < 0 ? 0 : output_counts_[it->second].second;
}

void ApplyPenalties(absl::Span<float> logits, const SamplingParams& params,
                    const PenaltyState& state) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (params.repetition_penalty != 1.0f) {
    const float r = params.repetition_penalty;
    for (const int32_t token : state.seen_tokens()) {
      if (token < 0 || token >= vocab) continue;
      float& x = logits[token];
      x = x > 0 ? x / r : x * r;
    }
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (const auto& [token, count] : state.output_counts()) {
      if (token < 0 || token >= vocab) continue;
      float& x = logits[token];
      // Two subtractions, as vLLM applies them.
      x -= params.frequency_penalty * static_cast<float>(count);
      x -= params.presence_penalty;
    }
  }
}

SampledToken Sampler::Sample(absl::Span<const float> logits, const SamplingParams& params,
                             const PenaltyState& penalties, int64_t output_position) {
  TRIDENT_CHECK(!logits.empty()) << "sampling from an empty vocabulary";
  scratch_.assign(logits.begin(), logits.end());
  ApplyPenalties(absl::MakeSpan(scratch_), params, penalties);

  SampledToken result;
  result.token =
      params.temperature == 0.0f ? Argmax(scratch_) : SampleFromWeights(params, output_position);
  if (params.logprobs || params.top_logprobs > 0) {
    ComputeLogprobs(logits, params.top_logprobs, result);
  }
  return result;
}

int32_t Sampler::SampleFromWeights(const SamplingParams& params, int64_t output_position) {
  const int32_t vocab = static_cast<int32_t>(scratch_.size());
  float* w = scratch_.data();

  // Step 4: scaled logits, then weights relative to the maximum. Division
  // (not multiplication by 1/t) is the spec a kernel must follow.
  float max_scaled = kNegInf;
  for (int32_t i = 0; i < vocab; ++i) {
    w[i] = Key(w[i]) / params.temperature;
    max_scaled = std::max(max_scaled, w[i]);
  }
  if (max_scaled == kNegInf) return 0;
  for (int32_t i = 0; i < vocab; ++i) {
    // Equality first: a tiny temperature can push the maximum to +inf,
    // where inf - inf would be NaN.
    w[i] = w[i] == max_scaled ? 1.0f : std::exp(w[i] - max_scaled);
  }

  // Steps 5 and 6 zero the weights of the tokens they drop, so the draw
  // below can walk the whole vocabulary.
  const bool top_k = params.top_k > 0 && params.top_k < vocab;
  const bool top_p = params.top_p < 1.0f;
  const ByWeightDescending by_weight{w};
  if (top_k) {
    const int32_t k = params.top_k;
    SelectTopN(absl::MakeConstSpan(w, vocab), k, values_, order_);
    // order_ is ascending: zero everything between consecutive kept ids.
    int32_t next = 0;
    for (const int32_t id : order_) {
      while (next < id) w[next++] = 0.0f;
      next = id + 1;
    }
    while (next < vocab) w[next++] = 0.0f;
    if (top_p) {
      std::sort(order_.begin(), order_.end(), by_weight);
      double total = 0;
      for (int32_t j = 0; j < k; ++j) total += w[order_[j]];
      double mass = 0;
      const int32_t kept = NucleusCut(w, order_.data(), k, params.top_p * total, mass);
      for (int32_t j = kept; j < k; ++j) w[order_[j]] = 0.0f;
    }
  } else if (top_p) {
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    double total = 0;
    for (int32_t i = 0; i < vocab; ++i) total += w[i];
    const int32_t kept = SelectNucleus(w, absl::MakeSpan(order_), params.top_p * total);
    for (int32_t j = kept; j < vocab; ++j) w[order_[j]] = 0.0f;
  }

  // Step 7: min_p relative to the top probability, whose weight is 1.
  if (params.min_p > 0.0f) {
    for (int32_t i = 0; i < vocab; ++i) {
      if (w[i] < params.min_p) w[i] = 0.0f;
    }
  }

  // Step 8: inverse CDF in ascending id order.
  const float u = UniformFromPhilox(params.seed, static_cast<uint64_t>(output_position));
  double total = 0;
  for (int32_t i = 0; i < vocab; ++i) total += w[i];
  const double target = u * total;
  double cumulative = 0;
  int32_t last_positive = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (w[i] <= 0.0f) continue;
    cumulative += w[i];
    last_positive = i;
    if (cumulative > target) return i;
  }
  // Unreachable: the running sum ends at `total`, and u < 1 makes target < total.
  return last_positive;
}

void Sampler::ComputeLogprobs(absl::Span<const float> logits, int32_t top_n, SampledToken& result) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  // The sampling pipeline is done with scratch_: reuse it for NaN-free logits.
  scratch_.resize(vocab);
  float max_logit = kNegInf;
  for (int32_t i = 0; i < vocab; ++i) {
    scratch_[i] = Key(logits[i]);
    max_logit = std::max(max_logit, scratch_[i]);
  }
  double sum = 0;
  if (max_logit != kNegInf) {
    for (const float x : scratch_) sum += std::exp(x - max_logit);
  }
  const double log_z = max_logit == kNegInf ? 0.0 : max_logit + std::log(sum);
  const auto logprob = [&](int32_t token) -> float {
    const float x = scratch_[token];
    return x == kNegInf ? kNegInf : static_cast<float>(x - log_z);
  };
  result.logprob = logprob(result.token);

  top_n = std::min(top_n, vocab);
  if (top_n <= 0) return;
  SelectTopN(scratch_, top_n, values_, order_);
  std::sort(order_.begin(), order_.end(), ByWeightDescending{scratch_.data()});
  result.top_logprobs.reserve(top_n);
  for (const int32_t token : order_) result.top_logprobs.emplace_back(token, logprob(token));
}

SampledToken Sample(absl::Span<const float> logits, const SamplingParams& params,
                    const PenaltyState& penalties, int64_t output_position) {
  Sampler sampler;
  return sampler.Sample(logits, params, penalties, output_position);
}

}  // namespace trident::sampling
