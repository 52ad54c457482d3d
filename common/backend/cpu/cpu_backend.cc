#include "common/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/rope_config.h"
#include "common/cpu/threads.h"
#include "common/logging/log.h"
#include "common/model/checkpoint.h"
#include "common/model/llama_weights.h"
#include "common/model/load_progress.h"
#include "common/status/status_macros.h"
#include "kernels/cpu/paged_attention/paged_attention.h"
#include "kernels/cpu/rms_norm/rms_norm.h"
#include "kernels/cpu/rope/rope.h"
#include "kernels/cpu/silu_mul/silu_mul.h"

namespace trident::backend {
namespace {

using numeric::DType;

// Reads tensors into one weight matrix, stacked along the output dimension
// (fused q/k/v, fused gate/up), in the compute format.
class StackedWeight {
 public:
  StackedWeight(DType dtype, int64_t in_features, kernels::cpu::LinearCompute mode)
      : dtype_(dtype), in_(in_features), mode_(mode) {}

  absl::Status Append(const model::TensorReader& ckpt, const std::string& name, int64_t rows,
                      model::LoadProgress& progress) {
    const int64_t n = rows * in_;
    if (dtype_ == DType::kF32) {
      const size_t at = f32_.size();
      f32_.resize(at + n);
      TRIDENT_RETURN_IF_ERROR(ckpt.ReadFloat(name, absl::MakeSpan(f32_).subspan(at, n)));
    } else {
      const size_t at = bf16_.size();
      bf16_.resize(at + n);
      TRIDENT_RETURN_IF_ERROR(ckpt.ReadBf16(name, absl::MakeSpan(bf16_).subspan(at, n)));
    }
    TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt.Info(name));
    progress.Add(info.num_bytes);
    out_ += rows;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<kernels::cpu::Linear>> Build(const float* bias,
                                                              int64_t* weight_bytes) {
    const void* data = dtype_ == DType::kF32 ? static_cast<const void*>(f32_.data())
                                             : static_cast<const void*>(bf16_.data());
    auto linear = kernels::cpu::Linear::Create(in_, out_, dtype_, data, bias, mode_);
    f32_ = {};
    bf16_ = {};
    // What a step really reads: the packed weights (f32 where the CPU has no
    // bf16 matmul and bf16 weights were widened).
    if (linear.ok()) *weight_bytes += static_cast<int64_t>((*linear)->packed_weight_bytes());
    return linear;
  }

 private:
  DType dtype_;
  int64_t in_;
  kernels::cpu::LinearCompute mode_;
  int64_t out_ = 0;
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
};

absl::StatusOr<std::vector<float>> ReadVector(const model::TensorReader& ckpt,
                                              const std::string& name, int64_t n,
                                              model::LoadProgress& progress) {
  std::vector<float> v(n);
  TRIDENT_RETURN_IF_ERROR(ckpt.ReadFloat(name, absl::MakeSpan(v)));
  TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt.Info(name));
  progress.Add(info.num_bytes);
  return v;
}

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

CpuBackend::~CpuBackend() = default;

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const std::string& model_dir,
                                                               const CpuBackendOptions& options) {
  TRIDENT_ASSIGN_OR_RETURN(const model::ModelConfig config, model::LoadModelConfig(model_dir));
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> ckpt,
                           model::Checkpoint::Open(model_dir));
  TRIDENT_RETURN_IF_ERROR(model::ValidateLlamaCheckpoint(config, *ckpt));
  // The weights are copied into the backend's own layout: the checkpoint's
  // mapping ends with this call.
  return CreateFromWeights(*ckpt, config, options);
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::CreateFromWeights(
    const model::TensorReader& weights, const model::ModelConfig& config,
    const CpuBackendOptions& options) {
  if (options.compute_dtype == DType::kF16 || options.kv_dtype == DType::kF16) {
    return absl::InvalidArgumentError("the CPU backend computes in f32 or bf16, not f16");
  }
  std::unique_ptr<CpuBackend> backend(new CpuBackend());
  backend->options_ = options;
  TRIDENT_RETURN_IF_ERROR(cpu::ConfigureCpuThreads(options.num_threads, options.pin_threads));
  backend->threads_configured_for_ = std::this_thread::get_id();
  TRIDENT_RETURN_IF_ERROR(backend->Load(weights, config));
  return backend;
}

