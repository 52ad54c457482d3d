#include "common/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/cuda/cuda_kv_copier.h"
#include "common/backend/cuda/sampling_batch.h"
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
#include "kernels/cuda/sampling/sampling.h"
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
  // The engine's layer observer during a forward with one; null otherwise.
  const std::function<void(int32_t)>* layer_observer = nullptr;
  // cudaLaunchHostFunc payloads: (this, layer) for each layer.
  std::vector<std::pair<Impl*, int32_t>> layer_marks;
  static void CUDART_CB LayerDone(void* mark) {
    auto* m = static_cast<std::pair<Impl*, int32_t>*>(mark);
    const std::function<void(int32_t)>* observer = m->first->layer_observer;
    if (observer != nullptr) (*observer)(m->second);
  }

  model::ModelConfig config;
  CudaBackendOptions options;
  int32_t max_model_len = 0;
  int32_t num_sms = 132;
  cudaStream_t stream = nullptr;
  std::unique_ptr<kc::Gemm> gemm;

  struct Layer {
    DeviceBuffer input_norm, post_norm;                      // f32 [hidden]
    DeviceBuffer qkv, o, gate_up, down;                      // bf16
    DeviceBuffer qkv_bias, o_bias, gate_up_bias, down_bias;  // f32 (the GEMM output type)
  };
  std::vector<Layer> layers;
  // [vocab][hidden], f32 when the checkpoint stores it in f32 (lookups read
  // one row per token, so keeping it exact costs no bandwidth), else bf16.
  DeviceBuffer embedding;
  bool f32_embedding = false;
  DeviceBuffer lm_head;     // bf16 [vocab][hidden]; empty when tied to a bf16 embedding
  DeviceBuffer final_norm;  // f32 [hidden]
  DeviceBuffer inv_freq;    // f32 [head_dim / 2]
  // The pool holds num_blocks + 1 blocks; the last is the scratch block that
  // padding sequences of a graph-replayed step write.
  kv::KvCacheSpec kv_spec;
  int32_t scratch_block = 0;
  DeviceBuffer kv_pool;

  // Workspace for max_batch_tokens.
  DeviceBuffer residual;                 // f32 [T][hidden]
  DeviceBuffer qkv32, gate_up32;         // f32 projections
  DeviceBuffer hn, qkv, attn, tmp, act;  // bf16
  DeviceBuffer last, logits;             // bf16 [S][hidden], [S][vocab]
  DeviceBuffer meta;                     // step metadata (layout below)
  DeviceBuffer decode_workspace;
  // Pinned host staging for metadata and logits.
  void* host_meta = nullptr;
  size_t host_meta_bytes = 0;
  float* host_logits = nullptr;

  // GPU sampling: per-row parameters and penalty lists (pinned staging and
  // device copies, grown on demand), the sampler's workspace and outputs.
  SamplingBatchBuilder sample_batch;
  DeviceBuffer sample_ws;
  DeviceBuffer sample_in;  // rows, then seen tokens, then output counts
  void* host_sample_in = nullptr;
  size_t sample_in_capacity = 0;
  DeviceBuffer sample_out;  // tokens [S], logprobs [S], top ids / logprobs [S][20]
  void* host_sample_out = nullptr;

  // Metadata layout, host and device alike: tokens, positions [T] int32;
  // slots [T] int64; logit rows, context lens, query lens, query starts [S]
  // int32; then the block tables, [S][table_stride] int32 with a per-step
  // stride. Only the used prefix is copied each step.
  struct MetaView {
    int32_t* tokens;
    int32_t* positions;
    int64_t* slots;
    int32_t* rows;
    int32_t* context_lens;
    int32_t* query_lens;
    int32_t* query_starts;
    int32_t* tables;
  };
  MetaView View(void* base) const {
    const int64_t t = options.max_batch_tokens, s = options.max_batch_sequences;
    MetaView v;
    v.slots = static_cast<int64_t*>(base);
    v.tokens = reinterpret_cast<int32_t*>(v.slots + t);
    v.positions = v.tokens + t;
    v.rows = v.positions + t;
    v.context_lens = v.rows + s;
    v.query_lens = v.context_lens + s;
    v.query_starts = v.query_lens + s;
    v.tables = v.query_starts + s;
    return v;
  }
  MetaView hmeta, dmeta;

  // The shape of one step's device work: everything Enqueue needs that is
  // not in the metadata buffer.
  struct StepShape {
    int64_t total = 0;  // tokens
    int32_t num_seqs = 0;
    bool all_decode = false;
    int32_t max_query = 0;
    int32_t table_stride = 0;
    kc::DecodePlan plan;
    int64_t head_rows = 0;  // rows of logits
    bool gather = false;    // head rows are meta.rows of the token rows
  };

  // Decode graphs by (padded batch, splits, table stride).
  std::map<std::tuple<int32_t, int32_t, int32_t>, cudaGraphExec_t> graphs;

  ~Impl() {
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    if (host_meta != nullptr) cudaFreeHost(host_meta);
    if (host_logits != nullptr) cudaFreeHost(host_logits);
    if (host_sample_in != nullptr) cudaFreeHost(host_sample_in);
    if (host_sample_out != nullptr) cudaFreeHost(host_sample_out);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  kc::DecodePlan PlanDecode(int32_t batch, int32_t max_context) const {
    return kc::PlanDecodeVariant(
        batch, config.num_key_value_heads, config.head_dim, max_context, num_sms,
        options.decode_variant >= 0 ? options.decode_variant : kc::kDefaultDecodeVariant);
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

  absl::Status UploadF32(model::Checkpoint& ckpt, const std::vector<std::string>& names,
                         DeviceBuffer* out, model::LoadProgress& progress) {
    std::vector<float> host;
    for (const std::string& name : names) {
      TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt.Info(name));
      const size_t at = host.size();
      host.resize(at + static_cast<size_t>(info.numel));
      TRIDENT_RETURN_IF_ERROR(ckpt.ReadFloat(name, absl::MakeSpan(host).subspan(at, info.numel)));
      progress.Add(info.num_bytes);
    }
    TRIDENT_RETURN_IF_ERROR(out->Allocate(host.size() * 4, names.front().c_str()));
    return CudaCheck(cudaMemcpy(out->get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice),
                     "f32 upload");
  }

  absl::Status Load(const std::string& dir);
  absl::Status AllocateWorkspaceAndKv();
  // Validates the batch, stages its metadata and enqueues the step (graph
  // replay or launches); returns the number of logit rows it computes.
  absl::StatusOr<int64_t> Run(absl::Span<const StepSequence> batch);
  absl::Status Forward(absl::Span<const StepSequence> batch, float* logits_out);
  absl::Status ForwardSample(absl::Span<const StepSequence> batch,
                             absl::Span<const RowSampling> rows,
                             absl::Span<sampling::SampledToken> out);
  // Enqueues the whole step on `stream` from the device metadata.
  absl::Status Enqueue(const StepShape& shape);
  // Enqueue's steps: `rows` rows of the residual stream normed into hn;
  // layer `l`'s rope, KV append and paged attention of this step's q into
  // attn; the final norm and the LM head into logits.
  absl::Status Norm(const DeviceBuffer& weight, int64_t rows);
  absl::Status EnqueueAttention(int32_t l, const StepShape& shape);
  absl::Status EnqueueHead(const StepShape& shape);
  // Replays (capturing on first use) the decode graph for `shape`.
  absl::Status LaunchGraph(const StepShape& shape);
};

