#include "common/model/generate/random_weights.h"

#include <algorithm>
#include <thread>
#include <utility>
#include <vector>

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
  const uint64_t element_bytes = spec_.dtype == numeric::DType::kBF16 ? 2 : 4;
  for (size_t i = 0; i < plan_->tensors.size(); ++i) {
    index_.emplace(plan_->tensors[i].name, i);
    const internal::PlannedTensor& t = plan_->tensors[i];
    total_bytes_ += static_cast<uint64_t>(t.rows() * t.cols()) * element_bytes;
  }
}

RandomWeights::~RandomWeights() = default;

absl::StatusOr<size_t> RandomWeights::Find(absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("generated model has no tensor \"", name, "\""));
  }
  return it->second;
}

bool RandomWeights::Has(absl::string_view name) const { return index_.contains(name); }

absl::StatusOr<TensorInfo> RandomWeights::Info(absl::string_view name) const {
  TRIDENT_ASSIGN_OR_RETURN(size_t i, Find(name));
  const internal::PlannedTensor& t = plan_->tensors[i];
  TensorInfo info;
  info.name = t.name;
  info.file = "(generated)";
  info.dtype = spec_.dtype;
  info.dtype_name = spec_.dtype == numeric::DType::kBF16 ? "BF16" : "F32";
  info.shape = t.shape;
  info.numel = t.rows() * t.cols();
  info.num_bytes =
      static_cast<uint64_t>(info.numel) * (spec_.dtype == numeric::DType::kBF16 ? 2 : 4);
  return info;
}

absl::StatusOr<numeric::CounterStreamBlock> RandomWeights::StreamBlock(
    absl::string_view name, const TensorSlice& slice) const {
  TRIDENT_ASSIGN_OR_RETURN(size_t index, Find(name));
  const internal::PlannedTensor& t = plan_->tensors[index];
  const int64_t rows = t.rows();
  const int64_t cols = t.cols();
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
  return internal::TensorBlock(*plan_, t, spec_.seed, by_rows ? slice.begin : 0,
                               by_rows ? 0 : slice.begin, by_rows ? slice.end - slice.begin : rows,
                               by_rows ? cols : slice.end - slice.begin);
}

template <typename Emit>
absl::Status RandomWeights::ForEach(absl::string_view name, const TensorSlice& slice,
                                    size_t out_size, Emit emit) const {
  TRIDENT_ASSIGN_OR_RETURN(const numeric::CounterStreamBlock block, StreamBlock(name, slice));
  if (static_cast<int64_t>(out_size) != block.rows * block.cols) {
    return absl::InvalidArgumentError(absl::StrCat("\"", name, "\": out holds ", out_size,
                                                   " elements; the slice has ",
                                                   block.rows * block.cols));
  }
  auto rows_range = [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      for (int64_t c = 0; c < block.cols; ++c) {
        emit(static_cast<size_t>(r * block.cols + c), numeric::BlockElement(block, r, c));
      }
    }
  };
  // Every element is computed alone, so large blocks are split by rows over
  // the machine's cores (a 70B rank's shard is ~17 billion elements).
  const int64_t threads =
      std::min<int64_t>({static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())),
                         16, block.rows * block.cols / (int64_t{1} << 20) + 1, block.rows});
  if (threads <= 1) {
    rows_range(0, block.rows);
    return absl::OkStatus();
  }
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < threads; ++w) {
    workers.emplace_back(rows_range, block.rows * w / threads, block.rows * (w + 1) / threads);
  }
  for (std::thread& worker : workers) worker.join();
  return absl::OkStatus();
}

absl::Status RandomWeights::ReadFloat(absl::string_view name, absl::Span<float> out) const {
  TRIDENT_ASSIGN_OR_RETURN(size_t i, Find(name));
  const bool bf16 = spec_.dtype == numeric::DType::kBF16;
  return ForEach(name, {SliceAxis::kRows, 0, plan_->tensors[i].rows()}, out.size(),
                 [&](size_t at, float v) {
                   out[at] = bf16 ? numeric::Bf16ToFloat(numeric::FloatToBf16(v)) : v;
                 });
}

absl::Status RandomWeights::ReadBf16(absl::string_view name, absl::Span<uint16_t> out) const {
  TRIDENT_ASSIGN_OR_RETURN(size_t i, Find(name));
  return ReadBf16Slice(name, {SliceAxis::kRows, 0, plan_->tensors[i].rows()}, out);
}

absl::Status RandomWeights::ReadBf16Slice(absl::string_view name, const TensorSlice& slice,
                                          absl::Span<uint16_t> out) const {
  return ForEach(name, slice, out.size(),
                 [&](size_t at, float v) { out[at] = numeric::FloatToBf16(v); });
}

}  // namespace trident::model::generate
