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
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine_core.h"
#include "common/kv/paged_block_allocator.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/runfiles.h"
#include "tools/make_model/model_gen.h"

namespace trident::backend {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;

// Documented bf16 tolerance: max |logit - HF f32| / logit range.
constexpr double kF32Tolerance = 1e-3;
constexpr double kBf16Tolerance = 1e-2;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string Fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return absl::StrFormat("%016x", h);
}

struct Prompt {
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;
  // How many greedy choices HF's own bf16 model shares with its f32 one.
  int32_t hf_bf16_agreement = 0;
  // [decode_steps + 1][vocab]
  std::vector<std::vector<float>> logits;
};

struct Fixture {
  int32_t vocab = 0;
  int32_t decode_steps = 0;
  std::vector<Prompt> prompts;
};

class ParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string preset = GetParam();
    const std::string fixture_dir = RunfilePath("tests/fixtures/models/" + preset);
    const std::string json_text = ReadFile(fixture_dir + "/reference.json");
    ASSERT_FALSE(json_text.empty()) << "missing fixture " << fixture_dir;
    nlohmann::json ref = nlohmann::json::parse(json_text);
    fixture_.vocab = ref["vocab_size"].get<int32_t>();
    fixture_.decode_steps = ref["decode_steps"].get<int32_t>();
    const std::string blob = ReadFile(fixture_dir + "/logits.bin");
    const size_t row_floats = static_cast<size_t>(fixture_.vocab);
    size_t offset = 0;
    for (const auto& p : ref["prompts"]) {
      Prompt prompt;
      prompt.ids = p["prompt_ids"].get<std::vector<int32_t>>();
      prompt.greedy = p["greedy"].get<std::vector<int32_t>>();
      prompt.hf_bf16_agreement = p.value("hf_bf16_agreement", 0);
      for (int32_t s = 0; s <= fixture_.decode_steps; ++s) {
        std::vector<float> row(row_floats);
        ASSERT_LE(offset + row_floats * 4, blob.size());
        std::memcpy(row.data(), blob.data() + offset, row_floats * 4);
        offset += row_floats * 4;
        prompt.logits.push_back(std::move(row));
      }
      fixture_.prompts.push_back(std::move(prompt));
    }
    ASSERT_EQ(offset, blob.size());

    model_dir_ = TestTmpPath(preset);
    auto spec = make_model::PresetSpec(preset);
    ASSERT_THAT(spec.status(), IsOk());
    ASSERT_THAT(make_model::WriteModel(*spec, model_dir_), IsOk());
    for (const auto& [name, digest] : ref["files"].items()) {
      EXPECT_EQ(Fnv1a64(ReadFile(model_dir_ + "/" + name)), digest["fnv1a64"].get<std::string>())
          << name << " differs from the file the fixture was computed from; regenerate the "
          << "fixtures with tools/reference/model_reference.py";
    }
  }

  std::unique_ptr<CpuBackend> Backend(numeric::DType dtype, bool split_activations = false) {
    CpuBackendOptions options;
    options.compute_dtype = dtype;
    options.bf16_split_activations = split_activations;
    options.kv_dtype = dtype;
    options.kv_cache_bytes = 8 << 20;
    options.pin_threads = false;
    auto backend = CpuBackend::Create(model_dir_, options);
    EXPECT_THAT(backend.status(), IsOk());
    return backend.ok() ? std::move(*backend) : nullptr;
  }

  // Runs the prompt, then feeds HF's greedy tokens one by one; returns the
  // logits after the prompt and after each fed token (`steps` rows).
  std::vector<std::vector<float>> TeacherForced(CpuBackend& backend, const Prompt& prompt,
                                                int32_t steps) {
    std::vector<std::vector<float>> out;
    const int32_t bs = backend.kv_capacity().block_size;
    const int32_t total = static_cast<int32_t>(prompt.ids.size()) + steps;
    std::vector<int32_t> blocks;
    for (int32_t b = 0; b * bs < total; ++b) blocks.push_back(b);
    std::vector<float> logits(backend.vocab_size());
    StepSequence seq;
    seq.tokens = prompt.ids;
    seq.start_position = 0;
    seq.block_table = blocks;
    seq.want_logits = true;
    EXPECT_THAT(backend.Forward({seq}, logits.data()), IsOk());
    out.push_back(logits);
    for (int32_t s = 0; s + 1 < steps; ++s) {
      seq.tokens = absl::MakeConstSpan(&prompt.greedy[s], 1);
      seq.start_position = static_cast<int32_t>(prompt.ids.size()) + s;
      EXPECT_THAT(backend.Forward({seq}, logits.data()), IsOk());
      out.push_back(logits);
    }
    return out;
  }

  // max |ours - HF| / (max - min of HF) over the fixture's logit rows.
  double MaxRelativeError(const Prompt& prompt, const std::vector<std::vector<float>>& ours) {
    float lo = prompt.logits[0][0], hi = lo;
    for (const auto& row : prompt.logits) {
      for (float v : row) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
    }
    double worst = 0;
    for (size_t s = 0; s < prompt.logits.size(); ++s) {
      for (int32_t v = 0; v < fixture_.vocab; ++v) {
        worst = std::max(worst, std::fabs(static_cast<double>(ours[s][v]) - prompt.logits[s][v]));
      }
    }
    return worst / (hi - lo);
  }

  Fixture fixture_;
  std::string model_dir_;
};

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

