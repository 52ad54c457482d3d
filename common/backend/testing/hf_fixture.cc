#include "common/backend/testing/hf_fixture.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/generate/model_gen.h"
#include "common/status/status_macros.h"
#include "common/testing/runfiles.h"
#include "nlohmann/json.hpp"

namespace trident::backend::testing {
namespace {

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

}  // namespace

absl::StatusOr<HfFixture> LoadHfFixture(const std::string& preset) {
  const std::string dir = ::trident::testing::RunfilePath("tests/fixtures/models/" + preset);
  const std::string json_text = ReadFile(dir + "/reference.json");
  if (json_text.empty()) return absl::NotFoundError(absl::StrCat("missing fixture ", dir));
  const nlohmann::json ref = nlohmann::json::parse(json_text, nullptr, false);
  if (!ref.is_object()) return absl::InvalidArgumentError(dir + "/reference.json: not JSON");
  HfFixture f;
  f.vocab = ref["vocab_size"].get<int32_t>();
  f.decode_steps = ref["decode_steps"].get<int32_t>();
  const std::string blob = ReadFile(dir + "/logits.bin");
  const size_t row_bytes = static_cast<size_t>(f.vocab) * 4;
  size_t offset = 0;
  for (const auto& p : ref["prompts"]) {
    FixturePrompt prompt;
    prompt.ids = p["prompt_ids"].get<std::vector<int32_t>>();
    prompt.greedy = p["greedy"].get<std::vector<int32_t>>();
    prompt.hf_bf16_agreement = p.value("hf_bf16_agreement", 0);
    for (int32_t s = 0; s <= f.decode_steps; ++s) {
      if (offset + row_bytes > blob.size()) {
        return absl::InvalidArgumentError(dir + "/logits.bin is shorter than reference.json says");
      }
      std::vector<float> row(f.vocab);
      std::memcpy(row.data(), blob.data() + offset, row_bytes);
      offset += row_bytes;
      prompt.logits.push_back(std::move(row));
    }
    f.prompts.push_back(std::move(prompt));
  }
  if (offset != blob.size()) {
    return absl::InvalidArgumentError(dir + "/logits.bin is longer than reference.json says");
  }
  // The models are generated afresh, unless TRIDENT_FIXTURE_MODELS names a
  // directory of them written elsewhere (a GPU host whose C library draws
  // other random weights); either way their digests must match.
  if (const char* models = std::getenv("TRIDENT_FIXTURE_MODELS"); models != nullptr) {
    f.model_dir = absl::StrCat(models, "/", preset);
  } else {
    f.model_dir = ::trident::testing::TestTmpPath(preset);
    TRIDENT_ASSIGN_OR_RETURN(model::generate::ModelSpec spec, model::generate::PresetSpec(preset));
    TRIDENT_RETURN_IF_ERROR(model::generate::WriteModel(spec, f.model_dir));
  }
  for (const auto& [name, digest] : ref["files"].items()) {
    if (Fnv1a64(ReadFile(f.model_dir + "/" + name)) != digest["fnv1a64"].get<std::string>()) {
      return absl::FailedPreconditionError(absl::StrCat(
          name,
          " differs from the file the fixture was computed from; regenerate the fixtures "
          "with tools/reference/model_reference.py"));
    }
  }
  return f;
}

absl::StatusOr<std::vector<std::vector<float>>> TeacherForced(ModelBackend& backend,
                                                              const FixturePrompt& prompt,
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
  TRIDENT_RETURN_IF_ERROR(backend.Forward({seq}, logits.data()));
  out.push_back(logits);
  for (int32_t s = 0; s + 1 < steps; ++s) {
    seq.tokens = absl::MakeConstSpan(&prompt.greedy[s], 1);
    seq.start_position = static_cast<int32_t>(prompt.ids.size()) + s;
    TRIDENT_RETURN_IF_ERROR(backend.Forward({seq}, logits.data()));
    out.push_back(logits);
  }
  return out;
}

double MaxRelativeError(const FixturePrompt& prompt, const std::vector<std::vector<float>>& ours) {
  float lo = prompt.logits[0][0], hi = lo;
  for (const auto& row : prompt.logits) {
    for (float v : row) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  double worst = 0;
  for (size_t s = 0; s < prompt.logits.size(); ++s) {
    for (size_t v = 0; v < prompt.logits[s].size(); ++v) {
      worst = std::max(worst, std::fabs(static_cast<double>(ours[s][v]) - prompt.logits[s][v]));
    }
  }
  return worst / (hi - lo);
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

std::string FixtureTestName(std::string preset) {
  std::replace(preset.begin(), preset.end(), '-', '_');
  return preset;
}

}  // namespace trident::backend::testing
