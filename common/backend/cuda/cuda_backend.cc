#include "common/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/rope_config.h"
#include "common/kv/kv_layout.h"
#include "common/logging/log.h"
#include "common/model/checkpoint.h"
#include "common/model/llama_weights.h"
#include "common/model/load_progress.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"
#include "kernels/cpu/rope/rope.h"
#include "kernels/cuda/embedding/embedding.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/kv_append/kv_append.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"
#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention.h"
#include "kernels/cuda/rms_norm/rms_norm.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/cuda/silu_mul/silu_mul.h"

namespace trident::backend {
namespace {

using numeric::DType;
namespace kc = ::trident::kernels::cuda;

absl::Status CudaCheck(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(err)));
}

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Allocate(size_t bytes, const char* what) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      ptr_ = nullptr;
      return absl::FailedPreconditionError(
          absl::StrCat("cannot allocate ", bytes, " bytes of device memory for ", what));
    }
    bytes_ = bytes;
    return absl::OkStatus();
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// residual (f32) += delta (or = delta with `replace`); out = RMSNorm(residual)
// * weight, in bf16.
absl::Status AddRmsNorm(float* residual, const void* delta, bool replace, const float* weight,
                        int64_t rows, int64_t dim, float eps, void* out, cudaStream_t stream) {
  kc::AddRmsNormArgs a;
  a.residual = residual;
  a.residual_stride = dim;
  a.delta = delta;
  a.delta_stride = dim;
  a.replace_residual = replace;
  a.weight = weight;
  a.out = out;
  a.out_stride = dim;
  a.rows = rows;
  a.dim = dim;
  a.eps = eps;
  return kc::LaunchAddRmsNorm(a, stream);
}

}  // namespace

struct CudaBackend::Impl {
  model::ModelConfig config;
  CudaBackendOptions options;
  int32_t max_model_len = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<kc::Gemm> gemm;

  struct Layer {
    DeviceBuffer input_norm, post_norm;                                             // f32 [hidden]
    DeviceBuffer qkv, qkv_bias, o, o_bias, gate_up, gate_up_bias, down, down_bias;  // bf16
  };
  std::vector<Layer> layers;
  DeviceBuffer embedding;   // bf16 [vocab][hidden]
  DeviceBuffer lm_head;     // bf16 [vocab][hidden]; empty when tied
  DeviceBuffer final_norm;  // f32 [hidden]
  DeviceBuffer inv_freq;    // f32 [head_dim / 2]
  kv::KvCacheSpec kv_spec;
  DeviceBuffer kv_pool;

  // Workspace for max_batch_tokens.
  DeviceBuffer residual;                          // f32 [T][hidden]
  DeviceBuffer hn, qkv, attn, tmp, gate_up, act;  // bf16
  DeviceBuffer last, logits;                      // bf16 [S][hidden], [S][vocab]
  DeviceBuffer meta;                              // int32/int64 step metadata
  DeviceBuffer decode_workspace;
  // Pinned host staging for metadata and logits.
  void* host_meta = nullptr;
  size_t host_meta_bytes = 0;
  uint16_t* host_logits = nullptr;

  ~Impl() {
    if (host_meta != nullptr) cudaFreeHost(host_meta);
    if (host_logits != nullptr) cudaFreeHost(host_logits);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  const void* head() const { return lm_head.get() != nullptr ? lm_head.get() : embedding.get(); }

  // Copies `n` converted elements of a checkpoint tensor (or the
  // concatenation of several) to a new device buffer.
  absl::Status UploadBf16(model::Checkpoint& ckpt, const std::vector<std::string>& names,
                          DeviceBuffer* out, model::LoadProgress& progress) {
    std::vector<uint16_t> host;
    for (const std::string& name : names) {
      TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt.Info(name));
      const size_t at = host.size();
      host.resize(at + static_cast<size_t>(info.numel));
      TRIDENT_RETURN_IF_ERROR(ckpt.ReadBf16(name, absl::MakeSpan(host).subspan(at, info.numel)));
      progress.Add(info.num_bytes);
    }
    TRIDENT_RETURN_IF_ERROR(out->Allocate(host.size() * 2, names.front().c_str()));
    return CudaCheck(cudaMemcpy(out->get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice),
                     "weight upload");
  }

