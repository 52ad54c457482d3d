// The GPU sampler against the CPU sampler (common/sampling/sampler.h), row by
// row, over vocabularies from 1 to 151936 tokens, f32 and bf16 logits (the
// CPU sees the same bf16-rounded values), every sampling parameter and their
// combinations, penalties, NaN and all -inf rows, and logprobs.
//
// Token equality is exact for greedy rows and for every row whose outcome
// does not hinge on rounding. A row is exempt, and counted, when the CPU's
// draw u * total lies within 1e-4 (relative) of a cumulative boundary of the
// kept weights, or when a top_k / top_p / min_p decision sits on a near-tie
// (two different values within 1e-5, or a mass within 1e-6 of its target):
// there the GPU's expf (2 ulp) and fixed-point sums may legitimately differ.
// Logprobs must match log_softmax of the raw logits within 1e-4.

#include "kernels/cuda/sampling/sampling.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/backend/cuda/sampling_batch.h"
#include "common/numeric/dtype.h"
#include "common/sampling/philox.h"
#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::sampling::PenaltyState;
using ::trident::sampling::SampledToken;
using ::trident::sampling::Sampler;
using ::trident::sampling::SamplingParams;
using ::trident::testing::IsOk;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// One row of a launch: what the CPU sampler is given.
struct RowCase {
  std::string label;
  std::vector<float> logits;  // bf16-representable for bf16 launches.
  SamplingParams params;
  PenaltyState penalties;
  int64_t position = 0;
};

struct GpuOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int32_t max_top = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// Device allocation freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (bytes == 0) return;
    error_ = cudaMalloc(&ptr_, bytes);
    if (error_ != cudaSuccess) ptr_ = nullptr;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  bool ok() const { return error_ == cudaSuccess; }
  cudaError_t error() const { return error_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaError_t error_ = cudaSuccess;
};

float RoundToBf16(float x) { return numeric::Bf16ToFloat(numeric::FloatToBf16(x)); }

