#include "common/backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/cuda/cuda_backend_impl.h"
#include "common/backend/cuda/cuda_kv_copier.h"
#include "common/backend/cuda/cuda_peer_lane.h"
#include "common/backend/cuda/tp_kv_copier.h"
#include "common/backend/rope_config.h"
#include "common/kv/kv_layout.h"
#include "common/logging/log.h"
#include "common/model/checkpoint.h"
#include "common/model/llama_weights.h"
#include "common/model/load_progress.h"
#include "common/numeric/counter_stream.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"
#include "kernels/cpu/rope/rope.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"
#include "kernels/cuda/peer_allreduce/peer_allreduce.h"
#include "kernels/cuda/random_fill/random_fill.h"
#include "kernels/cuda/sampling/sampling.h"

namespace trident::backend {

using cuda_internal::DeviceBuffer;
using cuda_internal::Impl;
using cuda_internal::Pass;
using numeric::DType;
namespace kc = ::trident::kernels::cuda;

namespace cuda_internal {

void CUDART_CB Impl::LayerDone(void* mark) {
  auto* m = static_cast<std::pair<Impl*, int32_t>*>(mark);
  const std::function<void(int32_t)>* observer = m->first->layer_observer;
  if (observer != nullptr) (*observer)(m->second);
}

MetaView ViewMeta(void* base, int64_t max_tokens, int64_t max_seqs) {
  MetaView v;
  v.slots = static_cast<int64_t*>(base);
  v.tokens = reinterpret_cast<int32_t*>(v.slots + max_tokens);
  v.positions = v.tokens + max_tokens;
  v.rows = v.positions + max_tokens;
  v.context_lens = v.rows + max_seqs;
  v.query_lens = v.context_lens + max_seqs;
  v.query_starts = v.query_lens + max_seqs;
  v.tables = v.query_starts + max_seqs;
  return v;
}

size_t MetaBytes(int64_t max_tokens, int64_t max_seqs, int64_t max_blocks_per_seq) {
  return static_cast<size_t>(max_tokens * 8 + max_tokens * 4 * 2 + max_seqs * 4 * 4 +
                             max_seqs * max_blocks_per_seq * 4);
}

absl::Status Impl::ReadBf16(const model::TensorReader& ckpt, const std::string& name,
                            std::vector<uint16_t>& host, model::LoadProgress& progress,
                            bool whole) {
  const size_t at = host.size();
  if (tp.group == nullptr || whole) {
    TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt.Info(name));
    host.resize(at + static_cast<size_t>(info.numel));
    TRIDENT_RETURN_IF_ERROR(ckpt.ReadBf16(name, absl::MakeSpan(host).subspan(at, info.numel)));
    progress.Add(info.num_bytes);
    return absl::OkStatus();
  }
  TRIDENT_ASSIGN_OR_RETURN(model::TensorShard shard, model::ShardOf(full_config, tp.layout, name));
  int64_t numel = 1;
  for (int64_t d : shard.shape) numel *= d;
  host.resize(at + static_cast<size_t>(numel));
  TRIDENT_RETURN_IF_ERROR(model::ReadShardBf16(ckpt, full_config, tp.layout, name,
                                               absl::MakeSpan(host).subspan(at, numel)));
  progress.Add(static_cast<uint64_t>(numel) * 2);
  return absl::OkStatus();
}

// Copies the converted elements of a checkpoint tensor (or the
// concatenation of several; the rank's parts of them under tensor
// parallelism) to a new device buffer.
absl::Status Impl::UploadBf16(const model::TensorReader& ckpt,
                              const std::vector<std::string>& names, DeviceBuffer* out,
                              model::LoadProgress& progress, bool whole) {
  if (device_streams) return GenerateBf16(ckpt, names, out, progress, whole);
  std::vector<uint16_t> host;
  for (const std::string& name : names) {
    TRIDENT_RETURN_IF_ERROR(ReadBf16(ckpt, name, host, progress, whole));
  }
  TRIDENT_RETURN_IF_ERROR(out->Allocate(host.size() * 2, names.front().c_str()));
  return CudaCheck(cudaMemcpy(out->get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice),
                   "weight upload");
}

absl::Status Impl::GenerateBf16(const model::TensorReader& weights,
                                const std::vector<std::string>& names, DeviceBuffer* out,
                                model::LoadProgress& progress, bool whole) {
  std::vector<numeric::CounterStreamBlock> blocks;
  int64_t total = 0;
  for (const std::string& name : names) {
    model::TensorSlice slice;
    if (tp.group == nullptr || whole) {
      TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, weights.Info(name));
      slice = {model::SliceAxis::kRows, 0, info.shape.empty() ? 1 : info.shape[0]};
    } else {
      TRIDENT_ASSIGN_OR_RETURN(model::TensorShard shard,
                               model::ShardOf(full_config, tp.layout, name));
      if (!shard.whole && shard.slice.begin == shard.slice.end) continue;  // An empty block.
      if (shard.whole) {
        slice = {model::SliceAxis::kRows, 0, shard.shape[0]};
      } else {
        slice = shard.slice;
      }
    }
    TRIDENT_ASSIGN_OR_RETURN(numeric::CounterStreamBlock block, weights.StreamBlock(name, slice));
    total += block.rows * block.cols;
    blocks.push_back(std::move(block));
  }
  TRIDENT_RETURN_IF_ERROR(out->Allocate(static_cast<size_t>(total) * 2, names.front().c_str()));
  std::vector<DeviceBuffer> flags(blocks.size());
  int64_t at = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const numeric::CounterStreamBlock& block = blocks[i];
    if (!block.quarter_rows.empty()) {
      TRIDENT_RETURN_IF_ERROR(flags[i].Allocate(block.quarter_rows.size(), "row flags"));
      TRIDENT_RETURN_IF_ERROR(
          CudaCheck(cudaMemcpy(flags[i].get(), block.quarter_rows.data(), block.quarter_rows.size(),
                               cudaMemcpyHostToDevice),
                    "row flags upload"));
    }
    TRIDENT_RETURN_IF_ERROR(kc::LaunchRandomFillBf16(
        {&block, flags[i].get<uint8_t>(), out->get<uint16_t>() + at}, stream));
    at += block.rows * block.cols;
  }
  // The flags live until the fills that read them end.
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "weight fill"));
  progress.Add(static_cast<uint64_t>(total) * 2);
  return absl::OkStatus();
}

