// What WriteModel writes and RandomWeights computes, shared: each tensor's
// name, shape and distribution, and the value of any one element (a
// counter-based stream per (seed, name), so a block of a tensor is computed
// without the rest). Internal to the package.

#ifndef TRIDENT_COMMON_MODEL_GENERATE_TENSOR_PLAN_H_
#define TRIDENT_COMMON_MODEL_GENERATE_TENSOR_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/generate/model_gen.h"
#include "common/model/generate/tokenizer_gen.h"
#include "common/numeric/counter_stream.h"
#include "nlohmann/json.hpp"

namespace trident::model::generate::internal {

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
  float mean = 0.0f;
  float stddev = 0.0f;
  // Rows are token ids: those of tokens that are not whole UTF-8 characters
  // are scaled by 0.25 (sampled text is then made of whole characters).
  bool vocab_rows = false;

  int64_t rows() const { return shape[0]; }
  int64_t cols() const { return shape.size() == 2 ? shape[1] : 1; }
};

// A checked spec with its tokenizer, vocabulary and tensors.
struct Plan {
  GeneratedTokenizer tokenizer;
  int32_t vocab = 0;
  std::vector<PlannedTensor> tensors;
  // Per token id: whether its rows are scaled (not a whole UTF-8 character).
  std::vector<bool> partial_utf8;
  nlohmann::json config;  // config.json's contents
};

// kInvalidArgument for non-positive sizes, heads not a multiple of KV
// heads, or a vocabulary smaller than the tokenizer's.
absl::StatusOr<Plan> MakePlan(const ModelSpec& spec);

// Rows [row0, row0 + rows) and columns [col0, col0 + cols) of `t` under
// `seed` as a counter-based stream, unchecked: the values WriteModel writes
// (for the whole tensor) before the file's dtype rounds them, and that
// RandomWeights gives any block of.
numeric::CounterStreamBlock TensorBlock(const Plan& plan, const PlannedTensor& t, uint64_t seed,
                                        int64_t row0, int64_t col0, int64_t rows, int64_t cols);

}  // namespace trident::model::generate::internal

#endif  // TRIDENT_COMMON_MODEL_GENERATE_TENSOR_PLAN_H_