absl::Status CudaBackend::Impl::Load(const std::string& dir) {
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(options.device), "set device"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, options.device), "SMs"));
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

  {
    TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt->Info("model.embed_tokens.weight"));
    f32_embedding = info.dtype == DType::kF32;
  }
  if (f32_embedding) {
    TRIDENT_RETURN_IF_ERROR(UploadF32(*ckpt, {"model.embed_tokens.weight"}, &embedding, progress));
  } else {
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {"model.embed_tokens.weight"}, &embedding, progress));
  }
  layers.resize(config.num_hidden_layers);
  for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
    Layer& layer = layers[l];
    auto name = [l](const char* suffix) { return model::LayerTensorName(l, suffix); };
    TRIDENT_RETURN_IF_ERROR(
        UploadF32(*ckpt, {name(model::kInputLayernorm)}, &layer.input_norm, progress));
    TRIDENT_RETURN_IF_ERROR(
        UploadF32(*ckpt, {name(model::kPostAttentionLayernorm)}, &layer.post_norm, progress));
    TRIDENT_RETURN_IF_ERROR(
        UploadBf16(*ckpt, {name(model::kQProj), name(model::kKProj), name(model::kVProj)},
                   &layer.qkv, progress));
    if (config.attention_bias) {
      TRIDENT_RETURN_IF_ERROR(UploadF32(
          *ckpt, {name(model::kQProjBias), name(model::kKProjBias), name(model::kVProjBias)},
          &layer.qkv_bias, progress));
    }
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {name(model::kOProj)}, &layer.o, progress));
    if (config.o_proj_bias) {
      TRIDENT_RETURN_IF_ERROR(UploadF32(*ckpt, {name(model::kOProjBias)}, &layer.o_bias, progress));
    }
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {name(model::kGateProj), name(model::kUpProj)},
                                       &layer.gate_up, progress));
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {name(model::kDownProj)}, &layer.down, progress));
    if (config.mlp_bias) {
      TRIDENT_RETURN_IF_ERROR(UploadF32(*ckpt,
                                        {name(model::kGateProjBias), name(model::kUpProjBias)},
                                        &layer.gate_up_bias, progress));
      TRIDENT_RETURN_IF_ERROR(
          UploadF32(*ckpt, {name(model::kDownProjBias)}, &layer.down_bias, progress));
    }
  }
  TRIDENT_RETURN_IF_ERROR(UploadF32(*ckpt, {"model.norm.weight"}, &final_norm, progress));
  if (!config.tie_word_embeddings || ckpt->Has("lm_head.weight")) {
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {"lm_head.weight"}, &lm_head, progress));
  } else if (f32_embedding) {
    // Tied to an f32 embedding: the head GEMM needs its own bf16 copy.
    TRIDENT_RETURN_IF_ERROR(UploadBf16(*ckpt, {"model.embed_tokens.weight"}, &lm_head, progress));
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
  TRIDENT_RETURN_IF_ERROR(qkv32.Allocate(t * (q_out + 2 * kv_out) * 4, "qkv projection"));
  TRIDENT_RETURN_IF_ERROR(gate_up32.Allocate(t * 2 * inter * 4, "gate/up projection"));
  TRIDENT_RETURN_IF_ERROR(hn.Allocate(t * h * 2, "normed activations"));
  TRIDENT_RETURN_IF_ERROR(qkv.Allocate(t * (q_out + 2 * kv_out) * 2, "qkv"));
  TRIDENT_RETURN_IF_ERROR(attn.Allocate(t * q_out * 2, "attention output"));
  TRIDENT_RETURN_IF_ERROR(tmp.Allocate(t * h * 2, "embedding output"));
  TRIDENT_RETURN_IF_ERROR(act.Allocate(t * inter * 2, "activation"));
  TRIDENT_RETURN_IF_ERROR(last.Allocate(s * h * 2, "last rows"));
  TRIDENT_RETURN_IF_ERROR(logits.Allocate(s * int64_t{config.vocab_size} * 4, "logits"));
  TRIDENT_RETURN_IF_ERROR(sample_ws.Allocate(
      std::max<size_t>(kc::SampleWorkspaceBytes(s, config.vocab_size), 256), "sampler workspace"));
  const size_t sample_out_bytes = static_cast<size_t>(s) * (8 + 8 * kc::kMaxSampleTopLogprobs);
  TRIDENT_RETURN_IF_ERROR(sample_out.Allocate(sample_out_bytes, "sampler outputs"));
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaMallocHost(&host_sample_out, sample_out_bytes), "pinned sampler outputs"));
  const int64_t max_blocks = (max_model_len + options.kv_block_size - 1) / options.kv_block_size;
  host_meta_bytes = static_cast<size_t>(t * 8 + t * 4 * 2 + s * 4 * 4 + s * max_blocks * 4);
  TRIDENT_RETURN_IF_ERROR(meta.Allocate(host_meta_bytes, "step metadata"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMallocHost(&host_meta, host_meta_bytes), "pinned meta"));
  hmeta = View(host_meta);
  dmeta = View(meta.get());
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaMallocHost(reinterpret_cast<void**>(&host_logits), s * int64_t{config.vocab_size} * 4),
      "pinned logits"));
  // The split count of a plan depends on the batch; take the largest need.
  size_t decode_ws = 256;
  for (int64_t b = 1;; b = std::min(b * 2, s)) {
    const kc::DecodePlan plan = PlanDecode(static_cast<int32_t>(b), max_model_len);
    decode_ws =
        std::max(decode_ws, kc::DecodeWorkspaceBytes(plan, static_cast<int32_t>(b),
                                                     config.num_attention_heads, config.head_dim));
    if (b == s) break;
  }
  TRIDENT_RETURN_IF_ERROR(decode_workspace.Allocate(decode_ws, "decode workspace"));

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
  if (kv_spec.num_blocks < 2) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no device memory left for the KV cache: %.1f GiB used of a %.1f GiB budget "
        "(--gpu_memory_fraction=%.2f)",
        used / (1 << 30), budget / (1 << 30), options.gpu_memory_fraction));
  }
  scratch_block = kv_spec.num_blocks - 1;
  TRIDENT_RETURN_IF_ERROR(kv_pool.Allocate(kv_spec.TotalBytes(), "KV cache"));
  TRIDENT_LOG(INFO) << absl::StrFormat("KV cache: %d blocks of %d tokens, %.2f GiB", scratch_block,
                                       kv_spec.block_size, kv_spec.TotalBytes() / double(1 << 30));
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Enqueue(const StepShape& shape) {
  const int64_t h = config.hidden_size;
  const int64_t q_out = int64_t{config.num_attention_heads} * config.head_dim;
  const int64_t kv_out = int64_t{config.num_key_value_heads} * config.head_dim;
  const int64_t qkv_w = q_out + 2 * kv_out;
  const int64_t inter = config.intermediate_size;
  const int64_t total = shape.total;
  const float eps = config.rms_norm_eps;
  // y (f32) = x·Wᵀ + bias, or y += x·Wᵀ + bias with `accumulate`.
  auto linear = [&](const void* x, int64_t k, const DeviceBuffer& w, const DeviceBuffer& bias,
                    float* y, int64_t n, bool accumulate) {
    kc::GemmArgs g{x, k, w.get(), bias.get(), y, n, total, n, k};
    g.y_dtype = DType::kF32;
    g.accumulate = accumulate;
    return gemm->Run(g, stream);
  };

  // A bf16 embedding goes to tmp, and layer 0's fused add+norm starts the
  // f32 residual stream from it; f32 rows are copied into the residual
  // stream directly (the gather moves bits: an f32 row is 2 * hidden bf16).
  if (f32_embedding) {
    TRIDENT_RETURN_IF_ERROR(kc::LaunchEmbedding(
        {dmeta.tokens, total, embedding.get(), config.vocab_size, 2 * h, residual.get()}, stream));
  } else {
    TRIDENT_RETURN_IF_ERROR(kc::LaunchEmbedding(
        {dmeta.tokens, total, embedding.get(), config.vocab_size, h, tmp.get()}, stream));
  }
  for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
    Layer& layer = layers[l];
    if (l == 0 && !f32_embedding) {
      TRIDENT_RETURN_IF_ERROR(AddRmsNorm(residual.get<float>(), tmp.get(), /*replace=*/true,
                                         layer.input_norm.get<float>(), total, h, eps, hn.get(),
                                         stream));
    } else {
      TRIDENT_RETURN_IF_ERROR(Norm(layer.input_norm, total));
    }
    TRIDENT_RETURN_IF_ERROR(
        linear(hn.get(), h, layer.qkv, layer.qkv_bias, qkv32.get<float>(), qkv_w, false));
    TRIDENT_RETURN_IF_ERROR(EnqueueAttention(l, shape));
    TRIDENT_RETURN_IF_ERROR(
        linear(attn.get(), q_out, layer.o, layer.o_bias, residual.get<float>(), h, true));
    TRIDENT_RETURN_IF_ERROR(Norm(layer.post_norm, total));
    TRIDENT_RETURN_IF_ERROR(linear(hn.get(), h, layer.gate_up, layer.gate_up_bias,
                                   gate_up32.get<float>(), 2 * inter, false));
    kc::SiluMulArgs silu{gate_up32.get(), 2 * inter, act.get(), inter, total, inter};
    silu.gate_up_dtype = DType::kF32;
    TRIDENT_RETURN_IF_ERROR(kc::LaunchSiluMul(silu, stream));
    TRIDENT_RETURN_IF_ERROR(
        linear(act.get(), inter, layer.down, layer.down_bias, residual.get<float>(), h, true));
  }
  return EnqueueHead(shape);
}