absl::Status Impl::UploadF32(const model::TensorReader& ckpt, const std::vector<std::string>& names,
                             DeviceBuffer* out, model::LoadProgress& progress, bool whole) {
  std::vector<float> host;
  for (const std::string& name : names) {
    TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, ckpt.Info(name));
    std::vector<float> values(static_cast<size_t>(info.numel));
    TRIDENT_RETURN_IF_ERROR(ckpt.ReadFloat(name, absl::MakeSpan(values)));
    progress.Add(info.num_bytes);
    // Norms and 1-D biases: the rank's block of a split bias.
    int64_t begin = 0, end = info.numel;
    if (tp.group != nullptr && !whole) {
      TRIDENT_ASSIGN_OR_RETURN(model::TensorShard shard,
                               model::ShardOf(full_config, tp.layout, name));
      if (!shard.whole) {
        begin = shard.slice.begin;
        end = shard.slice.end;
      }
    }
    host.insert(host.end(), values.begin() + begin, values.begin() + end);
  }
  TRIDENT_RETURN_IF_ERROR(out->Allocate(host.size() * 4, names.front().c_str()));
  return CudaCheck(cudaMemcpy(out->get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice),
                   "f32 upload");
}

absl::Status Impl::Load(const std::string& dir) {
  TRIDENT_ASSIGN_OR_RETURN(model::ModelConfig dir_config, model::LoadModelConfig(dir));
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> ckpt, model::Checkpoint::Open(dir));
  TRIDENT_RETURN_IF_ERROR(model::ValidateLlamaCheckpoint(dir_config, *ckpt));
  return LoadFrom(*ckpt, dir_config, dir + "/config.json");
}

absl::Status Impl::LoadFrom(const model::TensorReader& weights,
                            const model::ModelConfig& model_config, const std::string& source) {
  TRIDENT_RETURN_IF_ERROR(LoadWeights(weights, model_config, source));
  TRIDENT_RETURN_IF_ERROR(AllocateWorkspace());
  TRIDENT_ASSIGN_OR_RETURN(const int32_t blocks, KvBlocksAvailable());
  TRIDENT_RETURN_IF_ERROR(AllocateKv(blocks));
  return CaptureGraphs();
}