  absl::Status UploadF32(model::Checkpoint& ckpt, const std::string& name, DeviceBuffer* out,
                         model::LoadProgress& progress) {
    TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt.Info(name));
    std::vector<float> host(static_cast<size_t>(info.numel));
    TRIDENT_RETURN_IF_ERROR(ckpt.ReadFloat(name, absl::MakeSpan(host)));
    progress.Add(info.num_bytes);
    TRIDENT_RETURN_IF_ERROR(out->Allocate(host.size() * 4, name.c_str()));
    return CudaCheck(cudaMemcpy(out->get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice),
                     "norm upload");
  }

  absl::Status Load(const std::string& dir);
  absl::Status AllocateWorkspaceAndKv();
  absl::Status Forward(absl::Span<const StepSequence> batch, float* logits_out);
};

absl::Status CudaBackend::Impl::Load(const std::string& dir) {
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(options.device), "set device"));
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  TRIDENT_ASSIGN_OR_RETURN(gemm, kc::Gemm::Create());
  TRIDENT_ASSIGN_OR_RETURN(config, model::LoadModelConfig(dir));
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> ckpt, model::Checkpoint::Open(dir));
  TRIDENT_RETURN_IF_ERROR(model::ValidateLlamaCheckpoint(config, *ckpt));
  if (config.head_dim != 64 && config.head_dim != 128) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, "/config.json: head_dim ", config.head_dim,
                     " is not supported by the CUDA attention kernels (64 or 128)"));
  }
  RealClock real_clock;
  model::LoadProgress progress(ckpt->total_bytes(),
                               options.clock != nullptr ? options.clock : &real_clock);

  TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {"model.embed_tokens.weight"}, &embedding, progress));
  layers.resize(config.num_hidden_layers);
  for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
    Layer& layer = layers[l];
    auto name = [l](const char* suffix) { return model::LayerTensorName(l, suffix); };
    TRIDENT_RETURN_IF_ERROR(
        UploadF32(*ckpt, name(model::kInputLayernorm), &layer.input_norm, progress));
    TRIDENT_RETURN_IF_ERROR(
        UploadF32(*ckpt, name(model::kPostAttentionLayernorm), &layer.post_norm, progress));
    TRIDENT_RETURN_IF_ERROR(
        UploadBf16(*ckpt, {name(model::kQProj), name(model::kKProj), name(model::kVProj)},
                   &layer.qkv, progress));
    if (config.attention_bias) {
      TRIDENT_RETURN_IF_ERROR(UploadBf16(
          *ckpt, {name(model::kQProjBias), name(model::kKProjBias), name(model::kVProjBias)},
          &layer.qkv_bias, progress));
    }
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {name(model::kOProj)}, &layer.o, progress));
    if (config.o_proj_bias) {
      TRIDENT_RETURN_IF_ERROR(
          UploadBf16(*ckpt, {name(model::kOProjBias)}, &layer.o_bias, progress));
    }
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {name(model::kGateProj), name(model::kUpProj)},
                                       &layer.gate_up, progress));
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {name(model::kDownProj)}, &layer.down, progress));
    if (config.mlp_bias) {
      TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt,
                                         {name(model::kGateProjBias), name(model::kUpProjBias)},
                                         &layer.gate_up_bias, progress));
      TRIDENT_RETURN_IF_ERROR(
          UploadBf16(*ckpt, {name(model::kDownProjBias)}, &layer.down_bias, progress));
    }
  }
  TRIDENT_RETURN_IF_ERROR(UploadF32(*ckpt, "model.norm.weight", &final_norm, progress));
  if (!config.tie_word_embeddings || ckpt->Has("lm_head.weight")) {
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {"lm_head.weight"}, &lm_head, progress));
  }

  const kernels::cpu::RopeConfig rope = RopeConfigFor(config);
  const std::vector<float> freqs = kernels::cpu::RopeInvFreq(rope);
  TRIDENT_RETURN_IF_ERROR(inv_freq.Allocate(freqs.size() * 4, "inv_freq"));
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpy(inv_freq.get(), freqs.data(), freqs.size() * 4, cudaMemcpyHostToDevice),
                "inv_freq upload"));
  max_model_len = config.max_position_embeddings;
  if (options.max_model_len > 0) max_model_len = std::min(max_model_len, options.max_model_len);
  return AllocateWorkspaceAndKv();
}