absl::Status CpuBackend::Load(const model::TensorReader& ckpt, const model::ModelConfig& config) {
  config_ = config;
  const int64_t h = config_.hidden_size;
  const int64_t q_out = static_cast<int64_t>(config_.num_attention_heads) * config_.head_dim;
  const int64_t kv_out = static_cast<int64_t>(config_.num_key_value_heads) * config_.head_dim;
  const int64_t inter = config_.intermediate_size;
  const DType dt = options_.compute_dtype;
  const kernels::cpu::LinearCompute mode = options_.bf16_split_activations
                                               ? kernels::cpu::LinearCompute::kBf16SplitActivations
                                               : kernels::cpu::LinearCompute::kWeightDtype;

  RealClock real_clock;
  Clock* clock = options_.clock != nullptr ? options_.clock : &real_clock;
  model::LoadProgress progress(ckpt.total_bytes(), clock);

  TRIDENT_ASSIGN_OR_RETURN(
      embedding_, ReadVector(ckpt, "model.embed_tokens.weight", config_.vocab_size * h, progress));
  layers_.resize(config_.num_hidden_layers);
  for (int32_t l = 0; l < config_.num_hidden_layers; ++l) {
    Layer& layer = layers_[l];
    auto name = [l](const char* suffix) { return model::LayerTensorName(l, suffix); };
    TRIDENT_ASSIGN_OR_RETURN(layer.input_norm,
                             ReadVector(ckpt, name("input_layernorm.weight"), h, progress));
    TRIDENT_ASSIGN_OR_RETURN(
        layer.post_norm, ReadVector(ckpt, name("post_attention_layernorm.weight"), h, progress));
    StackedWeight qkv(dt, h, mode);
    TRIDENT_RETURN_IF_ERROR(qkv.Append(ckpt, name("self_attn.q_proj.weight"), q_out, progress));
    TRIDENT_RETURN_IF_ERROR(qkv.Append(ckpt, name("self_attn.k_proj.weight"), kv_out, progress));
    TRIDENT_RETURN_IF_ERROR(qkv.Append(ckpt, name("self_attn.v_proj.weight"), kv_out, progress));
    std::vector<float> qkv_bias;
    if (config_.attention_bias) {
      for (const char* b :
           {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) {
        TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt.Info(name(b)));
        TRIDENT_ASSIGN_OR_RETURN(std::vector<float> v,
                                 ReadVector(ckpt, name(b), info.numel, progress));
        qkv_bias.insert(qkv_bias.end(), v.begin(), v.end());
      }
    }
    TRIDENT_ASSIGN_OR_RETURN(layer.qkv, qkv.Build(qkv_bias.empty() ? nullptr : qkv_bias.data(),
                                                  &weight_bytes_per_step_));
    StackedWeight o(dt, q_out, mode);
    TRIDENT_RETURN_IF_ERROR(o.Append(ckpt, name("self_attn.o_proj.weight"), h, progress));
    std::vector<float> o_bias;
    if (config_.o_proj_bias) {
      TRIDENT_ASSIGN_OR_RETURN(o_bias, ReadVector(ckpt, name(model::kOProjBias), h, progress));
    }
    TRIDENT_ASSIGN_OR_RETURN(
        layer.o, o.Build(o_bias.empty() ? nullptr : o_bias.data(), &weight_bytes_per_step_));
    StackedWeight gate_up(dt, h, mode);
    TRIDENT_RETURN_IF_ERROR(gate_up.Append(ckpt, name("mlp.gate_proj.weight"), inter, progress));
    TRIDENT_RETURN_IF_ERROR(gate_up.Append(ckpt, name("mlp.up_proj.weight"), inter, progress));
    std::vector<float> gate_up_bias, down_bias;
    if (config_.mlp_bias) {
      TRIDENT_ASSIGN_OR_RETURN(gate_up_bias,
                               ReadVector(ckpt, name(model::kGateProjBias), inter, progress));
      TRIDENT_ASSIGN_OR_RETURN(std::vector<float> up_bias,
                               ReadVector(ckpt, name(model::kUpProjBias), inter, progress));
      gate_up_bias.insert(gate_up_bias.end(), up_bias.begin(), up_bias.end());
      TRIDENT_ASSIGN_OR_RETURN(down_bias,
                               ReadVector(ckpt, name(model::kDownProjBias), h, progress));
    }
    TRIDENT_ASSIGN_OR_RETURN(layer.gate_up,
                             gate_up.Build(gate_up_bias.empty() ? nullptr : gate_up_bias.data(),
                                           &weight_bytes_per_step_));
    StackedWeight down(dt, inter, mode);
    TRIDENT_RETURN_IF_ERROR(down.Append(ckpt, name("mlp.down_proj.weight"), h, progress));
    TRIDENT_ASSIGN_OR_RETURN(layer.down, down.Build(down_bias.empty() ? nullptr : down_bias.data(),
                                                    &weight_bytes_per_step_));
  }
  TRIDENT_ASSIGN_OR_RETURN(final_norm_, ReadVector(ckpt, "model.norm.weight", h, progress));
  StackedWeight head(dt, h, mode);
  const std::string head_name = config_.tie_word_embeddings && !ckpt.Has("lm_head.weight")
                                    ? "model.embed_tokens.weight"
                                    : "lm_head.weight";
  TRIDENT_RETURN_IF_ERROR(head.Append(ckpt, head_name, config_.vocab_size, progress));
  TRIDENT_ASSIGN_OR_RETURN(lm_head_, head.Build(nullptr, &weight_bytes_per_step_));

  const kernels::cpu::RopeConfig rope = RopeConfigFor(config_);
  inv_freq_ = kernels::cpu::RopeInvFreq(rope);

  max_model_len_ = config_.max_position_embeddings;
  if (options_.max_model_len > 0) max_model_len_ = std::min(max_model_len_, options_.max_model_len);

  kv_spec_.num_layers = config_.num_hidden_layers;
  kv_spec_.num_kv_heads = config_.num_key_value_heads;
  kv_spec_.head_dim = config_.head_dim;
  kv_spec_.block_size = options_.kv_block_size;
  kv_spec_.dtype = options_.kv_dtype;
  kv_spec_.num_blocks = 1;
  kv_spec_.num_blocks =
      static_cast<int32_t>(options_.kv_cache_bytes / kv_spec_.BytesPerBlockAllLayers());
  if (kv_spec_.num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache budget of ", options_.kv_cache_bytes,
                                                   " bytes holds no block of ",
                                                   kv_spec_.BytesPerBlockAllLayers(), " bytes"));
  }
  TRIDENT_ASSIGN_OR_RETURN(kv_cache_, kv::HostKvCache::Create(kv_spec_));
  TRIDENT_LOG(INFO) << "loaded " << config_.architecture << ": " << Describe();
  return absl::OkStatus();
}