absl::Status Impl::LoadWeights(const model::TensorReader& weights,
                               const model::ModelConfig& model_config, const std::string& source) {
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(options.device), "set device"));
  // What other backends and processes hold already is not this one's.
  size_t total_at_start = 0;
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaMemGetInfo(&free_at_start, &total_at_start), "memory info"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, options.device), "SMs"));
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  TRIDENT_ASSIGN_OR_RETURN(
      gemm, kc::Gemm::Create({.gemv = options.gemv,
                              .pdl = options.pdl,
                              .gemv_bulk = options.gemv_bulk,
                              .gemv_dynamic = options.gemv_dynamic,
                              .skinny = options.gemm_skinny,
                              .skinny_silu_max_rows = options.gemm_skinny_silu_max_rows,
                              .skinny_cluster_split = options.gemm_skinny_cluster,
                              .tune_algos = options.gemm_tune_algos}));
  full_config = model_config;
  config = tp.group != nullptr ? model::RankModelConfig(model_config, tp.layout) : model_config;
  if (config.head_dim < 16 || config.head_dim > 256 || config.head_dim % 16 != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        source, ": head_dim ", config.head_dim,
        " is not supported by the CUDA attention kernels (a multiple of 16 up to 256)"));
  }
  // A reader of computed weights streams them on the device: a 70B rank's
  // shard in milliseconds instead of minutes of host cores.
  device_streams =
      options.device_generated_weights &&
      weights.StreamBlock("model.embed_tokens.weight", {model::SliceAxis::kRows, 0, 1}).ok();
  RealClock real_clock;
  // Ranks load at once (LoadTensorParallel): each line names its rank.
  model::LoadProgress progress(weights.total_bytes() / static_cast<uint64_t>(tp.layout.size),
                               options.clock != nullptr ? options.clock : &real_clock,
                               tp.group != nullptr ? absl::StrCat("rank ", tp.rank(), ": ") : "");

  {
    TRIDENT_ASSIGN_OR_RETURN(model::TensorInfo info, weights.Info("model.embed_tokens.weight"));
    f32_embedding = info.dtype == DType::kF32;
  }
  if (f32_embedding) {
    TRIDENT_RETURN_IF_ERROR(
        UploadF32(weights, {"model.embed_tokens.weight"}, &embedding, progress, /*whole=*/true));
  } else {
    TRIDENT_RETURN_IF_ERROR(
        UploadBf16(weights, {"model.embed_tokens.weight"}, &embedding, progress, /*whole=*/true));
  }
  layers.resize(config.num_hidden_layers);
  for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
    Layer& layer = layers[l];
    auto name = [l](const char* suffix) { return model::LayerTensorName(l, suffix); };
    TRIDENT_RETURN_IF_ERROR(
        UploadF32(weights, {name(model::kInputLayernorm)}, &layer.input_norm, progress));
    TRIDENT_RETURN_IF_ERROR(
        UploadF32(weights, {name(model::kPostAttentionLayernorm)}, &layer.post_norm, progress));
    TRIDENT_RETURN_IF_ERROR(
        UploadBf16(weights, {name(model::kQProj), name(model::kKProj), name(model::kVProj)},
                   &layer.qkv, progress));
    if (config.attention_bias) {
      TRIDENT_RETURN_IF_ERROR(UploadF32(
          weights, {name(model::kQProjBias), name(model::kKProjBias), name(model::kVProjBias)},
          &layer.qkv_bias, progress));
    }
    TRIDENT_RETURN_IF_ERROR(UploadBf16(weights, {name(model::kOProj)}, &layer.o, progress));
    // A row-parallel projection's bias is added once, by rank 0.
    if (config.o_proj_bias && tp.rank() == 0) {
      TRIDENT_RETURN_IF_ERROR(
          UploadF32(weights, {name(model::kOProjBias)}, &layer.o_bias, progress));
    }
    TRIDENT_RETURN_IF_ERROR(UploadBf16(weights, {name(model::kGateProj), name(model::kUpProj)},
                                       &layer.gate_up, progress));
    TRIDENT_RETURN_IF_ERROR(UploadBf16(weights, {name(model::kDownProj)}, &layer.down, progress));
    if (config.mlp_bias) {
      TRIDENT_RETURN_IF_ERROR(UploadF32(weights,
                                        {name(model::kGateProjBias), name(model::kUpProjBias)},
                                        &layer.gate_up_bias, progress));
      if (tp.rank() == 0) {
        TRIDENT_RETURN_IF_ERROR(
            UploadF32(weights, {name(model::kDownProjBias)}, &layer.down_bias, progress));
      }
    }
  }
  TRIDENT_RETURN_IF_ERROR(UploadF32(weights, {"model.norm.weight"}, &final_norm, progress));
  if (tp.group != nullptr) {
    // The rank's vocabulary block of the head (of the embedding when tied).
    const bool tied = config.tie_word_embeddings && !weights.Has("lm_head.weight");
    if (tp.layout.vocab > 0) {
      TRIDENT_RETURN_IF_ERROR(UploadBf16(
          weights, {tied ? "model.embed_tokens.weight" : "lm_head.weight"}, &lm_head, progress));
    }
  } else if (!config.tie_word_embeddings || weights.Has("lm_head.weight")) {
    TRIDENT_RETURN_IF_ERROR(UploadBf16(weights, {"lm_head.weight"}, &lm_head, progress));
  } else if (f32_embedding) {
    // Tied to an f32 embedding: the head GEMM needs its own bf16 copy.
    TRIDENT_RETURN_IF_ERROR(UploadBf16(weights, {"model.embed_tokens.weight"}, &lm_head, progress));
  }

  const kernels::cpu::RopeConfig rope = RopeConfigFor(config);
  const std::vector<float> freqs = kernels::cpu::RopeInvFreq(rope);
  TRIDENT_RETURN_IF_ERROR(inv_freq.Allocate(freqs.size() * 4, "inv_freq"));
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpy(inv_freq.get(), freqs.data(), freqs.size() * 4, cudaMemcpyHostToDevice),
                "inv_freq upload"));
  max_model_len = config.max_position_embeddings;
  if (options.max_model_len > 0) max_model_len = std::min(max_model_len, options.max_model_len);
  return absl::OkStatus();
}