// Runs one launch over `rows` with logits of `dtype`, row stride `stride`
// (the padding holds 1e30, which must never be read).
void RunOnGpu(const std::vector<RowCase>& rows, int32_t vocab, numeric::DType dtype, int64_t stride,
              GpuOutput& out) {
  backend::SamplingBatchBuilder builder;
  for (const RowCase& row : rows) builder.Add(row.params, row.penalties, row.position);
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  const size_t element = numeric::ElementSize(dtype);
  std::vector<uint8_t> host_logits(static_cast<size_t>(num_rows * stride) * element);
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t i = 0; i < stride; ++i) {
      const float x = i < vocab ? rows[r].logits[i] : 1e30f;
      uint8_t* dst = host_logits.data() + static_cast<size_t>(r * stride + i) * element;
      if (dtype == numeric::DType::kF32) {
        std::memcpy(dst, &x, sizeof(x));
      } else {
        const uint16_t bits = numeric::FloatToBf16(x);
        std::memcpy(dst, &bits, sizeof(bits));
      }
    }
  }
  out.max_top = builder.max_top_logprobs();
  const size_t top_slots = static_cast<size_t>(num_rows * out.max_top);
  const size_t workspace_bytes = SampleWorkspaceBytes(num_rows, vocab);
  DeviceBuffer logits(host_logits.size());
  DeviceBuffer params(rows.size() * sizeof(SamplingRow));
  DeviceBuffer seen(builder.seen_tokens().size() * sizeof(int32_t));
  DeviceBuffer counts(builder.output_counts().size() * sizeof(SamplingTokenCount));
  DeviceBuffer tokens(rows.size() * sizeof(int32_t));
  DeviceBuffer logprobs(rows.size() * sizeof(float));
  DeviceBuffer top_ids(top_slots * sizeof(int32_t));
  DeviceBuffer top_logprobs(top_slots * sizeof(float));
  DeviceBuffer workspace(workspace_bytes);
  for (const DeviceBuffer* buffer : {&logits, &params, &seen, &counts, &tokens, &logprobs, &top_ids,
                                     &top_logprobs, &workspace}) {
    ASSERT_TRUE(buffer->ok()) << "cudaMalloc: " << cudaGetErrorString(buffer->error());
  }
  ASSERT_EQ(
      cudaMemcpy(logits.as<void>(), host_logits.data(), host_logits.size(), cudaMemcpyHostToDevice),
      cudaSuccess);
  ASSERT_EQ(cudaMemcpy(params.as<void>(), builder.rows().data(), rows.size() * sizeof(SamplingRow),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  if (!builder.seen_tokens().empty()) {
    ASSERT_EQ(cudaMemcpy(seen.as<void>(), builder.seen_tokens().data(),
                         builder.seen_tokens().size() * sizeof(int32_t), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  if (!builder.output_counts().empty()) {
    ASSERT_EQ(cudaMemcpy(counts.as<void>(), builder.output_counts().data(),
                         builder.output_counts().size() * sizeof(SamplingTokenCount),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  // The workspace's contents on entry must not matter: fill it with NaNs.
  ASSERT_EQ(cudaMemset(workspace.as<void>(), 0xff, workspace_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(tokens.as<void>(), 0xff, rows.size() * sizeof(int32_t)), cudaSuccess);
  const SampleArgs args{
      .logits = logits.as<void>(),
      .logits_dtype = dtype,
      .logits_stride = stride,
      .rows = num_rows,
      .vocab = vocab,
      .params = params.as<SamplingRow>(),
      .seen_tokens = builder.seen_tokens().empty() ? nullptr : seen.as<int32_t>(),
      .output_counts = builder.output_counts().empty() ? nullptr : counts.as<SamplingTokenCount>(),
      .tokens = tokens.as<int32_t>(),
      .logprobs = logprobs.as<float>(),
      .max_top_logprobs = out.max_top,
      .top_ids = out.max_top > 0 ? top_ids.as<int32_t>() : nullptr,
      .top_logprobs = out.max_top > 0 ? top_logprobs.as<float>() : nullptr,
      .workspace = workspace.as<void>(),
      .workspace_bytes = workspace_bytes,
      .greedy_only = builder.greedy_only(),
  };
  ASSERT_THAT(LaunchSample(args, nullptr), IsOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.tokens.resize(rows.size());
  out.logprobs.resize(rows.size());
  out.top_ids.resize(top_slots);
  out.top_logprobs.resize(top_slots);
  ASSERT_EQ(cudaMemcpy(out.tokens.data(), tokens.as<void>(), rows.size() * sizeof(int32_t),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.logprobs.data(), logprobs.as<void>(), rows.size() * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  if (top_slots > 0) {
    ASSERT_EQ(cudaMemcpy(out.top_ids.data(), top_ids.as<void>(), top_slots * sizeof(int32_t),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(out.top_logprobs.data(), top_logprobs.as<void>(),
                         top_slots * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
  }
}

// How fragile the CPU's choice for a row is, from a plain rendering of the
// pipeline with the CPU's arithmetic (same std::exp, double sums in the same
// orders).
struct Analysis {
  int32_t token = 0;
  // Distance of u * total to the nearest cumulative boundary around the
  // sampled token, relative to total; +inf for greedy and empty rows.
  double walk_margin = std::numeric_limits<double>::infinity();
  // A top_k / top_p / min_p decision on a near-tie.
  bool fragile_cut = false;
};

bool Near(double a, double b, double relative) {
  return a != b && std::abs(a - b) <= relative * std::max(std::abs(a), std::abs(b));
}

Analysis Analyze(const RowCase& row) {
  const SamplingParams& p = row.params;
  std::vector<float> x = row.logits;
  sampling::ApplyPenalties(absl::MakeSpan(x), p, row.penalties);
  const int32_t vocab = static_cast<int32_t>(x.size());
  for (float& v : x) {
    if (std::isnan(v)) v = -kInf;
  }
  Analysis out;
  if (p.temperature == 0.0f) {
    out.token = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
    return out;
  }
  float m = -kInf;
  for (float& v : x) {
    v = v / p.temperature;
    m = std::max(m, v);
  }
  if (m == -kInf) return out;
  std::vector<float> w(vocab);
  for (int32_t i = 0; i < vocab; ++i) w[i] = x[i] == m ? 1.0f : std::exp(x[i] - m);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
  int32_t n = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    n = p.top_k;
    out.fragile_cut |= Near(w[order[n - 1]], w[order[n]], 1e-5);
  }
  if (p.top_p < 1.0f) {
    double total = 0;
    for (int32_t j = 0; j < n; ++j) total += w[order[j]];
    const double target = p.top_p * total;
    double mass = 0;
    int32_t j = 0;
    for (; j < n; ++j) {
      if (mass >= target) break;
      mass += w[order[j]];
    }
    out.fragile_cut |= Near(mass, target, 1e-6) || Near(mass - w[order[j - 1]], target, 1e-6);
    if (j < n) out.fragile_cut |= Near(w[order[j - 1]], w[order[j]], 1e-5);
    n = j;
  }
  std::vector<bool> kept(vocab, false);
  for (int32_t j = 0; j < n; ++j) kept[order[j]] = w[order[j]] > 0.0f;
  if (p.min_p > 0.0f) {
    for (int32_t i = 0; i < vocab; ++i) {
      if (!kept[i]) continue;
      out.fragile_cut |= Near(w[i], p.min_p, 1e-5);
      if (w[i] < p.min_p) kept[i] = false;
    }
  }
  double total = 0;
  for (int32_t i = 0; i < vocab; ++i) total += kept[i] ? w[i] : 0.0f;
  const float u = sampling::UniformFromPhilox(p.seed, static_cast<uint64_t>(row.position));
  const double target = u * total;
  double cumulative = 0;
  for (int32_t i = 0; i < vocab; ++i) {
    if (!kept[i]) continue;
    const double before = cumulative;
    cumulative += w[i];
    if (cumulative > target) {
      out.token = i;
      out.walk_margin = std::min(target - before, cumulative - target) / total;
      break;
    }
  }
  return out;
}

// log_softmax of the raw logits, NaN as -inf, in double.
std::vector<double> LogSoftmax(const std::vector<float>& logits) {
  double m = -kInf;
  for (const float v : logits) {
    if (!std::isnan(v)) m = std::max(m, static_cast<double>(v));
  }
  double sum = 0;
  if (m != -kInf) {
    for (const float v : logits) {
      if (!std::isnan(v)) sum += std::exp(v - m);
    }
  }
  const double log_z = m == -kInf ? 0.0 : m + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    out[i] = std::isnan(logits[i]) || logits[i] == -kInf ? -kInf : logits[i] - log_z;
  }
  return out;
}

void ExpectLogprobNear(float got, double want, const std::string& what) {
  if (want == -kInf) {
    EXPECT_EQ(got, -kInf) << what;
  } else {
    EXPECT_NEAR(got, want, 1e-4) << what;
  }
}

// Launches `rows` and compares every row with the CPU sampler; prints how
// many rows were exempt from token equality.
void CompareWithCpu(const std::vector<RowCase>& rows, int32_t vocab, numeric::DType dtype,
                    int64_t stride, const std::string& name) {
  GpuOutput gpu;
  RunOnGpu(rows, vocab, dtype, stride, gpu);
  if (::testing::Test::HasFatalFailure()) return;
  int exempt_walk = 0;
  int exempt_cut = 0;
  int differing_exempt = 0;
  Sampler sampler;
  for (size_t r = 0; r < rows.size(); ++r) {
    const RowCase& row = rows[r];
    const std::string what = absl::StrCat(name, " row ", r, " (", row.label, ")");
    const SampledToken cpu = sampler.Sample(row.logits, row.params, row.penalties, row.position);
    const Analysis analysis = Analyze(row);
    const int32_t got = gpu.tokens[r];
    ASSERT_GE(got, 0) << what;
    ASSERT_LT(got, vocab) << what;
    const bool exempt = analysis.fragile_cut || analysis.walk_margin < 1e-4;
    if (!exempt) {
      // The plain rendering must agree with the Sampler it explains.
      EXPECT_EQ(analysis.token, cpu.token) << what << ": test reference disagrees with Sampler";
    }
    if (row.params.temperature == 0.0f || !exempt) {
      EXPECT_EQ(got, cpu.token) << what;
    } else {
      (analysis.fragile_cut ? exempt_cut : exempt_walk) += 1;
      differing_exempt += got != cpu.token;
    }
    const bool want_logprobs = row.params.logprobs || row.params.top_logprobs > 0;
    if (!want_logprobs) {
      EXPECT_EQ(gpu.logprobs[r], 0.0f) << what;
      continue;
    }
    const std::vector<double> log_softmax = LogSoftmax(row.logits);
    ExpectLogprobNear(gpu.logprobs[r], log_softmax[got], what + " logprob");
    if (got == cpu.token) ExpectLogprobNear(gpu.logprobs[r], cpu.logprob, what + " vs cpu");
    const int32_t n = std::min(row.params.top_logprobs, vocab);
    ASSERT_EQ(static_cast<int32_t>(cpu.top_logprobs.size()), n) << what;
    for (int32_t j = 0; j < gpu.max_top; ++j) {
      const int32_t id = gpu.top_ids[r * gpu.max_top + j];
      const float lp = gpu.top_logprobs[r * gpu.max_top + j];
      const std::string slot = absl::StrCat(what, " top ", j);
      if (j < n) {
        EXPECT_EQ(id, cpu.top_logprobs[j].first) << slot;
        ExpectLogprobNear(lp, cpu.top_logprobs[j].second, slot);
      } else {
        EXPECT_EQ(id, -1) << slot;
        EXPECT_EQ(lp, -kInf) << slot;
      }
    }
  }
  std::printf(
      "%s: %zu rows, %d exempt at the draw boundary, %d exempt at a cut near-tie, "
      "%d of those differ\n",
      name.c_str(), rows.size(), exempt_walk, exempt_cut, differing_exempt);
}

// Logit shapes.
enum class Shape { kNormal, kLlmLike, kQuantized, kWithNans, kUniform };

const char* ShapeName(Shape s) {
  switch (s) {
    case Shape::kNormal:
      return "normal";
    case Shape::kLlmLike:
      return "llm";
    case Shape::kQuantized:
      return "quantized";
    case Shape::kWithNans:
      return "nans";
    case Shape::kUniform:
      return "uniform";
  }
  return "?";
}

std::vector<float> MakeLogits(Shape shape, int32_t vocab, numeric::DType dtype, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::uniform_int_distribution<int> level(-3, 3);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> logits(vocab);
  for (float& x : logits) {
    switch (shape) {
      case Shape::kNormal:
        x = normal(rng);
        break;
      case Shape::kLlmLike:
        x = normal(rng) - 4.0f;
        break;
      case Shape::kQuantized:
        x = static_cast<float>(level(rng));
        break;
      case Shape::kWithNans: {
        const float pick = unit(rng);
        x = pick < 0.03f ? kNan : pick < 0.06f ? -kInf : normal(rng);
        break;
      }
      case Shape::kUniform:
        x = 0.0f;
        break;
    }
  }
  if (shape == Shape::kLlmLike) {
    // A handful of plausible tokens well above the bulk.
    std::uniform_int_distribution<int32_t> id(0, vocab - 1);
    for (int j = 0; j < 20; ++j) logits[id(rng)] = 6.0f + normal(rng);
  }
  if (dtype == numeric::DType::kBF16) {
    for (float& x : logits) x = RoundToBf16(x);
  }
  return logits;
}

// Prompt and output tokens that include the most likely ids (so penalties
// change the outcome), repeats, and ids outside [0, vocab).
PenaltyState MakePenalties(const std::vector<float>& logits, std::mt19937& rng) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  const int32_t top = std::min<int32_t>(vocab, 4);
  std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int32_t a, int32_t b) {
    const float x = std::isnan(logits[a]) ? -kInf : logits[a];
    const float y = std::isnan(logits[b]) ? -kInf : logits[b];
    return x > y || (x == y && a < b);
  });
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  std::vector<int32_t> prompt = {-5, vocab, vocab + 7};
  for (int j = 0; j < 8; ++j) prompt.push_back(id(rng));
  prompt.push_back(order[0]);
  if (top > 2) prompt.push_back(order[2]);
  PenaltyState state(prompt);
  state.AddOutputToken(order[0]);
  state.AddOutputToken(order[0]);
  if (top > 1) state.AddOutputToken(order[1]);
  state.AddOutputToken(vocab + 1);
  state.AddOutputToken(-2);
  for (int j = 0; j < 5; ++j) state.AddOutputToken(id(rng));
  return state;
}

struct Config {
  std::string label;
  SamplingParams params;
  bool penalized = false;
};

// Every parameter alone and in combination.
std::vector<Config> Configs(int32_t vocab) {
  std::vector<Config> configs;
  const auto add = [&](std::string label, auto set, bool penalized = false) {
    SamplingParams p;
    set(p);
    configs.push_back({std::move(label), p, penalized});
  };
  add("greedy", [](SamplingParams& p) { p.temperature = 0.0f; });
  add("greedy+top3", [](SamplingParams& p) {
    p.temperature = 0.0f;
    p.top_logprobs = 3;
  });
  add("t1", [](SamplingParams&) {});
  add("t0.7+logprobs", [](SamplingParams& p) {
    p.temperature = 0.7f;
    p.logprobs = true;
  });
  add("t1.5", [](SamplingParams& p) { p.temperature = 1.5f; });
  add("t0.05", [](SamplingParams& p) { p.temperature = 0.05f; });
  add("k1", [](SamplingParams& p) { p.top_k = 1; });
  add("k50", [](SamplingParams& p) { p.top_k = 50; });
  add("k=vocab", [vocab](SamplingParams& p) { p.top_k = vocab; });
  add("k=vocab-1", [vocab](SamplingParams& p) { p.top_k = std::max(1, vocab - 1); });
  add("p0.1", [](SamplingParams& p) { p.top_p = 0.1f; });
  add("p0.9", [](SamplingParams& p) { p.top_p = 0.9f; });
  add("p1", [](SamplingParams& p) { p.top_p = 1.0f; });
  add("minp0.05", [](SamplingParams& p) { p.min_p = 0.05f; });
  add("minp0.5", [](SamplingParams& p) { p.min_p = 0.5f; });
  add("k50+p0.9", [](SamplingParams& p) {
    p.top_k = 50;
    p.top_p = 0.9f;
  });
  add("t0.8+k50+p0.9+minp0.02+top5", [](SamplingParams& p) {
    p.temperature = 0.8f;
    p.top_k = 50;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.top_logprobs = 5;
  });
  add("t0.5+k20+p0.5", [](SamplingParams& p) {
    p.temperature = 0.5f;
    p.top_k = 20;
    p.top_p = 0.5f;
  });
  add("k3000+p0.95", [](SamplingParams& p) {
    p.top_k = 3000;
    p.top_p = 0.95f;
  });
  add("p0.95+minp0.1", [](SamplingParams& p) {
    p.top_p = 0.95f;
    p.min_p = 0.1f;
  });
  add(
      "rep1.3", [](SamplingParams& p) { p.repetition_penalty = 1.3f; }, true);
  add(
      "freq0.5+pres0.3",
      [](SamplingParams& p) {
        p.frequency_penalty = 0.5f;
        p.presence_penalty = 0.3f;
      },
      true);
  add(
      "rep0.8+freq-0.4+pres-0.2+p0.9",
      [](SamplingParams& p) {
        p.repetition_penalty = 0.8f;
        p.frequency_penalty = -0.4f;
        p.presence_penalty = -0.2f;
        p.top_p = 0.9f;
      },
      true);
  add(
      "greedy+rep1.5+freq1+pres1",
      [](SamplingParams& p) {
        p.temperature = 0.0f;
        p.repetition_penalty = 1.5f;
        p.frequency_penalty = 1.0f;
        p.presence_penalty = 1.0f;
      },
      true);
  add(
      "rep2+k10+top20",
      [](SamplingParams& p) {
        p.repetition_penalty = 2.0f;
        p.top_k = 10;
        p.top_logprobs = 20;
      },
      true);
  return configs;
}

std::vector<RowCase> MakeRows(int32_t vocab, numeric::DType dtype, std::mt19937& rng,
                              const std::vector<Shape>& shapes) {
  std::vector<RowCase> rows;
  std::uniform_int_distribution<int64_t> position(0, 4000);
  for (const Config& config : Configs(vocab)) {
    for (const Shape shape : shapes) {
      RowCase row;
      row.label = absl::StrCat(config.label, "/", ShapeName(shape));
      row.logits = MakeLogits(shape, vocab, dtype, rng);
      row.params = config.params;
      row.params.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
      if (config.penalized) row.penalties = MakePenalties(row.logits, rng);
      row.position = position(rng);
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

class SamplingTest : public ::testing::TestWithParam<std::tuple<int32_t, numeric::DType>> {};

TEST_P(SamplingTest, MatchesCpuSamplerRowByRow) {
  const auto [vocab, dtype] = GetParam();
  const uint32_t seed =
      1000 + static_cast<uint32_t>(vocab) * 2 + (dtype == numeric::DType::kBF16 ? 1 : 0);
  const std::string name =
      absl::StrCat("vocab ", vocab, " ", numeric::DTypeName(dtype), " seed ", seed);
  std::printf("%s\n", name.c_str());
  std::mt19937 rng(seed);
  const std::vector<RowCase> rows = MakeRows(
      vocab, dtype, rng,
      {Shape::kNormal, Shape::kLlmLike, Shape::kQuantized, Shape::kWithNans, Shape::kUniform});
  // An odd row stride: the kernel must not read past `vocab`.
  CompareWithCpu(rows, vocab, dtype, vocab + 3, name);
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, SamplingTest,
                         ::testing::Combine(::testing::Values(1, 7, 512, 32000, 128256, 151936),
                                            ::testing::Values(numeric::DType::kF32,
                                                              numeric::DType::kBF16)),
                         [](const ::testing::TestParamInfo<SamplingTest::ParamType>& info) {
                           return absl::StrCat("V", std::get<0>(info.param), "_",
                                               numeric::DTypeName(std::get<1>(info.param)));
                         });

RowCase Row(std::string label, std::vector<float> logits, SamplingParams params,
            int64_t position = 0) {
  RowCase row;
  row.label = std::move(label);
  row.logits = std::move(logits);
  row.params = params;
  row.params.seed = 0x5eed0000u + static_cast<uint64_t>(position) * 7919u;
  row.position = position;
  return row;
}

TEST(SamplingEdgeTest, GreedyBreaksTiesTowardTheLowestId) {
  for (const int32_t vocab : {7, 151936}) {
    std::vector<float> logits(vocab, -1.0f);
    logits[vocab - 1] = 3.0f;
    logits[5] = 3.0f;
    logits[3] = 3.0f;
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    std::vector<RowCase> rows = {Row("ties", logits, greedy),
                                 Row("all equal", std::vector<float>(vocab, 0.5f), greedy)};
    for (const numeric::DType dtype : {numeric::DType::kF32, numeric::DType::kBF16}) {
      GpuOutput gpu;
      RunOnGpu(rows, vocab, dtype, vocab, gpu);
      ASSERT_FALSE(HasFatalFailure());
      EXPECT_EQ(gpu.tokens[0], 3) << vocab;
      EXPECT_EQ(gpu.tokens[1], 0) << vocab;
    }
  }
}

TEST(SamplingEdgeTest, NanAndAllNegativeInfinityRows) {
  const int32_t vocab = 512;
  std::vector<float> all_neg_inf(vocab, -kInf);
  std::vector<float> all_nan(vocab, kNan);
  std::vector<float> mixed(vocab, -kInf);
  for (int32_t i = 0; i < vocab; i += 2) mixed[i] = kNan;
  std::vector<float> one_finite = mixed;
  one_finite[301] = -50.0f;
  std::vector<float> plus_inf(vocab, 0.0f);
  plus_inf[77] = kInf;
  std::vector<RowCase> rows;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams plain;
  plain.logprobs = true;
  plain.top_logprobs = 4;
  SamplingParams truncated;
  truncated.top_k = 5;
  truncated.top_p = 0.5f;
  truncated.min_p = 0.1f;
  int64_t position = 0;
  for (const auto& [label, logits] : std::vector<std::pair<std::string, std::vector<float>>>{
           {"-inf", all_neg_inf}, {"nan", all_nan}, {"mixed", mixed}, {"one finite", one_finite}}) {
    rows.push_back(Row(label + "/greedy", logits, greedy, position++));
    rows.push_back(Row(label + "/plain", logits, plain, position++));
    rows.push_back(Row(label + "/truncated", logits, truncated, position++));
  }
  rows.push_back(Row("+inf/plain", plus_inf, SamplingParams(), position++));
  rows.push_back(Row("+inf/truncated", plus_inf, truncated, position++));
  for (const numeric::DType dtype : {numeric::DType::kF32, numeric::DType::kBF16}) {
    CompareWithCpu(rows, vocab, dtype, vocab, absl::StrCat("nan/-inf ", numeric::DTypeName(dtype)));
    ASSERT_FALSE(HasFatalFailure());
  }
}

// Launches whose rows are all greedy without penalties or logprobs take the
// multi-SM argmax (SampleArgs::greedy_only): NaN and -inf rows, vocabularies
// smaller than its 8 slices, ties across slices, Llama 3's vocabulary.
TEST(SamplingEdgeTest, GreedyOnlyLaunchesTakeTheArgmax) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  for (const int32_t vocab : {1, 5, 9, 1000, 128256}) {
    std::vector<float> random(vocab), tied(vocab, -2.0f), mixed(vocab, -kInf);
    for (float& x : random) x = normal(rng);
    tied[vocab - 1] = 4.0f;
    tied[vocab / 2] = 4.0f;
    for (int32_t i = 0; i < vocab; i += 2) mixed[i] = kNan;
    std::vector<RowCase> rows = {Row("random", random, greedy, 0), Row("tied", tied, greedy, 1),
                                 Row("nan/-inf", mixed, greedy, 2),
                                 Row("-inf", std::vector<float>(vocab, -kInf), greedy, 3)};
    backend::SamplingBatchBuilder builder;
    for (const RowCase& row : rows) builder.Add(row.params, row.penalties, row.position);
    ASSERT_TRUE(builder.greedy_only());
    for (const numeric::DType dtype : {numeric::DType::kF32, numeric::DType::kBF16}) {
      CompareWithCpu(rows, vocab, dtype, vocab + 3,
                     absl::StrCat("greedy only, vocab ", vocab, " ", numeric::DTypeName(dtype)));
      ASSERT_FALSE(HasFatalFailure());
      GpuOutput gpu;
      RunOnGpu(rows, vocab, dtype, vocab, gpu);
      ASSERT_FALSE(HasFatalFailure());
      EXPECT_EQ(gpu.tokens[1], vocab / 2) << vocab;
      EXPECT_EQ(gpu.tokens[3], 0) << vocab;
      for (const float lp : gpu.logprobs) EXPECT_EQ(lp, 0.0f);
    }
  }
  SamplingParams asks = greedy;
  asks.logprobs = true;
  SamplingParams penalized = greedy;
  penalized.repetition_penalty = 1.2f;
  const int32_t prompt[] = {3};
  PenaltyState seen(prompt);
  backend::SamplingBatchBuilder builder;
  builder.Add(greedy, PenaltyState(), 0);
  EXPECT_TRUE(builder.greedy_only());
  builder.Add(asks, PenaltyState(), 0);
  EXPECT_FALSE(builder.greedy_only());
  builder.Clear();
  builder.Add(penalized, seen, 0);
  EXPECT_FALSE(builder.greedy_only());
  builder.Clear();
  builder.Add(SamplingParams(), PenaltyState(), 0);
  EXPECT_FALSE(builder.greedy_only());
}

TEST(SamplingEdgeTest, ExactTiesAtEveryCutKeepTheLowerIds) {
  // Uniform logits: every weight is 1, so top_k, top_p and min_p all cut
  // inside one tie group and the masses are exact on both sides.
  std::vector<RowCase> rows;
  int64_t position = 0;
  for (const int32_t vocab : {8, 512}) {
    for (int trial = 0; trial < 8; ++trial) {
      SamplingParams top_k;
      top_k.top_k = 3;
      SamplingParams half;
      half.top_p = 0.5f;
      SamplingParams third;
      third.top_p = 0.3f;
      SamplingParams both;
      both.top_k = 6;
      both.top_p = 0.5f;
      SamplingParams min_p;
      min_p.min_p = 1.0f;
      for (const auto& [label, params] :
           std::vector<std::pair<std::string, SamplingParams>>{{"k3", top_k},
                                                               {"p0.5", half},
                                                               {"p0.3", third},
                                                               {"k6+p0.5", both},
                                                               {"minp1", min_p}}) {
        rows.push_back(Row(absl::StrCat(label, " V", vocab), std::vector<float>(vocab, 1.0f),
                           params, position++));
      }
    }
    std::vector<RowCase> batch(rows.end() - 40, rows.end());
    CompareWithCpu(batch, vocab, numeric::DType::kF32, vocab, absl::StrCat("ties V", vocab));
    ASSERT_FALSE(HasFatalFailure());
    // The kept sets are {0, 1, 2}, the first half, the first 30% (rounded
    // up), {0, 1, 2} (half of 6), and everything.
    GpuOutput gpu;
    RunOnGpu(batch, vocab, numeric::DType::kF32, vocab, gpu);
    ASSERT_FALSE(HasFatalFailure());
    for (size_t r = 0; r < batch.size(); r += 5) {
      EXPECT_LT(gpu.tokens[r], 3);
      EXPECT_LT(gpu.tokens[r + 1], vocab / 2);
      EXPECT_LT(gpu.tokens[r + 2], (3 * vocab + 9) / 10);
      EXPECT_LT(gpu.tokens[r + 3], 3);
    }
  }
}

TEST(SamplingEdgeTest, ManyRowsWithDifferentParamsInOneLaunch) {
  constexpr uint32_t kSeed = 4242;
  constexpr int32_t kVocab = 32000;
  std::printf("seed %u\n", kSeed);
  std::mt19937 rng(kSeed);
  const std::vector<Config> configs = Configs(kVocab);
  std::uniform_int_distribution<size_t> pick_config(0, configs.size() - 1);
  std::uniform_int_distribution<int> pick_shape(0, 4);
  std::vector<RowCase> rows;
  for (int r = 0; r < 256; ++r) {
    const Config& config = configs[pick_config(rng)];
    const Shape shape = static_cast<Shape>(pick_shape(rng));
    RowCase row;
    row.label = absl::StrCat(config.label, "/", ShapeName(shape));
    row.logits = MakeLogits(shape, kVocab, numeric::DType::kBF16, rng);
    row.params = config.params;
    row.params.seed = rng();
    if (config.penalized) row.penalties = MakePenalties(row.logits, rng);
    row.position = r;
    rows.push_back(std::move(row));
  }
  CompareWithCpu(rows, kVocab, numeric::DType::kBF16, kVocab, "256 rows");
}

TEST(SamplingEdgeTest, IsDeterministicAcrossLaunches) {
  constexpr uint32_t kSeed = 77;
  std::printf("seed %u\n", kSeed);
  std::mt19937 rng(kSeed);
  const std::vector<RowCase> rows =
      MakeRows(128256, numeric::DType::kF32, rng, {Shape::kNormal, Shape::kQuantized});
  GpuOutput first;
  GpuOutput second;
  RunOnGpu(rows, 128256, numeric::DType::kF32, 128256, first);
  ASSERT_FALSE(HasFatalFailure());
  RunOnGpu(rows, 128256, numeric::DType::kF32, 128256, second);
  ASSERT_FALSE(HasFatalFailure());
  EXPECT_EQ(first.tokens, second.tokens);
  EXPECT_EQ(0, std::memcmp(first.logprobs.data(), second.logprobs.data(),
                           first.logprobs.size() * sizeof(float)));
  EXPECT_EQ(first.top_ids, second.top_ids);
}

}  // namespace
}  // namespace trident::kernels::cuda
