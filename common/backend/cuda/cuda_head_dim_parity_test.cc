// The CUDA backend against the CPU backend on every head_dim the CUDA
// attention kernels take: 16 to 256 in steps of 16. A head_dim below 64, 128
// or 256 runs on the next wider kernels with the rest masked. Each case is a
// random-weight bf16 Llama model (4 q / 2 kv heads, hidden 256, 2 layers),
// generated with that head_dim. A 300-token prompt and 40 teacher-forced
// tokens run through both backends. The prompt exercises prefill attention
// across several KV tiles; the forced tokens exercise decode attention over
// a growing context. On every row, the CUDA backend's logits must stay
// within kBf16Tolerance of the CPU backend's logit range, as the fixtures'
// parity with transformers requires. Its greedy choices must agree on >= 90%
// of the rows: random tiny models have near ties bf16 may flip. A head_dim
// past the kernels (272) is refused at load, naming config.json.

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/cuda/cuda_backend.h"
#include "common/backend/testing/hf_fixture.h"
#include "common/model/generate/model_gen.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr double kBf16Tolerance = 2e-2;
constexpr int32_t kPromptTokens = 300;
constexpr int32_t kForcedTokens = 40;
constexpr uint32_t kSeed = 11;

absl::StatusOr<std::string> WriteModel(int32_t head_dim) {
  absl::StatusOr<model::generate::ModelSpec> spec = model::generate::PresetSpec("llama3-tiny");
  if (!spec.ok()) return spec.status();
  spec->head_dim = head_dim;
  spec->dtype = numeric::DType::kBF16;
  spec->seed = kSeed;
  const std::string dir = ::trident::testing::TestTmpPath("head_dim_" + std::to_string(head_dim));
  absl::Status written = model::generate::WriteModel(*spec, dir);
  if (!written.ok()) return written;
  return dir;
}

class HeadDimParityTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(HeadDimParityTest, CudaLogitsMatchTheCpuBackend) {
  const int32_t head_dim = GetParam();
  std::printf("head_dim %d, seed %u\n", head_dim, kSeed);
  absl::StatusOr<std::string> dir = WriteModel(head_dim);
  ASSERT_THAT(dir.status(), IsOk());

  CudaBackendOptions cuda_options;
  cuda_options.gpu_memory_fraction = 0.2;
  cuda_options.max_batch_tokens = 1024;
  cuda_options.max_batch_sequences = 8;
  auto cuda = CudaBackend::Create(*dir, cuda_options);
  ASSERT_THAT(cuda.status(), IsOk());
  CpuBackendOptions cpu_options;  // fp32 matmuls and KV: the reference.
  auto cpu = CpuBackend::Create(*dir, cpu_options);
  ASSERT_THAT(cpu.status(), IsOk());

  // The prompt and the forced tokens: random ids of the model's vocabulary.
  std::mt19937 rng(kSeed + static_cast<uint32_t>(head_dim));
  std::uniform_int_distribution<int32_t> token(3, (*cpu)->vocab_size() - 1);
  testing::FixturePrompt prompt;
  for (int32_t i = 0; i < kPromptTokens; ++i) prompt.ids.push_back(token(rng));
  for (int32_t i = 0; i < kForcedTokens; ++i) prompt.greedy.push_back(token(rng));

  auto want = testing::TeacherForced(**cpu, prompt, kForcedTokens);
  ASSERT_THAT(want.status(), IsOk());
  auto got = testing::TeacherForced(**cuda, prompt, kForcedTokens);
  ASSERT_THAT(got.status(), IsOk());
  prompt.logits = *want;
  const double worst = testing::MaxRelativeError(prompt, *got);
  int agree = 0;
  for (int32_t s = 0; s < kForcedTokens; ++s) {
    agree += testing::Argmax((*got)[s]) == testing::Argmax((*want)[s]) ? 1 : 0;
  }
  std::printf("head_dim %d: max |dlogit| / range %.3g, greedy agreement %d/%d\n", head_dim, worst,
              agree, kForcedTokens);
  EXPECT_LE(worst, kBf16Tolerance);
  EXPECT_GE(agree, kForcedTokens * 9 / 10);
}

INSTANTIATE_TEST_SUITE_P(EveryMultipleOf16, HeadDimParityTest,
                         ::testing::Values(16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192,
                                           208, 224, 240, 256),
                         [](const ::testing::TestParamInfo<int32_t>& info) {
                           return "HeadDim" + std::to_string(info.param);
                         });

TEST(HeadDimRefusalTest, AHeadDimPastTheKernelsIsRefusedAtLoad) {
  absl::StatusOr<std::string> dir = WriteModel(272);
  ASSERT_THAT(dir.status(), IsOk());
  EXPECT_THAT(
      CudaBackend::Create(*dir, CudaBackendOptions()).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("config.json: head_dim 272")));
}

}  // namespace
}  // namespace trident::backend