absl::Status Impl::AllocatePass(Pass& pass, int64_t t, int64_t s) {
  const int64_t h = config.hidden_size;
  const int64_t inter = config.intermediate_size;
  pass.max_tokens = t;
  pass.max_seqs = s;
  TRIDENT_RETURN_IF_ERROR(pass.residual.Allocate(t * h * 4, "residual"));
  TRIDENT_RETURN_IF_ERROR(pass.qkv32.Allocate(t * qkv_width() * 4, "qkv projection"));
  TRIDENT_RETURN_IF_ERROR(pass.gate_up32.Allocate(t * 2 * inter * 4, "gate/up projection"));
  TRIDENT_RETURN_IF_ERROR(pass.hn.Allocate(t * h * 2, "normed activations"));
  TRIDENT_RETURN_IF_ERROR(pass.qkv.Allocate(t * qkv_width() * 2, "qkv"));
  TRIDENT_RETURN_IF_ERROR(pass.attn.Allocate(t * q_out() * 2, "attention output"));
  TRIDENT_RETURN_IF_ERROR(pass.tmp.Allocate(t * h * 2, "embedding output"));
  TRIDENT_RETURN_IF_ERROR(pass.act.Allocate(t * inter * 2, "activation"));
  const int64_t max_blocks = (max_model_len + options.kv_block_size - 1) / options.kv_block_size;
  const size_t meta_bytes = MetaBytes(t, s, max_blocks);
  TRIDENT_RETURN_IF_ERROR(pass.meta.Allocate(meta_bytes, "step metadata"));
  TRIDENT_RETURN_IF_ERROR(pass.host_meta.Allocate(meta_bytes, "step metadata"));
  pass.hmeta = ViewMeta(pass.host_meta.get(), t, s);
  pass.dmeta = ViewMeta(pass.meta.get(), t, s);
  // CPU-resident rows: one token per sequence.
  TRIDENT_RETURN_IF_ERROR(pass.host_remote_qkv.Allocate(s * qkv_width() * 2, "remote q/k/v"));
  TRIDENT_RETURN_IF_ERROR(pass.host_remote_o.Allocate(s * q_out() * 2, "remote attention"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(
      cudaEventCreateWithFlags(&pass.qkv_ready, cudaEventDisableTiming), "remote q/k/v event"));
  pass.remote.set_shape({.num_q_heads = config.num_attention_heads,
                         .num_kv_heads = config.num_key_value_heads,
                         .head_dim = config.head_dim,
                         .wire = transport::attention::WireDType::kBF16});
  return absl::OkStatus();
}

absl::Status Impl::AllocateWorkspace() {
  const int64_t s = options.max_batch_sequences;
  TRIDENT_RETURN_IF_ERROR(AllocatePass(passes[0], options.max_batch_tokens, s));
  // The pipelined sub-batch: CPU-resident decode rows only.
  TRIDENT_RETURN_IF_ERROR(AllocatePass(passes[1], s, s));
  TRIDENT_RETURN_IF_ERROR(last.Allocate(s * int64_t{config.hidden_size} * 2, "last rows"));
  // The whole vocabulary's logits and the sampler: rank 0's alone (the other
  // ranks write their columns into rank 0's logits).
  if (tp.rank() == 0) {
    TRIDENT_RETURN_IF_ERROR(logits.Allocate(s * int64_t{config.vocab_size} * 4, "logits"));
    TRIDENT_RETURN_IF_ERROR(host_logits.Allocate(s * int64_t{config.vocab_size} * 4, "logits"));
    TRIDENT_RETURN_IF_ERROR(
        sample_ws.Allocate(std::max<size_t>(kc::SampleWorkspaceBytes(s, config.vocab_size), 256),
                           "sampler workspace"));
    const size_t sample_out_bytes = static_cast<size_t>(s) * (8 + 8 * kc::kMaxSampleTopLogprobs);
    TRIDENT_RETURN_IF_ERROR(sample_out.Allocate(sample_out_bytes, "sampler outputs"));
    TRIDENT_RETURN_IF_ERROR(host_sample_out.Allocate(sample_out_bytes, "sampler outputs"));
  }
  // The split count of a plan depends on the batch, and not monotonically
  // (a batch between two powers of two may take more splits than either):
  // take the largest need over every batch.
  size_t decode_ws = 256;
  for (int64_t b = 1; b <= s; ++b) {
    const kc::DecodePlan plan = PlanDecode(static_cast<int32_t>(b), max_model_len);
    decode_ws =
        std::max(decode_ws, kc::DecodeWorkspaceBytes(plan, static_cast<int32_t>(b),
                                                     config.num_attention_heads, config.head_dim));
  }
  TRIDENT_RETURN_IF_ERROR(decode_workspace.Allocate(decode_ws, "decode workspace"));
  if (tp.group != nullptr) {
    // Two halves: the o projection's and the down projection's (see
    // EnqueuePeerSum).
    TRIDENT_RETURN_IF_ERROR(
        tp.partial.Allocate(2 * static_cast<size_t>(passes[0].max_tokens) * config.hidden_size * 4,
                            "partial projections"));
    TRIDENT_RETURN_IF_ERROR(
        tp.signals.Allocate(kc::PeerAllReduceSignalBytes(), "all-reduce signals"));
    TRIDENT_RETURN_IF_ERROR(tp.barrier.Allocate(64, "head barrier"));
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaMemset(tp.signals.get(), 0, tp.signals.bytes()), "all-reduce signals"));
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaMemset(tp.barrier.get(), 0, tp.barrier.bytes()), "head barrier"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> Impl::KvBlocksAvailable() {
  kv_spec.num_layers = config.num_hidden_layers;
  kv_spec.num_kv_heads = config.num_key_value_heads;
  kv_spec.head_dim = config.head_dim;
  kv_spec.block_size = options.kv_block_size;
  if (options.kv_cache_dtype != DType::kBF16 && options.kv_cache_dtype != DType::kFP8E4M3) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend's KV cache is bf16 or fp8_e4m3, not ",
                     numeric::DTypeName(options.kv_cache_dtype)));
  }
  kv_spec.dtype = options.kv_cache_dtype;
  if (kv_spec.fp8() && (kv_spec.block_size % 16 != 0 || kv_spec.head_dim % 16 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an fp8_e4m3 KV cache needs --kv_block_size (", kv_spec.block_size,
                     ") and the model's head_dim (", kv_spec.head_dim, ") multiples of 16"));
  }
  size_t free_bytes = 0, total_bytes = 0;
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes), "memory info"));
  const double budget = options.gpu_memory_fraction * static_cast<double>(total_bytes);
  // This backend's own use so far (weights, workspace), against its share.
  const double used = static_cast<double>(free_at_start) - static_cast<double>(free_bytes);
  const double for_kv = std::min(budget - used, static_cast<double>(free_bytes) - (256 << 20));
  kv_spec.num_blocks = for_kv > 0 ? kv_spec.BlocksForBudget(static_cast<uint64_t>(for_kv)) : 0;
  if (kv_spec.num_blocks < 2) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no device memory left for the KV cache: %.1f GiB used of a %.1f GiB budget "
        "(--gpu_memory_fraction=%.2f)",
        used / (1 << 30), budget / (1 << 30), options.gpu_memory_fraction));
  }
  if (options.kv_cache_tokens > 0) {
    // A cap below what memory allows (the scratch block comes on top).
    const int32_t capped = (options.kv_cache_tokens + kv_spec.block_size - 1) / kv_spec.block_size;
    kv_spec.num_blocks = std::min(kv_spec.num_blocks, capped + 1);
  }
  return kv_spec.num_blocks;
}

