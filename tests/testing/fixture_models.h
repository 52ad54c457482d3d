// Fixture models for integration tests: make_model's presets (random
// weights), written once per test temp directory.

#ifndef TRIDENT_TESTS_TESTING_FIXTURE_MODELS_H_
#define TRIDENT_TESTS_TESTING_FIXTURE_MODELS_H_

#include <algorithm>
#include <fstream>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "common/model/generate/model_gen.h"
#include "common/status/status_macros.h"
#include "gtest/gtest.h"

namespace trident::testing {

// Writes make_model's `preset` into `dir` unless `dir` already holds a model
// (its config.json).
inline absl::Status EnsureFixtureModel(const std::string& preset, const std::string& dir) {
  if (std::ifstream(dir + "/config.json").good()) return absl::OkStatus();
  TRIDENT_ASSIGN_OR_RETURN(const model::generate::ModelSpec spec,
                           model::generate::PresetSpec(preset));
  return model::generate::WriteModel(spec, dir);
}

// The test name suffix of a (model preset, UCX transport) parameter:
// "llama3_tiny_tcp".
inline std::string ModelTransportName(
    const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
  std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_FIXTURE_MODELS_H_
