#include "common/backend/fake_model_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"

namespace trident::backend {

FakeModelBackend::FakeModelBackend(int32_t vocab_size, int32_t num_blocks, int32_t block_size,
                                   int32_t max_model_len)
    : vocab_size_(vocab_size),
      num_blocks_(num_blocks),
      block_size_(block_size),
      max_model_len_(max_model_len),
      slots_(static_cast<size_t>(num_blocks) * block_size, -1) {}

void FakeModelBackend::LogitsFor(absl::Span<const int32_t> history, float* out) const {
  // A rolling hash of the history picks a preferred token; every logit is a
  // distinct value so argmax is unambiguous.
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : history) {
    h ^= static_cast<uint64_t>(t) + 0x9e3779b97f4a7c15ull;
    h *= 1099511628211ull;
  }
  const int32_t preferred = static_cast<int32_t>(h % static_cast<uint64_t>(vocab_size_));
  for (int32_t v = 0; v < vocab_size_; ++v) {
    const uint64_t mix = (h >> 7) ^ (static_cast<uint64_t>(v) * 0x2545F4914F6CDD1Dull);
    out[v] = static_cast<float>(mix % 1000) / 1000.0f;
  }
  out[preferred] = 2.0f;
}

absl::Status FakeModelBackend::Forward(absl::Span<const StepSequence> batch, float* logits) {
  ++forward_calls_;
  int64_t step_tokens = 0;
  int64_t row = 0;
  for (const StepSequence& seq : batch) {
    const int32_t end = seq.start_position + static_cast<int32_t>(seq.tokens.size());
    if (static_cast<int64_t>(seq.block_table.size()) * block_size_ < end) {
      return absl::InvalidArgumentError(absl::StrCat("fake backend: block table of ",
                                                     seq.block_table.size(), " blocks cannot hold ",
                                                     end, " tokens"));
    }
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      const int32_t pos = seq.start_position + static_cast<int32_t>(i);
      const int32_t block = seq.block_table[pos / block_size_];
      if (block < 0 || block >= num_blocks_) {
        return absl::InvalidArgumentError(absl::StrCat("fake backend: block ", block));
      }
      slots_[static_cast<size_t>(block) * block_size_ + pos % block_size_] = seq.tokens[i];
    }
    step_tokens += static_cast<int64_t>(seq.tokens.size());
    if (!seq.want_logits) continue;
    // Read the whole history back through the block table.
    std::vector<int32_t> history(end);
    for (int32_t pos = 0; pos < end; ++pos) {
      const int32_t block = seq.block_table[pos / block_size_];
      history[pos] = slots_[static_cast<size_t>(block) * block_size_ + pos % block_size_];
      if (history[pos] < 0) {
        return absl::InternalError(absl::StrCat("fake backend: position ", pos, " never written"));
      }
    }
    LogitsFor(history, logits + row * vocab_size_);
    ++row;
  }
  tokens_processed_ += step_tokens;
  if (step_tokens > max_step_tokens_) max_step_tokens_ = step_tokens;
  if (layer_observer()) {
    for (int32_t l = 0; l < reported_layers_; ++l) {
      ++layer_reports_;
      layer_observer()(l);
    }
  }
  return absl::OkStatus();
}

absl::Status FakeModelBackend::ForwardSample(absl::Span<const StepSequence> batch,
                                             absl::Span<const RowSampling> rows,
                                             absl::Span<sampling::SampledToken> out) {
  if (!samples_on_device_) return ModelBackend::ForwardSample(batch, rows, out);
  size_t wanted = 0;
  for (const StepSequence& s : batch) wanted += s.want_logits ? 1 : 0;
  if (rows.size() != wanted || out.size() != wanted) {
    return absl::InvalidArgumentError("ForwardSample: one RowSampling and output per wanted row");
  }
  std::vector<float> logits(wanted * static_cast<size_t>(vocab_size_));
  if (absl::Status status = Forward(batch, logits.data()); !status.ok()) return status;
  sampling::Sampler sampler;
  for (size_t r = 0; r < wanted; ++r) {
    out[r] = sampler.Sample(absl::MakeConstSpan(logits).subspan(r * vocab_size_, vocab_size_),
                            *rows[r].params, *rows[r].penalties, rows[r].output_position);
    ++device_sampled_rows_;
  }
  return absl::OkStatus();
}

void FakeModelBackend::CopyKvBlocks(const FakeModelBackend& from, absl::Span<const int32_t> src,
                                    absl::Span<const int32_t> dst) {
  TRIDENT_CHECK(from.block_size_ == block_size_ && src.size() == dst.size());
  for (size_t i = 0; i < src.size(); ++i) {
    std::copy_n(from.slots_.begin() + int64_t{src[i]} * block_size_, block_size_,
                slots_.begin() + int64_t{dst[i]} * block_size_);
  }
}

}  // namespace trident::backend