absl::Status Impl::AllocateKv(int32_t num_blocks) {
  kv_spec.num_blocks = num_blocks;
  scratch_block = kv_spec.num_blocks - 1;
  TRIDENT_RETURN_IF_ERROR(kv_pool.Allocate(kv_spec.TotalBytes(), "KV cache"));
  TRIDENT_LOG(INFO) << absl::StrFormat(
      "KV cache: %d blocks of %d tokens, %.2f GiB, %s", scratch_block, kv_spec.block_size,
      kv_spec.TotalBytes() / double(1 << 30), numeric::DTypeName(kv_spec.dtype));
  return absl::OkStatus();
}

}  // namespace cuda_internal

CudaBackend::CudaBackend(std::unique_ptr<cuda_internal::Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

namespace {

// A backend's state before loading, on a device that exists.
absl::StatusOr<std::unique_ptr<cuda_internal::Impl>> NewImpl(const CudaBackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA device ", options.device, " not present (", count, " devices)"));
  }
  auto impl = std::make_unique<cuda_internal::Impl>();
  impl->options = options;
  return impl;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const std::string& model_dir, const CudaBackendOptions& options) {
  if (options.tensor_parallel != 1) {
    TRIDENT_ASSIGN_OR_RETURN(model::ModelConfig config, model::LoadModelConfig(model_dir));
    TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<model::Checkpoint> ckpt,
                             model::Checkpoint::Open(model_dir));
    TRIDENT_RETURN_IF_ERROR(model::ValidateLlamaCheckpoint(config, *ckpt));
    TRIDENT_ASSIGN_OR_RETURN(
        std::unique_ptr<cuda_internal::Impl> impl,
        cuda_internal::LoadTensorParallel(*ckpt, config, model_dir + "/config.json", options));
    return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
  }
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<cuda_internal::Impl> impl, NewImpl(options));
  TRIDENT_RETURN_IF_ERROR(impl->Load(model_dir));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::CreateFromWeights(
    const model::TensorReader& weights, const model::ModelConfig& config,
    const CudaBackendOptions& options) {
  if (options.tensor_parallel != 1) {
    TRIDENT_ASSIGN_OR_RETURN(
        std::unique_ptr<cuda_internal::Impl> impl,
        cuda_internal::LoadTensorParallel(weights, config, "generated weights", options));
    return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
  }
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<cuda_internal::Impl> impl, NewImpl(options));
  TRIDENT_RETURN_IF_ERROR(impl->LoadFrom(weights, config, "generated weights"));
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

