// Parity of the CPU backend with Hugging Face transformers on the committed
// reference fixtures (tools/reference/model_reference.py): the model is
// regenerated with make_model and checked to be byte-identical to the one
// the fixtures were computed from (FNV-1a of every file), then
//  - f32: the logits after the prompt and after each of 16 teacher-forced
//    decode steps are within 1e-3 of the prompt's logit range, and the greedy
//    continuation of 32 tokens equals HF's exactly;
//  - bf16 (weights and KV; matmul inputs split in two bf16 terms or rounded):
//    logits within kBf16Tolerance of the range; teacher-forced greedy choices
//    agree with HF f32 at least as often as HF's own bf16 model does
//    (recorded in the fixture), and >= 99% with split inputs.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/testing/hf_fixture.h"
#include "common/engine/engine_core.h"
#include "common/engine/engine_testing.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using ::trident::testing::IsOk;

// Documented bf16 tolerance: max |logit - HF f32| / logit range.
constexpr double kF32Tolerance = 1e-3;
constexpr double kBf16Tolerance = 1e-2;

using testing::Argmax;
using testing::FixturePrompt;
using testing::HfFixture;
using testing::MaxRelativeError;

class ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto fixture = testing::LoadHfFixture(GetParam());
    ASSERT_THAT(fixture.status(), IsOk());
    fixture_ = std::move(*fixture);
  }

  std::unique_ptr<CpuBackend> Backend(numeric::DType dtype, bool split_activations = false) {
    CpuBackendOptions options;
    options.compute_dtype = dtype;
    options.bf16_split_activations = split_activations;
    options.kv_dtype = dtype;
    options.kv_cache_bytes = 8 << 20;
    options.pin_threads = false;
    auto backend = CpuBackend::Create(fixture_.model_dir, options);
    EXPECT_THAT(backend.status(), IsOk());
    return backend.ok() ? std::move(*backend) : nullptr;
  }

  std::vector<std::vector<float>> TeacherForced(CpuBackend& backend, const FixturePrompt& prompt,
                                                int32_t steps) {
    auto out = testing::TeacherForced(backend, prompt, steps);
    EXPECT_THAT(out.status(), IsOk());
    return out.ok() ? std::move(*out) : std::vector<std::vector<float>>(steps);
  }

  HfFixture fixture_;
};

TEST_P(ParityTest, F32LogitsMatchTransformers) {
  auto backend = Backend(numeric::DType::kF32);
  ASSERT_NE(backend, nullptr);
  ASSERT_EQ(backend->vocab_size(), fixture_.vocab);
  for (size_t p = 0; p < fixture_.prompts.size(); ++p) {
    const FixturePrompt& prompt = fixture_.prompts[p];
    auto ours = TeacherForced(*backend, prompt, fixture_.decode_steps + 1);
    const double err = MaxRelativeError(prompt, ours);
    std::printf("%s f32 prompt %zu (%zu tokens): max |dlogit| / range = %.3g\n", GetParam().c_str(),
                p, prompt.ids.size(), err);
    EXPECT_LE(err, kF32Tolerance) << "prompt " << p;
  }
}

TEST_P(ParityTest, F32GreedyContinuationEqualsTransformers) {
  auto backend = Backend(numeric::DType::kF32);
  ASSERT_NE(backend, nullptr);
  const std::vector<std::vector<int32_t>> out = engine::GreedyThroughEngine(
      backend.get(), fixture_.prompt_ids(), fixture_.greedy_lengths(), /*which=*/{}, {});
  for (size_t p = 0; p < fixture_.prompts.size(); ++p) {
    EXPECT_THAT(out[p], ::testing::ElementsAreArray(fixture_.prompts[p].greedy)) << "prompt " << p;
  }
}

// bf16 weights and KV, matmul inputs rounded to bf16 (the fast default) or
// split into two bf16 terms.
TEST_P(ParityTest, Bf16WithinToleranceAndAgreesOnGreedyChoices) {
  for (bool split : {true, false}) {
    auto backend = Backend(numeric::DType::kBF16, split);
    ASSERT_NE(backend, nullptr);
    int agree = 0, total = 0, hf_agree = 0;
    double worst = 0;
    for (const FixturePrompt& prompt : fixture_.prompts) {
      const int32_t steps = static_cast<int32_t>(prompt.greedy.size());
      hf_agree += prompt.hf_bf16_agreement;
      auto ours = TeacherForced(*backend, prompt, steps);
      for (int32_t s = 0; s < steps; ++s) {
        agree += Argmax(ours[s]) == prompt.greedy[s] ? 1 : 0;
        ++total;
      }
      ours.resize(prompt.logits.size());
      worst = std::max(worst, MaxRelativeError(prompt, ours));
    }
    const double agreement = static_cast<double>(agree) / total;
    const double hf_agreement = static_cast<double>(hf_agree) / total;
    std::printf(
        "%s bf16 (%s activations, %s): greedy agreement %d/%d = %.4f (HF's own bf16: "
        "%d/%d = %.4f), max |dlogit| / range = %.3g\n",
        GetParam().c_str(), split ? "split" : "rounded", backend->Describe().c_str(), agree, total,
        agreement, hf_agree, total, hf_agreement, worst);
    EXPECT_LE(worst, kBf16Tolerance);
    if (split) {
      // Near-f32 inputs: at least 99%, and at least HF's own bf16.
      EXPECT_GE(agreement, std::max(0.99, hf_agreement));
    } else {
      // The usual bf16 numerics, as HF's bf16 model has them: at least as
      // close to f32 as that peer (98-100% on these flat random models,
      // where rounding flips near-ties).
      EXPECT_GE(agreement, hf_agreement);
    }
  }
}

#ifdef __SANITIZE_THREAD__
// Under TSan one fixture: the others run the same threads through the same
// code, and the nine cases take TSan past 15 minutes.
#define TRIDENT_PARITY_FIXTURES ::testing::Values("llama3-tiny")
#else
#define TRIDENT_PARITY_FIXTURES ::testing::Values("llama3-tiny", "qwen2-tiny", "mistral-tiny")
#endif
INSTANTIATE_TEST_SUITE_P(Fixtures, ParityTest, TRIDENT_PARITY_FIXTURES,
                         [](const auto& info) { return testing::FixtureTestName(info.param); });

}  // namespace
}  // namespace trident::backend
