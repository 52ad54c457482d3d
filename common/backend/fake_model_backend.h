// A working in-memory ModelBackend for engine tests: its "KV cache" stores
// token ids in slots, and its logits are a deterministic function of the
// whole token history read back through the block table. A scheduler that
// writes a wrong slot, reuses a live block or loses a position changes the
// logits, and so the generated tokens.

#ifndef TRIDENT_COMMON_BACKEND_FAKE_MODEL_BACKEND_H_
#define TRIDENT_COMMON_BACKEND_FAKE_MODEL_BACKEND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/backend/model_backend.h"

namespace trident::backend {

class FakeModelBackend : public ModelBackend {
 public:
  FakeModelBackend(int32_t vocab_size, int32_t num_blocks, int32_t block_size,
                   int32_t max_model_len);

  int32_t vocab_size() const override { return vocab_size_; }
  int32_t max_model_len() const override { return max_model_len_; }
  KvCapacity kv_capacity() const override { return {num_blocks_, block_size_}; }
  std::string Describe() const override { return "fake"; }
  absl::Status Forward(absl::Span<const StepSequence> batch, float* logits) override;

  // With this on, the fake claims to sample on the device: ForwardSample
  // runs Forward and the CPU sampler per row, as a GPU sampler must behave.
  void set_samples_on_device(bool on) { samples_on_device_ = on; }
  bool samples_on_device() const override { return samples_on_device_; }
  absl::Status ForwardSample(absl::Span<const StepSequence> batch,
                             absl::Span<const RowSampling> rows,
                             absl::Span<sampling::SampledToken> out) override;
  int64_t device_sampled_rows() const { return device_sampled_rows_; }
  // With n > 0 the fake reports layer progress: after a forward has written
  // its slots, it calls the layer observer (if set) for layers 0 .. n-1.
  void set_reported_layers(int32_t n) { reported_layers_ = n; }
  bool reports_layer_progress() const override { return reported_layers_ > 0; }
  // Layer observer calls so far.
  int64_t layer_reports() const { return layer_reports_; }

  // Copies the "KV" of blocks src[i] of `from` into blocks dst[i] of this
  // fake (what a KV transfer between two workers does). Same block size.
  void CopyKvBlocks(const FakeModelBackend& from, absl::Span<const int32_t> src,
                    absl::Span<const int32_t> dst);

  // The logits the fake produces for a full token history (for tests that
  // compute expected outputs independently of any scheduler).
  void LogitsFor(absl::Span<const int32_t> history, float* out) const;

  int64_t forward_calls() const { return forward_calls_; }
  int64_t tokens_processed() const { return tokens_processed_; }
  // Largest number of tokens passed in one Forward.
  int64_t max_step_tokens() const { return max_step_tokens_; }

 private:
  int32_t vocab_size_;
  int32_t num_blocks_;
  int32_t block_size_;
  int32_t max_model_len_;
  // Token id per slot; -1 when never written.
  std::vector<int32_t> slots_;
  int64_t forward_calls_ = 0;
  int64_t tokens_processed_ = 0;
  int64_t max_step_tokens_ = 0;
  bool samples_on_device_ = false;
  int32_t reported_layers_ = 0;
  int64_t layer_reports_ = 0;
  int64_t device_sampled_rows_ = 0;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_FAKE_MODEL_BACKEND_H_