absl::StatusOr<KvMemory> CpuBackend::kv_memory() const {
  KvMemory m;
  m.base = kv_cache_->data();
  m.bytes = kv_cache_->size_bytes();
  m.spec = kv_spec_;
  m.usable_blocks = kv_spec_.num_blocks;
  return m;
}

std::string CpuBackend::Describe() const {
  std::string matmuls = absl::StrCat(numeric::DTypeName(options_.compute_dtype), " weights");
  if (options_.compute_dtype == DType::kBF16) {
    if (lm_head_ != nullptr && lm_head_->compute_dtype() == DType::kF32) {
      absl::StrAppend(&matmuls, " widened to f32 (no bf16 matmul on this CPU)");
    } else if (options_.bf16_split_activations) {
      absl::StrAppend(&matmuls, ", split bf16 activations");
    } else {
      absl::StrAppend(&matmuls, ", bf16 activations");
    }
  }
  return absl::StrCat("cpu, ", matmuls, ", ", config_.num_hidden_layers, " layers, hidden ",
                      config_.hidden_size, ", vocab ", config_.vocab_size, ", KV ",
                      kv_spec_.num_blocks, " blocks of ", kv_spec_.block_size, " tokens (",
                      numeric::DTypeName(kv_spec_.dtype), "), ", cpu::CpuThreadCount(), " threads");
}