int32_t CudaBackend::vocab_size() const { return impl_->config.vocab_size; }

bool CudaBackend::supports_remote_attention() const {
  return !impl_->kv_spec.fp8() && impl_->tp.group == nullptr;
}
int32_t CudaBackend::max_model_len() const { return impl_->max_model_len; }
KvCapacity CudaBackend::kv_capacity() const {
  return {impl_->scratch_block, impl_->kv_spec.block_size};
}
absl::StatusOr<KvMemory> CudaBackend::kv_memory() const {
  KvMemory m;
  if (impl_->tp.group != nullptr) {
    // The ranks' pools as one TP = 1 pool (tp_kv_copier.h reaches it).
    TRIDENT_ASSIGN_OR_RETURN(const model::KvView view, TensorParallelKvView());
    m.base = impl_->kv_pool.get();
    m.bytes = view.spec().TotalBytes();
    m.spec = view.spec();
    m.usable_blocks = impl_->scratch_block;
    m.device = true;
    m.device_ordinal = impl_->options.device;
    m.view = true;
    return m;
  }
  m.base = impl_->kv_pool.get();
  m.bytes = impl_->kv_pool.bytes();
  m.spec = impl_->kv_spec;
  m.usable_blocks = impl_->scratch_block;
  m.device = true;
  m.device_ordinal = impl_->options.device;
  return m;
}