absl::Status CudaBackend::Impl::Norm(const DeviceBuffer& weight, int64_t rows) {
  kc::RmsNormArgs a;
  a.x = residual.get();
  a.x_dtype = DType::kF32;
  a.x_stride = config.hidden_size;
  a.weight = weight.get<float>();
  a.out = hn.get();
  a.out_stride = config.hidden_size;
  a.rows = rows;
  a.dim = config.hidden_size;
  a.eps = config.rms_norm_eps;
  return kc::LaunchRmsNorm(a, stream);
}

absl::Status CudaBackend::Impl::EnqueueAttention(int32_t l, const StepShape& shape) {
  const int32_t nq = config.num_attention_heads;
  const int32_t nkv = config.num_key_value_heads;
  const int32_t hd = config.head_dim;
  const int64_t q_out = int64_t{nq} * hd;
  const int64_t kv_out = int64_t{nkv} * hd;
  const int64_t qkv_w = q_out + 2 * kv_out;
  kc::RopeQkvArgs rope;
  rope.in = qkv32.get<float>();
  rope.in_stride = qkv_w;
  rope.out = qkv.get();
  rope.out_stride = qkv_w;
  rope.num_q_heads = nq;
  rope.num_kv_heads = nkv;
  rope.head_dim = hd;
  rope.positions = dmeta.positions;
  rope.num_tokens = shape.total;
  rope.inv_freq = inv_freq.get<float>();
  TRIDENT_RETURN_IF_ERROR(kc::LaunchRopeQkv(rope, stream));
  void* layer_base = kv_pool.get<char>() + kv_spec.KeyOffsetBytes(l, 0);
  kc::KvAppendArgs append;
  append.kv.base = layer_base;
  append.kv.num_blocks = kv_spec.num_blocks;
  append.kv.block_size = kv_spec.block_size;
  append.kv.num_kv_heads = nkv;
  append.kv.head_dim = hd;
  append.kv.block_stride_elems = kv_spec.block_stride_elements();
  append.kv.value_offset_elems = kv_spec.value_offset_elements();
  append.k = qkv.get<char>() + q_out * 2;
  append.k_stride = qkv_w;
  append.v = qkv.get<char>() + (q_out + kv_out) * 2;
  append.v_stride = qkv_w;
  append.slots = dmeta.slots;
  append.num_tokens = shape.total;
  TRIDENT_RETURN_IF_ERROR(kc::LaunchKvAppend(append, stream));
  if (layer_observer != nullptr && !shape.all_decode) {
    // Runs once the device has written this layer's KV (stream order).
    if (layer_marks.size() != layers.size()) {
      layer_marks.clear();
      for (int32_t i = 0; i < static_cast<int32_t>(layers.size()); ++i) {
        layer_marks.emplace_back(this, i);
      }
    }
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaLaunchHostFunc(stream, &Impl::LayerDone, &layer_marks[l]), "layer mark"));
  }
  // The fields decode and prefill attention share: this step's q, output,
  // one layer's paged KV and the block tables.
  auto paged_args = [&](auto& a) {
    a.q = qkv.get();
    a.q_stride = qkv_w;
    a.out = attn.get();
    a.out_stride = q_out;
    a.kv_base = layer_base;
    a.block_stride_elems = kv_spec.block_stride_elements();
    a.value_offset_elems = kv_spec.value_offset_elements();
    a.block_size = kv_spec.block_size;
    a.num_q_heads = nq;
    a.num_kv_heads = nkv;
    a.head_dim = hd;
    a.block_tables = dmeta.tables;
    a.max_blocks_per_seq = shape.table_stride;
    a.context_lens = dmeta.context_lens;
    a.batch = shape.num_seqs;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  };
  if (shape.all_decode) {
    kc::PagedDecodeArgs a;
    paged_args(a);
    return kc::LaunchPagedDecodeAttention(a, shape.plan, decode_workspace.get(),
                                          decode_workspace.bytes(), stream);
  }
  kc::PagedPrefillArgs a;
  paged_args(a);
  a.query_lens = dmeta.query_lens;
  a.query_starts = dmeta.query_starts;
  a.max_query_len = shape.max_query;
  return kc::LaunchPagedPrefillAttention(a, stream);
}