TEST_P(ParityTest, F32LogitsMatchTransformers) {
  auto backend = Backend(numeric::DType::kF32);
  ASSERT_NE(backend, nullptr);
  ASSERT_EQ(backend->vocab_size(), fixture_.vocab);
  for (size_t p = 0; p < fixture_.prompts.size(); ++p) {
    const Prompt& prompt = fixture_.prompts[p];
    auto ours = TeacherForced(*backend, prompt, fixture_.decode_steps + 1);
    const double err = MaxRelativeError(prompt, ours);
    std::printf("%s f32 prompt %zu (%zu tokens): max |dlogit| / range = %.3g\n",
                GetParam().c_str(), p, prompt.ids.size(), err);
    EXPECT_LE(err, kF32Tolerance) << "prompt " << p;
  }
}

TEST_P(ParityTest, F32GreedyContinuationEqualsTransformers) {
  auto backend = Backend(numeric::DType::kF32);
  ASSERT_NE(backend, nullptr);
  kv::PagedBlockAllocator allocator(backend->kv_capacity().num_blocks);
  engine::EngineCore core(backend.get(), &allocator, {});
  for (size_t p = 0; p < fixture_.prompts.size(); ++p) {
    engine::EngineRequest r;
    r.id = absl::StrCat("p", p);
    r.prompt = fixture_.prompts[p].ids;
    r.max_tokens = static_cast<int32_t>(fixture_.prompts[p].greedy.size());
    r.sampling.temperature = 0;
    ASSERT_THAT(core.Add(r), IsOk());
  }
  std::vector<std::vector<int32_t>> out(fixture_.prompts.size());
  while (core.HasWork()) {
    auto events = core.Step();
    ASSERT_THAT(events.status(), IsOk());
    for (const auto& ev : *events) out[std::stoi(ev.request_id.substr(1))].push_back(ev.token);
  }
  for (size_t p = 0; p < fixture_.prompts.size(); ++p) {
    EXPECT_THAT(out[p], ::testing::ElementsAreArray(fixture_.prompts[p].greedy)) << "prompt " << p;
  }
  EXPECT_EQ(allocator.num_free(), allocator.num_total());
}

// bf16 weights and KV, matmul inputs rounded to bf16 (the fast default) or
// split into two bf16 terms.
TEST_P(ParityTest, Bf16WithinToleranceAndAgreesOnGreedyChoices) {
  for (bool split : {true, false}) {
    auto backend = Backend(numeric::DType::kBF16, split);
    ASSERT_NE(backend, nullptr);
    int agree = 0, total = 0, hf_agree = 0;
    double worst = 0;
    for (const Prompt& prompt : fixture_.prompts) {
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
    std::printf("%s bf16 (%s activations, %s): greedy agreement %d/%d = %.4f (HF's own bf16: "
                "%d/%d = %.4f), max |dlogit| / range = %.3g\n",
                GetParam().c_str(), split ? "split" : "rounded", backend->Describe().c_str(),
                agree, total, agreement, hf_agree, total, hf_agreement, worst);
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

INSTANTIATE_TEST_SUITE_P(Fixtures, ParityTest,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "mistral-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace trident::backend
