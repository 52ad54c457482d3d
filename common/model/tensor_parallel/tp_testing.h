// Shared by the tensor-parallel packages' tests: a preset's config, and the
// KV spec one rank holds.

#ifndef TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_TP_TESTING_H_
#define TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_TP_TESTING_H_

#include <cstdint>
#include <map>
#include <string>

#include "common/kv/kv_layout.h"
#include "common/model/config.h"
#include "common/model/generate/model_gen.h"
#include "common/model/generate/random_weights.h"
#include "common/model/tensor_parallel/tensor_parallel.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::model::tp_testing {

// The preset's config (generating its tokenizer once per preset).
inline const ModelConfig& ConfigOf(const std::string& preset) {
  static auto* configs = new std::map<std::string, ModelConfig>();
  auto it = configs->find(preset);
  if (it != configs->end()) return it->second;
  auto spec = generate::PresetSpec(preset);
  EXPECT_THAT(spec.status(), ::trident::testing::IsOk());
  auto weights = generate::RandomWeights::Create(*spec);
  EXPECT_THAT(weights.status(), ::trident::testing::IsOk());
  return configs->emplace(preset, (*weights)->config()).first->second;
}

// A rank's bf16 KV spec at TP `size`: its KV heads, 16-token blocks.
inline kv::KvCacheSpec RankSpec(const ModelConfig& config, int32_t size, int32_t num_blocks) {
  auto layout = MakeTensorParallelLayout(config, size, 0);
  EXPECT_THAT(layout.status(), ::trident::testing::IsOk());
  kv::KvCacheSpec spec;
  spec.num_layers = config.num_hidden_layers;
  spec.num_kv_heads = layout->kv_heads;
  spec.head_dim = config.head_dim;
  spec.block_size = 16;
  spec.num_blocks = num_blocks;
  return spec;
}

}  // namespace trident::model::tp_testing

#endif  // TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_TP_TESTING_H_