absl::Status CudaBackend::Impl::EnqueueHead(const StepShape& shape) {
  if (shape.head_rows == 0) return absl::OkStatus();
  const int64_t h = config.hidden_size;
  TRIDENT_RETURN_IF_ERROR(Norm(final_norm, shape.total));
  const void* head_in = hn.get();
  if (shape.gather) {
    // The wanted rows of the normed hidden states, gathered like an embedding
    // lookup with row ids for token ids.
    TRIDENT_RETURN_IF_ERROR(kc::LaunchEmbedding(
        {dmeta.rows, shape.head_rows, hn.get(), shape.total, h, last.get()}, stream));
    head_in = last.get();
  }
  // fp32 logits: bf16 would round near-ties (an ulp is 1/16 at 10) before
  // anyone samples them.
  kc::GemmArgs head_args{
      head_in,           h, head(), nullptr, logits.get(), config.vocab_size, shape.head_rows,
      config.vocab_size, h};
  head_args.y_dtype = DType::kF32;
  return gemm->Run(head_args, stream);
}

absl::Status CudaBackend::Impl::LaunchGraph(const StepShape& shape) {
  const auto key = std::make_tuple(shape.num_seqs, shape.plan.num_splits * 16 + shape.plan.variant,
                                   shape.table_stride);
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture"));
    const absl::Status enqueued = Enqueue(shape);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    TRIDENT_RETURN_IF_ERROR(enqueued);
    TRIDENT_RETURN_IF_ERROR(CudaCheck(ended, "end capture"));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TRIDENT_RETURN_IF_ERROR(CudaCheck(instantiated, "graph instantiate"));
    it = graphs.emplace(key, exec).first;
    TRIDENT_LOG(INFO) << "captured decode graph: batch " << shape.num_seqs << ", "
                      << shape.plan.num_splits << " splits, table stride " << shape.table_stride;
  }
  return CudaCheck(cudaGraphLaunch(it->second, stream), "graph launch");
}

