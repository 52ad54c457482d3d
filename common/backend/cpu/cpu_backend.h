// The CPU backend: a Llama-family decoder (Llama 2/3, Mistral, Qwen2) over a
// paged KV cache in host memory. oneDNN matmuls (fp32, or bf16 weights and
// activations with fp32 accumulation), the project's own RMSNorm, RoPE,
// SwiGLU and paged attention kernels; OpenMP threads pinned to cores.
//
// It is also the executable reference the CUDA backend is checked against.

#ifndef TRIDENT_COMMON_BACKEND_CPU_CPU_BACKEND_H_
#define TRIDENT_COMMON_BACKEND_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/model_backend.h"
#include "common/backend/remote_rows.h"
#include "common/kv/kv_cache.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"
#include "common/numeric/dtype.h"
#include "common/time/clock.h"
#include "kernels/cpu/linear/linear.h"
#include "kernels/cpu/paged_attention/paged_attention.h"

namespace trident::backend {

struct CpuBackendOptions {
  // Matmul precision: kF32 (fp32 throughout) or kBF16 (weights and matmul
  // inputs in bf16, fp32 accumulation and fp32 everywhere else).
  numeric::DType compute_dtype = numeric::DType::kF32;
  // With kBF16 compute: carry matmul inputs as two bf16 terms (~16 bits,
  // near-f32 accuracy; the matmuls do twice the work) instead of rounding
  // them to bf16 (the usual bf16 inference numerics, fastest).
  bool bf16_split_activations = false;
  // KV element format; kF32 or kBF16.
  numeric::DType kv_dtype = numeric::DType::kF32;
  // Host memory for the KV cache.
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int32_t kv_block_size = 16;
  // Caps the context window below the model's max_position_embeddings
  // (0: the model's).
  int32_t max_model_len = 0;
  // OpenMP threads (0: one per physical core available to the process).
  int32_t num_threads = 0;
  bool pin_threads = true;
  // For load-progress reporting; nullptr means the real clock.
  Clock* clock = nullptr;
};

class CpuBackend : public ModelBackend {
 public:
  // Loads and validates `model_dir` (config.json, safetensors) and allocates
  // the KV cache. INVALID_ARGUMENT / FAILED_PRECONDITION for bad or
  // unsupported models, naming the file and tensor.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const std::string& model_dir,
                                                            const CpuBackendOptions& options);
  // The same over weights from any reader, with their config (model/generate's
  // RandomWeights: a worker's --generated_weights). The weights are not
  // checked against the config (a checkpoint's are).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> CreateFromWeights(
      const model::TensorReader& weights, const model::ModelConfig& config,
      const CpuBackendOptions& options);
  ~CpuBackend() override;

  int32_t vocab_size() const override { return config_.vocab_size; }
  int32_t max_model_len() const override { return max_model_len_; }
  KvCapacity kv_capacity() const override { return {kv_spec_.num_blocks, kv_spec_.block_size}; }
  absl::StatusOr<KvMemory> kv_memory() const override;
  std::string Describe() const override;
  absl::Status Forward(absl::Span<const StepSequence> batch, float* logits) override;
  bool reports_layer_progress() const override { return true; }
  bool supports_remote_attention() const override { return true; }
  bool supports_pipelining() const override { return true; }
  RemoteAttentionTiming remote_attention_timing() const override { return remote_timing_; }

  const model::ModelConfig& config() const { return config_; }
  // Bytes of weights read by one decode step (every packed matmul weight
  // once).
  int64_t weight_bytes_per_step() const { return weight_bytes_per_step_; }

 private:
  struct Layer {
    std::vector<float> input_norm;
    std::vector<float> post_norm;
    std::unique_ptr<kernels::cpu::Linear> qkv;
    std::unique_ptr<kernels::cpu::Linear> o;
    std::unique_ptr<kernels::cpu::Linear> gate_up;
    std::unique_ptr<kernels::cpu::Linear> down;
  };

  // The step's state for one pass over the layers: the whole batch, or one
  // of the two sub-batches of a pipelined step (StepSequence::sub_batch).
  struct Pass {
    std::vector<StepSequence> batch;
    // Per sequence of `batch` with want_logits: its row in the caller's
    // logits.
    std::vector<int64_t> logit_rows;
    int64_t total = 0;  // token rows
    int64_t rows = 0;   // logit rows
    // The pass's sequences as the attention kernel sees them: all of them
    // (batch order), and those resident here.
    std::vector<kernels::cpu::AttentionSequence> seqs, local_seqs;
    // Its CPU-resident rows, grouped by service (one request per service
    // and layer).
    RemoteRows remote;
    // Activations, grown as needed.
    std::vector<float> x, hn, qkv, attn, tmp, gate_up, act, last, logits;
    std::vector<int32_t> positions;
    std::vector<int64_t> slots;
  };

  // Forward's steps: every sequence inside the context window, the cache
  // and the vocabulary (INVALID_ARGUMENT naming what is not), split into
  // passes; per pass the embeddings, positions and KV slots of every token;
  // a decoder layer in three parts (up to the attention, which starts the
  // remote requests; the local attention; the rest, which takes their
  // answers); the head.
  absl::Status SplitBatch(absl::Span<const StepSequence> batch);
  absl::Status ValidateSequence(const StepSequence& s) const;
  absl::Status Embed(Pass& pass);
  absl::Status BeginLayer(Pass& pass, int32_t layer);
  void AttendLocal(Pass& pass, int32_t layer);
  absl::Status EndLayer(Pass& pass, int32_t layer);
  void Head(Pass& pass, float* logits);
  kernels::cpu::PagedKv LayerKv(int32_t layer) const;

  CpuBackend() = default;
  absl::Status Load(const model::TensorReader& ckpt, const model::ModelConfig& config);

  model::ModelConfig config_;
  CpuBackendOptions options_;
  // The thread whose OpenMP settings were configured (see Forward).
  std::thread::id threads_configured_for_;
  int32_t max_model_len_ = 0;
  int64_t weight_bytes_per_step_ = 0;
  std::vector<Layer> layers_;
  // passes_[0] runs alone, or with passes_[1] (a pipelined step).
  Pass passes_[2];
  int num_passes_ = 1;
  RemoteAttentionTiming remote_timing_;
  // fp32 embedding rows [vocab, hidden].
  std::vector<float> embedding_;
  std::vector<float> final_norm_;
  std::unique_ptr<kernels::cpu::Linear> lm_head_;
  std::vector<float> inv_freq_;
  kv::KvCacheSpec kv_spec_;
  std::unique_ptr<kv::HostKvCache> kv_cache_;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_CPU_CPU_BACKEND_H_
