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

// The stream of tensor `name` under `seed`.
uint64_t StreamBase(uint64_t seed, const std::string& name);

// Half the width of `t`'s uniform distribution: sqrt(3) stddev.
float HalfWidth(const PlannedTensor& t);

// Element (row, col) of `t` (a 1-D tensor: row 0), as WriteModel computes
// it before the file's dtype rounds it.
float Element(const Plan& plan, const PlannedTensor& t, uint64_t base, int64_t row, int64_t col);

}  // namespace trident::model::generate::internal

#endif  // TRIDENT_COMMON_MODEL_GENERATE_TENSOR_PLAN_H_