namespace {

// Padded batch sizes of decode graphs.
int32_t GraphBatch(int32_t n) {
  if (n <= 8) return n <= 1 ? 1 : (n <= 2 ? 2 : (n <= 4 ? 4 : 8));
  return (n + 15) / 16 * 16;
}

int32_t NextPow2(int32_t n) {
  int32_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

absl::StatusOr<int64_t> CudaBackend::Impl::Run(absl::Span<const StepSequence> batch) {
  const int32_t bs = kv_spec.block_size;
  const int32_t max_blocks = (max_model_len + bs - 1) / bs;
  const int32_t num_seqs = static_cast<int32_t>(batch.size());
  if (num_seqs > options.max_batch_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", num_seqs,
                                                   " sequences exceeds --max_batch_sequences ",
                                                   options.max_batch_sequences));
  }
  StepShape shape;
  int32_t max_context = 0, max_table = 1, wanted_rows = 0;
  shape.all_decode = true;
  for (const StepSequence& s : batch) {
    const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
    if (s.tokens.empty() || s.start_position < 0 || end > max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat("sequence spans positions [", s.start_position,
                                                     ", ", end, "), outside the context window of ",
                                                     max_model_len));
    }
    const int64_t needed = (end + bs - 1) / bs;
    if (static_cast<int64_t>(s.block_table.size()) < needed) {
      return absl::InvalidArgumentError("block table too short for the sequence");
    }
    for (int64_t j = 0; j < needed; ++j) {
      const int32_t b = s.block_table[j];
      if (b < 0 || b >= scratch_block) {
        return absl::InvalidArgumentError(absl::StrCat("block id ", b, " outside the cache"));
      }
    }
    shape.total += static_cast<int64_t>(s.tokens.size());
    shape.max_query = std::max<int32_t>(shape.max_query, static_cast<int32_t>(s.tokens.size()));
    max_context = std::max<int32_t>(max_context, static_cast<int32_t>(end));
    max_table = std::max<int32_t>(max_table, static_cast<int32_t>(needed));
    shape.all_decode = shape.all_decode && s.tokens.size() == 1;
    wanted_rows += s.want_logits ? 1 : 0;
  }
  if (shape.total == 0) return int64_t{0};
  if (shape.total > options.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", shape.total, " tokens exceeds --max_batch_tokens ", options.max_batch_tokens));
  }
  // Graph replay for decode steps, padded to a bucket.
  const int32_t padded = shape.all_decode ? GraphBatch(num_seqs) : num_seqs;
  const bool use_graph = options.cuda_graphs && shape.all_decode && wanted_rows == num_seqs &&
                         padded <= options.max_batch_sequences &&
                         padded <= options.max_batch_tokens;
  shape.num_seqs = use_graph ? padded : num_seqs;
  shape.table_stride = std::min(NextPow2(max_table), max_blocks);
  if (shape.all_decode) {
    // Graphs bake the split count in: plan for the context bucket.
    const int32_t planned_context =
        use_graph ? std::min(NextPow2(max_context), max_model_len) : max_context;
    shape.plan = PlanDecode(shape.num_seqs, planned_context);
  }

  // Step metadata, staged in pinned memory and copied in one transfer.
  const MetaView& m = hmeta;
  int64_t row = 0;
  for (int32_t i = 0; i < num_seqs; ++i) {
    const StepSequence& s = batch[i];
    for (size_t j = 0; j < s.tokens.size(); ++j) {
      const int32_t pos = s.start_position + static_cast<int32_t>(j);
      if (s.tokens[j] < 0 || s.tokens[j] >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", s.tokens[j], " outside the vocabulary"));
      }
      m.tokens[row + j] = s.tokens[j];
      m.positions[row + j] = pos;
      m.slots[row + j] = int64_t{s.block_table[pos / bs]} * bs + pos % bs;
    }
    const int32_t used = (s.start_position + static_cast<int32_t>(s.tokens.size()) + bs - 1) / bs;
    std::memcpy(m.tables + int64_t{i} * shape.table_stride, s.block_table.data(),
                static_cast<size_t>(used) * 4);
    m.context_lens[i] = s.start_position + static_cast<int32_t>(s.tokens.size());
    m.query_lens[i] = static_cast<int32_t>(s.tokens.size());
    m.query_starts[i] = static_cast<int32_t>(row);
    row += static_cast<int64_t>(s.tokens.size());
    if (s.want_logits) m.rows[shape.head_rows++] = static_cast<int32_t>(row - 1);
  }
  // Padding sequences: one token at position 0 of the scratch block.
  for (int32_t i = num_seqs; i < shape.num_seqs; ++i) {
    m.tokens[row] = 0;
    m.positions[row] = 0;
    m.slots[row] = int64_t{scratch_block} * bs;
    m.tables[int64_t{i} * shape.table_stride] = scratch_block;
    m.context_lens[i] = 1;
    m.query_lens[i] = 1;
    m.query_starts[i] = static_cast<int32_t>(row);
    ++row;
  }
  shape.total = row;
  const int64_t wanted = shape.head_rows;
  // Every row wanted, in order (decode): the head reads the normed rows in
  // place; a graph computes the padding rows' logits too.
  shape.gather = wanted != row;
  if (use_graph) {
    shape.head_rows = row;
    shape.gather = false;
  }
  const size_t meta_bytes =
      reinterpret_cast<const char*>(m.tables + int64_t{shape.num_seqs} * shape.table_stride) -
      static_cast<const char*>(host_meta);
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpyAsync(meta.get(), host_meta, meta_bytes, cudaMemcpyHostToDevice, stream),
                "metadata"));
  TRIDENT_RETURN_IF_ERROR(use_graph ? LaunchGraph(shape) : Enqueue(shape));
  return wanted;
}