GraphStats CudaBackend::graph_stats() const {
  GraphStats s;
  // Written only before the graphs were sealed, at start-up.
  s.captured = static_cast<int64_t>(impl_->graphs.size());
  s.capture_seconds = impl_->graph_capture_seconds;
  s.replays = impl_->graph_replays.load(std::memory_order_relaxed);
  s.misses = impl_->graph_misses.load(std::memory_order_relaxed);
  return s;
}

const model::ModelConfig& CudaBackend::config() const { return impl_->config; }

std::string CudaBackend::Describe() const {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, impl_->options.device);
  const std::string tp =
      impl_->tp.group != nullptr
          ? absl::StrCat("tensor parallel x", impl_->tp.group->ranks.size(), " from ")
          : "";
  return absl::StrCat(tp, "cuda:", impl_->options.device, " (", prop.name, "), bf16, ",
                      impl_->config.num_hidden_layers, " layers, KV ", impl_->scratch_block,
                      " blocks of ", impl_->kv_spec.block_size, " tokens (",
                      numeric::DTypeName(impl_->kv_spec.dtype), ")");
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
  impl_->remote_timeout = remote_timeout();
  absl::Status status = impl_->Forward(batch, logits);
  // A step that failed midway may have copies in flight from the pinned
  // buffers the next step refills.
  if (!status.ok()) cudaStreamSynchronize(impl_->stream);
  return status;
}

bool CudaBackend::samples_on_device() const { return impl_->options.device_sampling; }

absl::Status CudaBackend::ForwardSample(absl::Span<const StepSequence> batch,
                                        absl::Span<const RowSampling> rows,
                                        absl::Span<sampling::SampledToken> out) {
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaSetDevice(impl_->options.device), "cudaSetDevice"));
  LayerObserverScope scope(impl_->layer_observer, layer_observer(), impl_->stream);
  impl_->remote_timeout = remote_timeout();
  absl::Status status = impl_->ForwardSample(batch, rows, out);
  if (!status.ok()) cudaStreamSynchronize(impl_->stream);
  return status;
}

RemoteAttentionTiming CudaBackend::remote_attention_timing() const { return impl_->remote_timing; }

absl::StatusOr<model::KvView> CudaBackend::TensorParallelKvView() const {
  return model::KvView::Create(impl_->full_config,
                               static_cast<int32_t>(impl_->tp.group->ranks.size()), impl_->kv_spec);
}

std::vector<TensorParallelKvCopier::RankPool> CudaBackend::KvRankPools() const {
  std::vector<TensorParallelKvCopier::RankPool> pools;
  auto add = [&pools](const Impl& rank) {
    pools.push_back({rank.options.device, rank.kv_pool.get<char>(), rank.kv_pool.bytes()});
  };
  if (impl_->tp.group == nullptr) {
    add(*impl_);
  } else {
    for (const Impl* rank : impl_->tp.group->ranks) add(*rank);
  }
  return pools;
}

absl::StatusOr<std::unique_ptr<KvCopier>> CudaBackend::CreateKvCopier() const {
  if (impl_->tp.group != nullptr) {
    TRIDENT_ASSIGN_OR_RETURN(model::KvView view, TensorParallelKvView());
    TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<TensorParallelKvCopier> copier,
                             TensorParallelKvCopier::Create(std::move(view), KvRankPools()));
    return std::unique_ptr<KvCopier>(std::move(copier));
  }
  TRIDENT_ASSIGN_OR_RETURN(KvMemory memory, kv_memory());
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<CudaKvCopier> copier, CudaKvCopier::Create(memory));
  return std::unique_ptr<KvCopier>(std::move(copier));
}

absl::StatusOr<std::unique_ptr<KvPeerLane>> CudaBackend::CreateKvPeerLane() const {
  TRIDENT_ASSIGN_OR_RETURN(const KvMemory memory, kv_memory());
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<CudaKvPeerLane> lane,
                           CudaKvPeerLane::Create(impl_->full_config, memory.spec, KvRankPools()));
  return std::unique_ptr<KvPeerLane>(std::move(lane));
}

}  // namespace trident::backend
