#include "common/model/generate/random_weights.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/generate/tensor_plan.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"

namespace trident::model::generate {

absl::StatusOr<std::unique_ptr<RandomWeights>> RandomWeights::Create(const ModelSpec& spec) {
  TRIDENT_ASSIGN_OR_RETURN(internal::Plan plan, internal::MakePlan(spec));
  TRIDENT_ASSIGN_OR_RETURN(ModelConfig config,
                           ParseModelConfig(plan.config.dump(), "", "generated model"));
  return std::unique_ptr<RandomWeights>(new RandomWeights(
      spec, std::make_unique<internal::Plan>(std::move(plan)), std::move(config)));
}

RandomWeights::RandomWeights(ModelSpec spec, std::unique_ptr<internal::Plan> plan,
                             ModelConfig config)
    : spec_(std::move(spec)), plan_(std::move(plan)), config_(std::move(config)) {
  for (size_t i = 0; i < plan_->tensors.size(); ++i) index_.emplace(plan_->tensors[i].name, i);
}

RandomWeights::~RandomWeights() = default;

absl::Status RandomWeights::ReadBf16(absl::string_view name, absl::Span<uint16_t> out) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("generated model has no tensor \"", name, "\""));
  }
  return ReadBf16Slice(name, {SliceAxis::kRows, 0, plan_->tensors[it->second].shape[0]}, out);
}

absl::Status RandomWeights::ReadBf16Slice(absl::string_view name, const TensorSlice& slice,
                                          absl::Span<uint16_t> out) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("generated model has no tensor \"", name, "\""));
  }
  const internal::PlannedTensor& t = plan_->tensors[it->second];
  const int64_t rows = t.shape[0];
  const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
  const bool by_rows = slice.axis == SliceAxis::kRows;
  if (!by_rows && t.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", name, "\": a column slice of a tensor that is not 2-D"));
  }
  const int64_t extent = by_rows ? rows : cols;
  if (slice.begin < 0 || slice.end > extent || slice.begin >= slice.end) {
    return absl::InvalidArgumentError(absl::StrCat("\"", name, "\": slice [", slice.begin, ", ",
                                                   slice.end, ") of ", extent,
                                                   by_rows ? " rows" : " columns"));
  }
  const int64_t out_rows = by_rows ? slice.end - slice.begin : rows;
  const int64_t out_cols = by_rows ? cols : slice.end - slice.begin;
  if (static_cast<int64_t>(out.size()) != out_rows * out_cols) {
    return absl::InvalidArgumentError(absl::StrCat("\"", name, "\": out holds ", out.size(),
                                                   " elements; the slice has ",
                                                   out_rows * out_cols));
  }
  const uint64_t base = internal::StreamBase(spec_.seed, t.name);
  const int64_t row0 = by_rows ? slice.begin : 0;
  const int64_t col0 = by_rows ? 0 : slice.begin;
  for (int64_t r = 0; r < out_rows; ++r) {
    for (int64_t c = 0; c < out_cols; ++c) {
      const int64_t index = (row0 + r) * cols + col0 + c;
      out[static_cast<size_t>(r * out_cols + c)] =
          numeric::FloatToBf16(internal::Element(*plan_, t, base, index));
    }
  }
  return absl::OkStatus();
}

}  // namespace trident::model::generate