absl::Status CudaBackend::Impl::Forward(absl::Span<const StepSequence> batch, float* logits_out) {
  TRIDENT_ASSIGN_OR_RETURN(const int64_t wanted, Run(batch));
  if (wanted == 0) return CudaCheck(cudaStreamSynchronize(stream), "step");
  const size_t bytes = static_cast<size_t>(wanted) * config.vocab_size * 4;
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaMemcpyAsync(host_logits, logits.get(), bytes, cudaMemcpyDeviceToHost, stream), "logits"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "step"));
  std::memcpy(logits_out, host_logits, bytes);
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::ForwardSample(absl::Span<const StepSequence> batch,
                                              absl::Span<const RowSampling> rows,
                                              absl::Span<sampling::SampledToken> out) {
  size_t wanted_rows = 0;
  for (const StepSequence& s : batch) wanted_rows += s.want_logits ? 1 : 0;
  if (rows.size() != wanted_rows || out.size() != wanted_rows) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardSample: ", rows.size(),
                                                   " row parameters and ", out.size(),
                                                   " outputs for ", wanted_rows, " wanted rows"));
  }
  sample_batch.Clear();
  for (const RowSampling& r : rows) {
    sample_batch.Add(*r.params, *r.penalties, r.output_position);
  }
  // Stage rows, seen tokens and output counts in one pinned block.
  const size_t rows_bytes = sample_batch.rows().size() * sizeof(kc::SamplingRow);
  const size_t seen_bytes = sample_batch.seen_tokens().size() * sizeof(int32_t);
  const size_t counts_bytes = sample_batch.output_counts().size() * sizeof(kc::SamplingTokenCount);
  const size_t seen_at = (rows_bytes + 15) / 16 * 16;
  const size_t counts_at = (seen_at + seen_bytes + 15) / 16 * 16;
  const size_t in_bytes = std::max<size_t>(counts_at + counts_bytes, 16);
  if (in_bytes > sample_in_capacity) {
    const size_t capacity = std::max(in_bytes * 2, size_t{1} << 20);
    if (host_sample_in != nullptr) cudaFreeHost(host_sample_in);
    host_sample_in = nullptr;
    sample_in_capacity = 0;
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaMallocHost(&host_sample_in, capacity), "pinned sampler inputs"));
    sample_in = DeviceBuffer();
    TRIDENT_RETURN_IF_ERROR(sample_in.Allocate(capacity, "sampler inputs"));
    sample_in_capacity = capacity;
  }
  char* hin = static_cast<char*>(host_sample_in);
  std::memcpy(hin, sample_batch.rows().data(), rows_bytes);
  std::memcpy(hin + seen_at, sample_batch.seen_tokens().data(), seen_bytes);
  std::memcpy(hin + counts_at, sample_batch.output_counts().data(), counts_bytes);

  TRIDENT_ASSIGN_OR_RETURN(const int64_t wanted, Run(batch));
  if (wanted == 0) return CudaCheck(cudaStreamSynchronize(stream), "step");
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpyAsync(sample_in.get(), hin, in_bytes, cudaMemcpyHostToDevice, stream),
                "sampler inputs"));
  const int64_t s_cap = options.max_batch_sequences;
  char* dout = sample_out.get<char>();
  kc::SampleArgs a;
  a.logits = logits.get();
  a.logits_dtype = DType::kF32;
  a.logits_stride = config.vocab_size;
  a.rows = wanted;
  a.vocab = config.vocab_size;
  a.params = reinterpret_cast<const kc::SamplingRow*>(sample_in.get<char>());
  a.seen_tokens =
      seen_bytes > 0 ? reinterpret_cast<const int32_t*>(sample_in.get<char>() + seen_at) : nullptr;
  a.output_counts =
      counts_bytes > 0
          ? reinterpret_cast<const kc::SamplingTokenCount*>(sample_in.get<char>() + counts_at)
          : nullptr;
  a.tokens = reinterpret_cast<int32_t*>(dout);
  a.logprobs = reinterpret_cast<float*>(dout + s_cap * 4);
  a.max_top_logprobs = sample_batch.max_top_logprobs();
  int32_t* top_ids = reinterpret_cast<int32_t*>(dout + s_cap * 8);
  float* top_lps = reinterpret_cast<float*>(dout + s_cap * (8 + 4 * kc::kMaxSampleTopLogprobs));
  if (a.max_top_logprobs > 0) {
    a.top_ids = top_ids;
    a.top_logprobs = top_lps;
  }
  a.workspace = sample_ws.get();
  a.workspace_bytes = sample_ws.bytes();
  TRIDENT_RETURN_IF_ERROR(kc::LaunchSample(a, stream));
  // Tokens and logprobs; the top lists only when asked for.
  char* hout = static_cast<char*>(host_sample_out);
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaMemcpyAsync(hout, dout, static_cast<size_t>(s_cap) * 8, cudaMemcpyDeviceToHost, stream),
      "sampled tokens"));
  const size_t top_bytes = static_cast<size_t>(wanted) * a.max_top_logprobs * 4;
  if (a.max_top_logprobs > 0) {
    TRIDENT_RETURN_IF_ERROR(CudaCheck(
        cudaMemcpyAsync(hout + s_cap * 8, top_ids, top_bytes, cudaMemcpyDeviceToHost, stream),
        "top ids"));
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpyAsync(hout + s_cap * (8 + 4 * kc::kMaxSampleTopLogprobs), top_lps,
                                  top_bytes, cudaMemcpyDeviceToHost, stream),
                  "top logprobs"));
  }
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "step"));
  const int32_t* tokens = reinterpret_cast<const int32_t*>(hout);
  const float* logprobs = reinterpret_cast<const float*>(hout + s_cap * 4);
  const int32_t* h_top_ids = reinterpret_cast<const int32_t*>(hout + s_cap * 8);
  const float* h_top_lps =
      reinterpret_cast<const float*>(hout + s_cap * (8 + 4 * kc::kMaxSampleTopLogprobs));
  for (int64_t r = 0; r < wanted; ++r) {
    sampling::SampledToken& t = out[static_cast<size_t>(r)];
    const sampling::SamplingParams& p = *rows[static_cast<size_t>(r)].params;
    t.token = tokens[r];
    t.logprob = p.logprobs || p.top_logprobs > 0 ? logprobs[r] : 0.0f;
    t.top_logprobs.clear();
    const int32_t n = std::min({p.top_logprobs, a.max_top_logprobs, config.vocab_size});
    for (int32_t i = 0; i < n; ++i) {
      const int64_t at = r * a.max_top_logprobs + i;
      t.top_logprobs.emplace_back(h_top_ids[at], h_top_lps[at]);
    }
  }
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
  return {impl_->scratch_block, impl_->kv_spec.block_size};
}
absl::StatusOr<KvMemory> CudaBackend::kv_memory() const {
  KvMemory m;
  m.base = impl_->kv_pool.get();
  m.bytes = impl_->kv_pool.bytes();
  m.spec = impl_->kv_spec;
  m.usable_blocks = impl_->scratch_block;
  m.device = true;
  m.device_ordinal = impl_->options.device;
  return m;
}