absl::Status CudaBackend::Impl::AllocateWorkspaceAndKv() {
  const int64_t t = options.max_batch_tokens;
  const int64_t s = options.max_batch_sequences;
  const int64_t h = config.hidden_size;
  const int64_t q_out = int64_t{config.num_attention_heads} * config.head_dim;
  const int64_t kv_out = int64_t{config.num_key_value_heads} * config.head_dim;
  const int64_t inter = config.intermediate_size;
  TRIDENT_RETURN_IF_ERROR(residual.Allocate(t * h * 4, "residual"));
  TRIDENT_RETURN_IF_ERROR(hn.Allocate(t * h * 2, "normed activations"));
  TRIDENT_RETURN_IF_ERROR(qkv.Allocate(t * (q_out + 2 * kv_out) * 2, "qkv"));
  TRIDENT_RETURN_IF_ERROR(attn.Allocate(t * q_out * 2, "attention output"));
  TRIDENT_RETURN_IF_ERROR(tmp.Allocate(t * h * 2, "projection output"));
  TRIDENT_RETURN_IF_ERROR(gate_up.Allocate(t * 2 * inter * 2, "gate/up"));
  TRIDENT_RETURN_IF_ERROR(act.Allocate(t * inter * 2, "activation"));
  TRIDENT_RETURN_IF_ERROR(last.Allocate(s * h * 2, "last rows"));
  TRIDENT_RETURN_IF_ERROR(logits.Allocate(s * int64_t{config.vocab_size} * 2, "logits"));
  const int64_t max_blocks = (max_model_len + options.kv_block_size - 1) / options.kv_block_size;
  // tokens, positions, 64-bit slots, block tables, context/query lens, starts, rows
  host_meta_bytes = static_cast<size_t>(t * 4 + t * 4 + t * 8 + s * max_blocks * 4 + s * 4 * 4);
  TRIDENT_RETURN_IF_ERROR(meta.Allocate(host_meta_bytes, "step metadata"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMallocHost(&host_meta, host_meta_bytes), "pinned meta"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaMallocHost(reinterpret_cast<void**>(&host_logits), s * int64_t{config.vocab_size} * 2),
      "pinned logits"));
  kc::DecodePlan plan =
      kc::PlanDecode(static_cast<int32_t>(s), config.num_key_value_heads, max_model_len, 132);
  const size_t decode_ws = kc::DecodeWorkspaceBytes(plan, static_cast<int32_t>(s),
                                                    config.num_attention_heads, config.head_dim);
  TRIDENT_RETURN_IF_ERROR(decode_workspace.Allocate(std::max<size_t>(decode_ws, 256), "decode ws"));

  kv_spec.num_layers = config.num_hidden_layers;
  kv_spec.num_kv_heads = config.num_key_value_heads;
  kv_spec.head_dim = config.head_dim;
  kv_spec.block_size = options.kv_block_size;
  kv_spec.dtype = DType::kBF16;
  size_t free_bytes = 0, total_bytes = 0;
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes), "memory info"));
  const double budget = options.gpu_memory_fraction * static_cast<double>(total_bytes);
  const double used = static_cast<double>(total_bytes - free_bytes);
  const double for_kv = std::min(budget - used, static_cast<double>(free_bytes) - (256 << 20));
  kv_spec.num_blocks = for_kv > 0 ? kv_spec.BlocksForBudget(static_cast<uint64_t>(for_kv)) : 0;
  if (kv_spec.num_blocks < 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no device memory left for the KV cache: %.1f GiB used of a %.1f GiB budget "
        "(--gpu_memory_fraction=%.2f)",
        used / (1 << 30), budget / (1 << 30), options.gpu_memory_fraction));
  }
  TRIDENT_RETURN_IF_ERROR(kv_pool.Allocate(kv_spec.TotalBytes(), "KV cache"));
  TRIDENT_LOG(INFO) << absl::StrFormat("KV cache: %d blocks of %d tokens, %.2f GiB",
                                       kv_spec.num_blocks, kv_spec.block_size,
                                       kv_spec.TotalBytes() / double(1 << 30));
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Forward(absl::Span<const StepSequence> batch, float* logits_out) {
  const int64_t h = config.hidden_size;
  const int32_t nq = config.num_attention_heads;
  const int32_t nkv = config.num_key_value_heads;
  const int32_t hd = config.head_dim;
  const int64_t q_out = int64_t{nq} * hd;
  const int64_t kv_out = int64_t{nkv} * hd;
  const int64_t qkv_w = q_out + 2 * kv_out;
  const int64_t inter = config.intermediate_size;
  const int32_t bs = kv_spec.block_size;
  const int32_t max_blocks = (max_model_len + bs - 1) / bs;
  const int64_t num_seqs = static_cast<int64_t>(batch.size());
  if (num_seqs > options.max_batch_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", num_seqs,
                                                   " sequences exceeds --max_batch_sequences ",
                                                   options.max_batch_sequences));
  }
  int64_t total = 0;
  int32_t max_query = 0, max_context = 0;
  bool all_decode = true;
  for (const StepSequence& s : batch) {
    const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
    if (s.tokens.empty() || s.start_position < 0 || end > max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat("sequence spans positions [", s.start_position,
                                                     ", ", end, "), outside the context window of ",
                                                     max_model_len));
    }
    if (static_cast<int64_t>(s.block_table.size()) * bs < end) {
      return absl::InvalidArgumentError("block table too short for the sequence");
    }
    for (int32_t b : s.block_table) {
      if (b < 0 || b >= kv_spec.num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat("block id ", b, " outside the cache"));
      }
    }
    total += static_cast<int64_t>(s.tokens.size());
    max_query = std::max<int32_t>(max_query, static_cast<int32_t>(s.tokens.size()));
    max_context = std::max<int32_t>(max_context, static_cast<int32_t>(end));
    all_decode = all_decode && s.tokens.size() == 1;
  }
  if (total == 0) return absl::OkStatus();
  if (total > options.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", total, " tokens exceeds --max_batch_tokens ", options.max_batch_tokens));
  }

  // Step metadata, staged in pinned memory and copied in one transfer.
  char* hm = static_cast<char*>(host_meta);
  const int64_t t_cap = options.max_batch_tokens, s_cap = options.max_batch_sequences;
  int32_t* tokens = reinterpret_cast<int32_t*>(hm);
  int32_t* positions = tokens + t_cap;
  int64_t* slots = reinterpret_cast<int64_t*>(positions + t_cap);
  int32_t* tables = reinterpret_cast<int32_t*>(slots + t_cap);
  int32_t* context_lens = tables + s_cap * max_blocks;
  int32_t* query_lens = context_lens + s_cap;
  int32_t* query_starts = query_lens + s_cap;
  std::vector<int64_t> logit_rows;
  int64_t row = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const StepSequence& s = batch[i];
    for (size_t j = 0; j < s.tokens.size(); ++j) {
      const int32_t pos = s.start_position + static_cast<int32_t>(j);
      if (s.tokens[j] < 0 || s.tokens[j] >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", s.tokens[j], " outside the vocabulary"));
      }
      tokens[row + j] = s.tokens[j];
      positions[row + j] = pos;
      slots[row + j] = int64_t{s.block_table[pos / bs]} * bs + pos % bs;
    }
    std::memcpy(tables + i * max_blocks, s.block_table.data(), s.block_table.size() * 4);
    context_lens[i] = s.start_position + static_cast<int32_t>(s.tokens.size());
    query_lens[i] = static_cast<int32_t>(s.tokens.size());
    query_starts[i] = static_cast<int32_t>(row);
    row += static_cast<int64_t>(s.tokens.size());
    if (s.want_logits) logit_rows.push_back(row - 1);
  }
  char* dm = meta.get<char>();
  auto device = [&](const void* host) { return dm + (static_cast<const char*>(host) - hm); };
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaMemcpyAsync(dm, hm, host_meta_bytes, cudaMemcpyHostToDevice, stream), "metadata"));
  const int32_t* d_tokens = reinterpret_cast<const int32_t*>(device(tokens));
  const int32_t* d_positions = reinterpret_cast<const int32_t*>(device(positions));
  const int64_t* d_slots = reinterpret_cast<const int64_t*>(device(slots));
  const int32_t* d_tables = reinterpret_cast<const int32_t*>(device(tables));
  const int32_t* d_context = reinterpret_cast<const int32_t*>(device(context_lens));
  const int32_t* d_query = reinterpret_cast<const int32_t*>(device(query_lens));
  const int32_t* d_starts = reinterpret_cast<const int32_t*>(device(query_starts));

  // Embedding into tmp; layer 0's fused add+norm starts the f32 residual
  // stream from it.
  TRIDENT_RETURN_IF_ERROR(kc::LaunchEmbedding(
      {d_tokens, total, embedding.get(), config.vocab_size, h, tmp.get()}, stream));
  const float eps = config.rms_norm_eps;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto linear = [&](const void* x, int64_t x_stride, const DeviceBuffer& w,
                    const DeviceBuffer& bias, void* y, int64_t n, int64_t k) {
    kc::GemmArgs g{x, x_stride, w.get(), bias.get(), y, n, total, n, k};
    return gemm->Run(g, stream);
  };
  for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
    Layer& layer = layers[l];
    TRIDENT_RETURN_IF_ERROR(AddRmsNorm(residual.get<float>(), tmp.get(), /*replace=*/l == 0,
                                       layer.input_norm.get<float>(), total, h, eps, hn.get(),
                                       stream));
    TRIDENT_RETURN_IF_ERROR(linear(hn.get(), h, layer.qkv, layer.qkv_bias, qkv.get(), qkv_w, h));
    kc::RopeArgs rope;
    rope.q = qkv.get();
    rope.q_token_stride = qkv_w;
    rope.num_q_heads = nq;
    rope.k = qkv.get<char>() + q_out * 2;
    rope.k_token_stride = qkv_w;
    rope.num_kv_heads = nkv;
    rope.head_dim = hd;
    rope.positions = d_positions;
    rope.num_tokens = total;
    rope.inv_freq = inv_freq.get<float>();
    TRIDENT_RETURN_IF_ERROR(kc::LaunchRope(rope, stream));
    void* layer_base = kv_pool.get<char>() + kv_spec.KeyOffsetBytes(l, 0);
    kc::KvAppendArgs append;
    append.kv.base = layer_base;
    append.kv.num_blocks = kv_spec.num_blocks;
    append.kv.block_size = bs;
    append.kv.num_kv_heads = nkv;
    append.kv.head_dim = hd;
    append.kv.block_stride_elems = kv_spec.block_stride_elements();
    append.kv.value_offset_elems = kv_spec.value_offset_elements();
    append.k = qkv.get<char>() + q_out * 2;
    append.k_stride = qkv_w;
    append.v = qkv.get<char>() + (q_out + kv_out) * 2;
    append.v_stride = qkv_w;
    append.slots = d_slots;
    append.num_tokens = total;
    TRIDENT_RETURN_IF_ERROR(kc::LaunchKvAppend(append, stream));
    if (all_decode) {
      kc::PagedDecodeArgs a;
      a.q = qkv.get();
      a.q_stride = qkv_w;
      a.out = attn.get();
      a.out_stride = q_out;
      a.kv_base = layer_base;
      a.block_stride_elems = kv_spec.block_stride_elements();
      a.value_offset_elems = kv_spec.value_offset_elements();
      a.block_size = bs;
      a.num_q_heads = nq;
      a.num_kv_heads = nkv;
      a.head_dim = hd;
      a.block_tables = d_tables;
      a.max_blocks_per_seq = max_blocks;
      a.context_lens = d_context;
      a.batch = static_cast<int32_t>(num_seqs);
      a.scale = scale;
      const kc::DecodePlan plan =
          kc::PlanDecode(static_cast<int32_t>(num_seqs), nkv, max_context, 132);
      TRIDENT_RETURN_IF_ERROR(kc::LaunchPagedDecodeAttention(a, plan, decode_workspace.get(),
                                                             decode_workspace.bytes(), stream));
    } else {
      kc::PagedPrefillArgs a;
      a.q = qkv.get();
      a.q_stride = qkv_w;
      a.out = attn.get();
      a.out_stride = q_out;
      a.kv_base = layer_base;
      a.block_stride_elems = kv_spec.block_stride_elements();
      a.value_offset_elems = kv_spec.value_offset_elements();
      a.block_size = bs;
      a.num_q_heads = nq;
      a.num_kv_heads = nkv;
      a.head_dim = hd;
      a.block_tables = d_tables;
      a.max_blocks_per_seq = max_blocks;
      a.context_lens = d_context;
      a.query_lens = d_query;
      a.query_starts = d_starts;
      a.batch = static_cast<int32_t>(num_seqs);
      a.max_query_len = max_query;
      a.scale = scale;
      TRIDENT_RETURN_IF_ERROR(kc::LaunchPagedPrefillAttention(a, stream));
    }
    TRIDENT_RETURN_IF_ERROR(linear(attn.get(), q_out, layer.o, layer.o_bias, tmp.get(), h, q_out));
    TRIDENT_RETURN_IF_ERROR(AddRmsNorm(residual.get<float>(), tmp.get(), /*replace=*/false,
                                       layer.post_norm.get<float>(), total, h, eps, hn.get(),
                                       stream));
    TRIDENT_RETURN_IF_ERROR(
        linear(hn.get(), h, layer.gate_up, layer.gate_up_bias, gate_up.get(), 2 * inter, h));
    TRIDENT_RETURN_IF_ERROR(
        kc::LaunchSiluMul({gate_up.get(), 2 * inter, act.get(), inter, total, inter}, stream));
    TRIDENT_RETURN_IF_ERROR(
        linear(act.get(), inter, layer.down, layer.down_bias, tmp.get(), h, inter));
  }
  TRIDENT_RETURN_IF_ERROR(AddRmsNorm(residual.get<float>(), tmp.get(), /*replace=*/false,
                                     final_norm.get<float>(), total, h, eps, hn.get(), stream));
  const int64_t rows = static_cast<int64_t>(logit_rows.size());
  if (rows == 0) {
    return CudaCheck(cudaStreamSynchronize(stream), "step");
  }
  for (int64_t r = 0; r < rows; ++r) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(
        cudaMemcpyAsync(last.get<char>() + r * h * 2, hn.get<char>() + logit_rows[r] * h * 2, h * 2,
                        cudaMemcpyDeviceToDevice, stream),
        "gather last rows"));
  }
  kc::GemmArgs head_args{
      last.get(), h, head(), nullptr, logits.get(), config.vocab_size, rows, config.vocab_size, h};
  TRIDENT_RETURN_IF_ERROR(gemm->Run(head_args, stream));
  const int64_t n = rows * config.vocab_size;
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaMemcpyAsync(host_logits, logits.get(), n * 2, cudaMemcpyDeviceToHost, stream), "logits"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "step"));
  numeric::Bf16ToFloat(host_logits, logits_out, static_cast<size_t>(n));
  return absl::OkStatus();
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const std::string& model_dir, const CudaBackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.device, " not present (", count, " devices)"));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  TRIDENT_RETURN_IF_ERROR(impl->Load(model_dir));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

int32_t CudaBackend::vocab_size() const { return impl_->config.vocab_size; }
int32_t CudaBackend::max_model_len() const { return impl_->max_model_len; }
KvCapacity CudaBackend::kv_capacity() const {
  return {impl_->kv_spec.num_blocks, impl_->kv_spec.block_size};
}
const model::ModelConfig& CudaBackend::config() const { return impl_->config; }

std::string CudaBackend::Describe() const {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, impl_->options.device);
  return absl::StrCat("cuda:", impl_->options.device, " (", prop.name, "), bf16, ",
                      impl_->config.num_hidden_layers, " layers, KV ", impl_->kv_spec.num_blocks,
                      " blocks of ", impl_->kv_spec.block_size, " tokens");
}

absl::Status CudaBackend::Forward(absl::Span<const StepSequence> batch, float* logits) {
  return impl_->Forward(batch, logits);
}

}  // namespace trident::backend
