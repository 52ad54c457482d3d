// The Hugging Face reference fixtures of tests/fixtures/models (written by
// tools/reference/model_reference.py) and the helpers the backends' parity
// tests share: regenerate the model, check it is the one the fixture was
// computed from, run teacher-forced steps, and measure logit errors.

#ifndef TRIDENT_COMMON_BACKEND_TESTING_HF_FIXTURE_H_
#define TRIDENT_COMMON_BACKEND_TESTING_HF_FIXTURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/model_backend.h"

namespace trident::backend::testing {

struct FixturePrompt {
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;
  // How many greedy choices HF's own bf16 model shares with its f32 one.
  int32_t hf_bf16_agreement = 0;
  // HF f32 logits after the prompt and after each of decode_steps greedy
  // tokens: [decode_steps + 1][vocab].
  std::vector<std::vector<float>> logits;
};

struct HfFixture {
  int32_t vocab = 0;
  int32_t decode_steps = 0;
  std::vector<FixturePrompt> prompts;
  // Where the model was regenerated.
  std::string model_dir;

  // Each prompt's ids, and the length of HF's greedy continuation of it.
  std::vector<std::vector<int32_t>> prompt_ids() const {
    std::vector<std::vector<int32_t>> ids;
    for (const FixturePrompt& p : prompts) ids.push_back(p.ids);
    return ids;
  }
  std::vector<int32_t> greedy_lengths() const {
    std::vector<int32_t> lengths;
    for (const FixturePrompt& p : prompts) lengths.push_back(static_cast<int32_t>(p.greedy.size()));
    return lengths;
  }
};

// Loads the fixture of `preset` from the test's runfiles and regenerates the
// model into the test's temporary directory with make_model. FAILED_PRECONDITION
// when a regenerated file's FNV-1a differs from the one the fixture records.
absl::StatusOr<HfFixture> LoadHfFixture(const std::string& preset);

// Runs the prompt, then feeds HF's greedy tokens one at a time; returns the
// logits after the prompt and after each fed token (`steps` rows).
absl::StatusOr<std::vector<std::vector<float>>> TeacherForced(ModelBackend& backend,
                                                              const FixturePrompt& prompt,
                                                              int32_t steps);

// max |ours - HF| / (max - min of HF's logits) over the fixture's rows (the
// first prompt.logits.size() rows of `ours`).
double MaxRelativeError(const FixturePrompt& prompt, const std::vector<std::vector<float>>& ours);

int32_t Argmax(const std::vector<float>& v);

// A preset as a test name: "llama3-tiny" -> "llama3_tiny" (gtest names take
// no '-'), for INSTANTIATE_TEST_SUITE_P over the presets.
std::string FixtureTestName(std::string preset);

}  // namespace trident::backend::testing

#endif  // TRIDENT_COMMON_BACKEND_TESTING_HF_FIXTURE_H_
