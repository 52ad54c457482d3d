// Accuracy of the FP8 E4M3 KV cache (--kv_cache_dtype=fp8_e4m3) on the CUDA
// backend, against the same backend with a bf16 cache and against Hugging
// Face transformers' f32 model, on the committed fixtures: teacher-forced
// greedy agreement with HF f32, max |dlogit| / logit range, and the
// perplexity of HF's greedy continuation under each cache (its delta is the
// cost of FP8). A broken FP8 path (a mis-read scale, a wrong fragment order)
// gives logits unrelated to HF's, far outside the bounds below; they leave
// FP8's own rounding (3 mantissa bits per K and V element) room.
//
// With TRIDENT_FP8_MODEL_DIR set to a model directory (e.g. make_model's
// llama3-8b preset), the same comparison runs there on a 512-token random
// prompt and 128 forced random tokens, FP8 against bf16 (no HF reference).

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/backend/cuda/cuda_backend.h"
#include "common/backend/testing/hf_fixture.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using testing::Argmax;
using testing::FixturePrompt;
using ::trident::testing::IsOk;

// -log softmax(row)[target].
double Nll(const std::vector<float>& row, int32_t target) {
  double max = row[0];
  for (float v : row) max = std::max<double>(max, v);
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v) - max);
  return -(static_cast<double>(row[static_cast<size_t>(target)]) - max - std::log(sum));
}

absl::StatusOr<std::unique_ptr<CudaBackend>> Backend(const std::string& dir, bool fp8,
                                                     double memory) {
  CudaBackendOptions options;
  options.gpu_memory_fraction = memory;
  options.max_batch_tokens = 2048;
  options.max_batch_sequences = 16;
  options.kv_cache_dtype = fp8 ? numeric::DType::kFP8E4M3 : numeric::DType::kBF16;
  return CudaBackend::Create(dir, options);
}

struct Scores {
  int agree_with_target = 0;  // Argmax equals the forced (HF greedy) token.
  int agree_with_other = 0;   // Argmax equals the other cache's.
  int rows = 0;
  double nll = 0;
  double worst = 0;  // max |dlogit| / range against the reference rows.
};

class Fp8KvParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8KvParityTest, AgreesWithTransformersAndTheBf16Cache) {
  auto fixture = testing::LoadHfFixture(GetParam());
  ASSERT_THAT(fixture.status(), IsOk());
  auto bf16 = Backend(fixture->model_dir, false, 0.2);
  ASSERT_THAT(bf16.status(), IsOk());
  auto fp8 = Backend(fixture->model_dir, true, 0.2);
  ASSERT_THAT(fp8.status(), IsOk());
  std::printf("%s\n", (*fp8)->Describe().c_str());
  Scores s16, s8;
  for (const FixturePrompt& prompt : fixture->prompts) {
    const int32_t steps = static_cast<int32_t>(prompt.greedy.size());
    auto a = testing::TeacherForced(**bf16, prompt, steps);
    auto b = testing::TeacherForced(**fp8, prompt, steps);
    ASSERT_THAT(a.status(), IsOk());
    ASSERT_THAT(b.status(), IsOk());
    for (int32_t i = 0; i < steps; ++i) {
      s16.agree_with_target += Argmax((*a)[i]) == prompt.greedy[i];
      s8.agree_with_target += Argmax((*b)[i]) == prompt.greedy[i];
      s8.agree_with_other += Argmax((*a)[i]) == Argmax((*b)[i]);
      // The continuation's NLL: row i predicts greedy[i].
      s16.nll += Nll((*a)[i], prompt.greedy[i]);
      s8.nll += Nll((*b)[i], prompt.greedy[i]);
      ++s8.rows;
    }
    a->resize(prompt.logits.size());
    b->resize(prompt.logits.size());
    s16.worst = std::max(s16.worst, testing::MaxRelativeError(prompt, *a));
    s8.worst = std::max(s8.worst, testing::MaxRelativeError(prompt, *b));
  }
  const int n = s8.rows;
  const double ppl16 = std::exp(s16.nll / n);
  const double ppl8 = std::exp(s8.nll / n);
  std::printf(
      "%s: HF f32 greedy agreement bf16 KV %d/%d, fp8 KV %d/%d; fp8 vs bf16 argmax %d/%d; "
      "max |dlogit| / range bf16 %.3g, fp8 %.3g; perplexity of HF's continuation bf16 %.4f, "
      "fp8 %.4f (%+.2f%%)\n",
      GetParam().c_str(), s16.agree_with_target, n, s8.agree_with_target, n, s8.agree_with_other, n,
      s16.worst, s8.worst, ppl16, ppl8, 100.0 * (ppl8 / ppl16 - 1));
  EXPECT_GE(s8.agree_with_target, n * 95 / 100);
  EXPECT_LE(s8.worst, 0.1);
  EXPECT_LE(std::fabs(ppl8 / ppl16 - 1), 0.05);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fp8KvParityTest,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "mistral-tiny"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return testing::FixtureTestName(info.param);
                         });

TEST(Fp8KvParityLargeTest, AgreesWithTheBf16CacheOnALargeModel) {
  const char* dir = std::getenv("TRIDENT_FP8_MODEL_DIR");
  if (dir == nullptr) GTEST_SKIP() << "TRIDENT_FP8_MODEL_DIR is not set";
  constexpr uint32_t kSeed = 5;
  std::printf("model %s, seed %u\n", dir, kSeed);
  FixturePrompt prompt;
  std::mt19937 rng(kSeed);
  {
    auto bf16 = Backend(dir, false, 0.45);
    ASSERT_THAT(bf16.status(), IsOk());
    std::uniform_int_distribution<int32_t> token(3, (*bf16)->vocab_size() - 1);
    for (int i = 0; i < 512; ++i) prompt.ids.push_back(token(rng));
    for (int i = 0; i < 128; ++i) prompt.greedy.push_back(token(rng));
    auto a = testing::TeacherForced(**bf16, prompt, 128);
    ASSERT_THAT(a.status(), IsOk());
    prompt.logits = std::move(*a);
  }
  auto fp8 = Backend(dir, true, 0.45);
  ASSERT_THAT(fp8.status(), IsOk());
  auto b = testing::TeacherForced(**fp8, prompt, 128);
  ASSERT_THAT(b.status(), IsOk());
  int agree = 0;
  double nll16 = 0, nll8 = 0;
  for (int i = 0; i < 128; ++i) {
    agree += Argmax(prompt.logits[i]) == Argmax((*b)[i]);
    nll16 += Nll(prompt.logits[i], prompt.greedy[i]);
    nll8 += Nll((*b)[i], prompt.greedy[i]);
  }
  const double worst = testing::MaxRelativeError(prompt, *b);
  std::printf(
      "fp8 vs bf16 KV: teacher-forced argmax agreement %d/128, max |dlogit| / range %.3g, "
      "perplexity of the forced tokens bf16 %.4f, fp8 %.4f (%+.3f%%)\n",
      agree, worst, std::exp(nll16 / 128), std::exp(nll8 / 128),
      100.0 * (std::exp((nll8 - nll16) / 128) - 1));
  EXPECT_GE(agree, 128 * 9 / 10);
}

}  // namespace
}  // namespace trident::backend