const model::ModelConfig& CudaBackend::config() const { return impl_->config; }

std::string CudaBackend::Describe() const {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, impl_->options.device);
  return absl::StrCat("cuda:", impl_->options.device, " (", prop.name, "), bf16, ",
                      impl_->config.num_hidden_layers, " layers, KV ", impl_->scratch_block,
                      " blocks of ", impl_->kv_spec.block_size, " tokens");
}

namespace {

// Points the backend's layer observer at `observer` (if set) for one forward,
// and on the way out waits for the stream, so that no host function runs
// after the forward returns (even one that failed midway).
class LayerObserverScope {
 public:
  LayerObserverScope(const std::function<void(int32_t)>*& target,
                     const std::function<void(int32_t)>& observer, cudaStream_t stream)
      : target_(target), stream_(stream) {
    if (observer) target_ = &observer;
  }
  ~LayerObserverScope() {
    if (target_ != nullptr) {
      cudaStreamSynchronize(stream_);
      target_ = nullptr;
    }
  }

 private:
  const std::function<void(int32_t)>*& target_;
  cudaStream_t stream_;
};

}  // namespace

absl::Status CudaBackend::Forward(absl::Span<const StepSequence> batch, float* logits) {
  // The current device is per host thread; the engine's loop is not the
  // thread that created the backend.
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(impl_->options.device), "cudaSetDevice"));
  LayerObserverScope scope(impl_->layer_observer, layer_observer(), impl_->stream);
  return impl_->Forward(batch, logits);
}

bool CudaBackend::samples_on_device() const { return impl_->options.device_sampling; }

absl::Status CudaBackend::ForwardSample(absl::Span<const StepSequence> batch,
                                        absl::Span<const RowSampling> rows,
                                        absl::Span<sampling::SampledToken> out) {
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(impl_->options.device), "cudaSetDevice"));
  LayerObserverScope scope(impl_->layer_observer, layer_observer(), impl_->stream);
  return impl_->ForwardSample(batch, rows, out);
}

absl::StatusOr<std::unique_ptr<KvCopier>> CudaBackend::CreateKvCopier() const {
  TRIDENT_ASSIGN_OR_RETURN(KvMemory memory, kv_memory());
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<CudaKvCopier> copier, CudaKvCopier::Create(memory));
  return std::unique_ptr<KvCopier>(std::move(copier));
}

}  // namespace trident::backend