absl::Status CpuBackend::Forward(absl::Span<const StepSequence> batch, float* logits) {
  // OpenMP's thread count (and our pinning) belong to the thread that opens
  // parallel regions: set them up again when a new thread drives the backend
  // (the engine's loop runs on its own thread, not the one that created us).
  if (std::this_thread::get_id() != threads_configured_for_) {
    TRIDENT_RETURN_IF_ERROR(cpu::ConfigureCpuThreads(options_.num_threads, options_.pin_threads));
    threads_configured_for_ = std::this_thread::get_id();
  }
  TRIDENT_RETURN_IF_ERROR(SplitBatch(batch));
  if (passes_[0].batch.empty()) return absl::OkStatus();
  for (int p = 0; p < num_passes_; ++p) TRIDENT_RETURN_IF_ERROR(Embed(passes_[p]));
  Pass& main = passes_[0];
  for (int32_t l = 0; l < config_.num_hidden_layers; ++l) {
    if (num_passes_ == 1) {
      absl::Status begun = BeginLayer(main, l);
      if (layer_observer()) layer_observer()(l);
      AttendLocal(main, l);
      absl::Status ended = EndLayer(main, l);
      TRIDENT_RETURN_IF_ERROR(begun);
      TRIDENT_RETURN_IF_ERROR(ended);
      continue;
    }
    // Pipelined: the second sub-batch's requests go out first and are
    // answered while the first sub-batch's whole layer runs here.
    Pass& cpu = passes_[1];
    absl::Status cpu_begun = BeginLayer(cpu, l);
    absl::Status begun = BeginLayer(main, l);
    if (layer_observer()) layer_observer()(l);
    AttendLocal(main, l);
    absl::Status ended = EndLayer(main, l);
    absl::Status cpu_ended = EndLayer(cpu, l);
    for (const absl::Status* status : {&cpu_begun, &begun, &ended, &cpu_ended}) {
      TRIDENT_RETURN_IF_ERROR(*status);
    }
  }
  if (num_passes_ == 1) {
    Head(main, logits);
    return absl::OkStatus();
  }
  // Each pass's logit rows, scattered into batch order.
  const int64_t vocab = config_.vocab_size;
  for (int p = 0; p < num_passes_; ++p) {
    Pass& pass = passes_[p];
    Grow(pass.logits, pass.rows * vocab);
    Head(pass, pass.logits.data());
    for (int64_t r = 0; r < pass.rows; ++r) {
      std::memcpy(logits + pass.logit_rows[r] * vocab, &pass.logits[r * vocab],
                  vocab * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::SplitBatch(absl::Span<const StepSequence> batch) {
  for (Pass& pass : passes_) {
    pass.batch.clear();
    pass.logit_rows.clear();
    pass.total = 0;
    pass.rows = 0;
  }
  int64_t logit_row = 0;
  for (const StepSequence& s : batch) {
    TRIDENT_RETURN_IF_ERROR(ValidateSequence(s));
    Pass& pass = passes_[s.sub_batch];
    pass.batch.push_back(s);
    pass.total += static_cast<int64_t>(s.tokens.size());
    if (s.want_logits) {
      pass.logit_rows.push_back(logit_row++);
      ++pass.rows;
    }
  }
  // A second sub-batch alone is just a batch.
  if (passes_[0].batch.empty()) std::swap(passes_[0], passes_[1]);
  num_passes_ = passes_[1].batch.empty() ? 1 : 2;
  return absl::OkStatus();
}

absl::Status CpuBackend::ValidateSequence(const StepSequence& s) const {
  const int32_t bs = kv_spec_.block_size;
  const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
  if (s.tokens.empty() || s.start_position < 0 || end > max_model_len_) {
    return absl::InvalidArgumentError(absl::StrCat("sequence spans positions [", s.start_position,
                                                   ", ", end, "), outside the context window of ",
                                                   max_model_len_));
  }
  TRIDENT_RETURN_IF_ERROR(ValidateOffloadFields(s));
  if (s.remote.service != nullptr) return absl::OkStatus();
  if (static_cast<int64_t>(s.block_table.size()) * bs < end) {
    return absl::InvalidArgumentError(absl::StrCat("block table of ", s.block_table.size(),
                                                   " blocks cannot hold ", end, " positions"));
  }
  for (int32_t b : s.block_table) {
    if (b < 0 || b >= kv_spec_.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("block id ", b, " outside the cache of ", kv_spec_.num_blocks, " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Embed(Pass& pass) {
  const int64_t h = config_.hidden_size;
  const int64_t q_out = static_cast<int64_t>(config_.num_attention_heads) * config_.head_dim;
  const int64_t kv_out = static_cast<int64_t>(config_.num_key_value_heads) * config_.head_dim;
  const int64_t total = pass.total;
  Grow(pass.x, total * h);
  Grow(pass.hn, total * h);
  Grow(pass.qkv, total * (q_out + 2 * kv_out));
  Grow(pass.attn, total * q_out);
  Grow(pass.tmp, total * h);
  Grow(pass.gate_up, total * 2 * config_.intermediate_size);
  Grow(pass.act, total * config_.intermediate_size);
  Grow(pass.positions, total);
  Grow(pass.slots, total);
  const int32_t bs = kv_spec_.block_size;
  pass.seqs.clear();
  pass.local_seqs.clear();
  pass.remote.set_shape({.num_q_heads = config_.num_attention_heads,
                         .num_kv_heads = config_.num_key_value_heads,
                         .head_dim = config_.head_dim,
                         .wire = kv_spec_.dtype == numeric::DType::kF32
                                     ? transport::attention::WireDType::kF32
                                     : transport::attention::WireDType::kBF16});
  pass.remote.Clear();
  int64_t row = 0;
  for (const StepSequence& s : pass.batch) {
    const bool remote = s.remote.service != nullptr;
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int32_t token = s.tokens[i];
      if (token < 0 || token >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", token, " outside the vocabulary of ", config_.vocab_size));
      }
      const int32_t pos = s.start_position + static_cast<int32_t>(i);
      pass.positions[row + i] = pos;
      // A CPU-resident sequence's KV goes to its service, not our cache.
      pass.slots[row + i] =
          remote ? -1 : static_cast<int64_t>(s.block_table[pos / bs]) * bs + pos % bs;
      std::memcpy(&pass.x[(row + i) * h], &embedding_[static_cast<int64_t>(token) * h],
                  h * sizeof(float));
    }
    kernels::cpu::AttentionSequence a;
    a.block_table = s.block_table.data();
    a.context_len = s.start_position + static_cast<int32_t>(s.tokens.size());
    a.query_len = static_cast<int32_t>(s.tokens.size());
    a.query_row = row;
    pass.seqs.push_back(a);
    if (remote) {
      pass.remote.Add(s.remote, s.start_position, row);
    } else {
      pass.local_seqs.push_back(a);
    }
    row += static_cast<int64_t>(s.tokens.size());
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::BeginLayer(Pass& pass, int32_t l) {
  const int64_t h = config_.hidden_size;
  const int32_t nq = config_.num_attention_heads;
  const int32_t nkv = config_.num_key_value_heads;
  const int32_t hd = config_.head_dim;
  const int64_t q_out = static_cast<int64_t>(nq) * hd;
  const int64_t kv_out = static_cast<int64_t>(nkv) * hd;
  const int64_t qkv_width = q_out + 2 * kv_out;
  const float eps = config_.rms_norm_eps;
  const int64_t total = pass.total;
  Layer& layer = layers_[l];
  if (l == 0) {
    kernels::cpu::RmsNorm(pass.x.data(), layer.input_norm.data(), total, h, eps, pass.hn.data());
  } else {
    kernels::cpu::AddRmsNorm(pass.x.data(), pass.tmp.data(), layer.input_norm.data(), total, h, eps,
                             pass.hn.data());
  }
  layer.qkv->Forward(pass.hn.data(), total, pass.qkv.data());
  float* q = pass.qkv.data();
  float* k = q + q_out;
  float* v = k + kv_out;
  kernels::cpu::ApplyRope(q, qkv_width, nq, k, qkv_width, nkv, hd, pass.positions.data(), total,
                          inv_freq_.data());
  // CPU-resident sequences' attention runs at their services while ours
  // runs here.
  absl::Status remote = pass.remote.Start(l, numeric::DType::kF32, q, qkv_width);
  if (!pass.local_seqs.empty()) {
    kernels::cpu::AppendKv(LayerKv(l), k, qkv_width, v, qkv_width, pass.slots.data(), total);
  }
  return remote;
}

kernels::cpu::PagedKv CpuBackend::LayerKv(int32_t l) const {
  kernels::cpu::PagedKv kv;
  kv.base = kv_cache_->LayerBase(l);
  kv.dtype = kv_spec_.dtype;
  kv.block_size = kv_spec_.block_size;
  kv.num_kv_heads = config_.num_key_value_heads;
  kv.head_dim = config_.head_dim;
  kv.block_stride_elems = kv_spec_.block_stride_elements();
  kv.value_offset_elems = kv_spec_.value_offset_elements();
  return kv;
}

void CpuBackend::AttendLocal(Pass& pass, int32_t l) {
  if (pass.local_seqs.empty()) return;
  const int32_t nq = config_.num_attention_heads;
  const int32_t hd = config_.head_dim;
  const int64_t q_out = static_cast<int64_t>(nq) * hd;
  const int64_t qkv_width = q_out + 2 * static_cast<int64_t>(config_.num_key_value_heads) * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  kernels::cpu::PagedAttention(LayerKv(l), pass.qkv.data(), qkv_width, nq, pass.local_seqs, scale,
                               pass.attn.data(), q_out);
}

absl::Status CpuBackend::EndLayer(Pass& pass, int32_t l) {
  TRIDENT_RETURN_IF_ERROR(pass.remote.Finish(remote_timeout(), numeric::DType::kF32,
                                             pass.attn.data(),
                                             int64_t{config_.num_attention_heads} * config_.head_dim,
                                             remote_timing_));
  const int64_t h = config_.hidden_size;
  const int64_t inter = config_.intermediate_size;
  const float eps = config_.rms_norm_eps;
  const int64_t total = pass.total;
  Layer& layer = layers_[l];
  layer.o->Forward(pass.attn.data(), total, pass.tmp.data());
  kernels::cpu::AddRmsNorm(pass.x.data(), pass.tmp.data(), layer.post_norm.data(), total, h, eps,
                           pass.hn.data());
  layer.gate_up->Forward(pass.hn.data(), total, pass.gate_up.data());
  kernels::cpu::SiluMulReference(pass.gate_up.data(), pass.act.data(), total, inter);
  layer.down->Forward(pass.act.data(), total, pass.tmp.data());
  return absl::OkStatus();
}

void CpuBackend::Head(Pass& pass, float* logits) {
  // Final residual add and norm, then the head, for the wanted rows only.
  if (pass.rows == 0) return;
  const int64_t h = config_.hidden_size;
  Grow(pass.last, pass.rows * h);
  // Compact the wanted rows of the residual and the last delta to the front
  // (each moves to a row at or before its own, so in place is safe).
  int64_t r = 0;
  for (size_t i = 0; i < pass.batch.size(); ++i) {
    if (!pass.batch[i].want_logits) continue;
    const int64_t src = pass.seqs[i].query_row + pass.seqs[i].query_len - 1;
    if (src != r) {
      std::memmove(&pass.x[r * h], &pass.x[src * h], h * sizeof(float));
      std::memmove(&pass.tmp[r * h], &pass.tmp[src * h], h * sizeof(float));
    }
    ++r;
  }
  kernels::cpu::AddRmsNorm(pass.x.data(), pass.tmp.data(), final_norm_.data(), pass.rows, h,
                           config_.rms_norm_eps, pass.last.data());
  lm_head_->Forward(pass.last.data(), pass.rows, logits);
}

}  // namespace trident::backend
