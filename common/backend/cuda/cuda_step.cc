// The CUDA backend's forward steps: validation, the split into passes,
// metadata staging, and the enqueueing of a step (graph replay, one pass of
// launches, or layer by layer with CPU-resident rows).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/backend/cuda/cuda_backend_impl.h"
#include "common/logging/log.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/embedding/embedding.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/kv_append/kv_append.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"
#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention.h"
#include "kernels/cuda/rms_norm/rms_norm.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/cuda/sampling/sampling.h"
#include "kernels/cuda/silu_mul/silu_mul.h"

namespace trident::backend::cuda_internal {
namespace {

using numeric::DType;

// residual (f32) += delta (or = delta with `replace`); out = RMSNorm(residual)
// * weight, in bf16.
absl::Status AddRmsNorm(float* residual, const void* delta, bool replace, const float* weight,
                        int64_t rows, int64_t dim, float eps, void* out, bool pdl,
                        cudaStream_t stream) {
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
  a.pdl = pdl;
  return kc::LaunchAddRmsNorm(a, stream);
}

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

// The GEMM tuning's part in the capture, for its log line ("" untuned).
std::string TuneNote(const kc::Gemm::TuneStats& stats) {
  if (stats.shapes == 0) return "";
  return absl::StrCat("; cuBLASLt tuned for ", stats.shapes, " shapes (", stats.changed,
                      " off its heuristic's first choice) in ",
                      absl::StrFormat("%.2f", stats.seconds), " s of it");
}

}  // namespace

absl::Status Impl::Validate(const StepSequence& s) const {
  const int32_t bs = kv_spec.block_size;
  const int64_t end = s.start_position + static_cast<int64_t>(s.tokens.size());
  if (s.tokens.empty() || s.start_position < 0 || end > max_model_len) {
    return absl::InvalidArgumentError(absl::StrCat("sequence spans positions [", s.start_position,
                                                   ", ", end, "), outside the context window of ",
                                                   max_model_len));
  }
  for (int32_t token : s.tokens) {
    if (token < 0 || token >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", token, " outside the vocabulary"));
    }
  }
  TRIDENT_RETURN_IF_ERROR(ValidateOffloadFields(s));
  if (s.remote.service != nullptr) return absl::OkStatus();
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
  return absl::OkStatus();
}

absl::Status Impl::Split(absl::Span<const StepSequence> batch) {
  if (static_cast<int64_t>(batch.size()) > options.max_batch_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", batch.size(),
                                                   " sequences exceeds --max_batch_sequences ",
                                                   options.max_batch_sequences));
  }
  for (Pass& pass : passes) pass.order.clear();
  // Pass order: resident sequences first, those decoding one token ahead of
  // prompts (a mixed step runs its attention as a decode launch over the
  // first and a prefill launch over the rest), then CPU-resident ones.
  for (int32_t i = 0; i < static_cast<int32_t>(batch.size()); ++i) {
    TRIDENT_RETURN_IF_ERROR(Validate(batch[i]));
    if (batch[i].remote.service == nullptr && batch[i].tokens.size() == 1) {
      passes[0].order.push_back(i);
    }
  }
  for (int32_t i = 0; i < static_cast<int32_t>(batch.size()); ++i) {
    if (batch[i].remote.service == nullptr && batch[i].tokens.size() != 1) {
      passes[0].order.push_back(i);
    }
  }
  for (int32_t i = 0; i < static_cast<int32_t>(batch.size()); ++i) {
    if (batch[i].remote.service != nullptr) passes[batch[i].sub_batch].order.push_back(i);
  }
  // A second sub-batch alone is just a batch.
  if (passes[0].order.empty()) std::swap(passes[0].order, passes[1].order);
  num_passes = passes[1].order.empty() ? 1 : 2;
  // Where each wanted row goes in the caller's order.
  wanted_index.assign(batch.size(), -1);
  int32_t wanted = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].want_logits) wanted_index[i] = wanted++;
  }
  row_origin.clear();
  for (int p = 0; p < num_passes; ++p) {
    for (int32_t i : passes[p].order) {
      if (batch[i].want_logits) row_origin.push_back(wanted_index[i]);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Impl::Stage(Pass& pass, absl::Span<const StepSequence> batch, bool graphable) {
  const int32_t bs = kv_spec.block_size;
  const int32_t max_blocks = (max_model_len + bs - 1) / bs;
  StepShape& shape = pass.shape;
  shape = StepShape();
  int32_t max_context = 0, max_table = 1, wanted_rows = 0;
  shape.all_decode = true;
  for (int32_t i : pass.order) {
    const StepSequence& s = batch[i];
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    shape.total += n;
    wanted_rows += s.want_logits ? 1 : 0;
    if (s.remote.service != nullptr) continue;
    const int64_t end = s.start_position + n;
    ++shape.local_seqs;
    shape.local_tokens += n;
    shape.max_query = std::max<int32_t>(shape.max_query, static_cast<int32_t>(n));
    max_context = std::max<int32_t>(max_context, static_cast<int32_t>(end));
    max_table = std::max<int32_t>(max_table, static_cast<int32_t>((end + bs - 1) / bs));
    shape.all_decode = shape.all_decode && n == 1;
    if (n == 1 && shape.decode_seqs + 1 == shape.local_seqs) {
      ++shape.decode_seqs;  // The leading one-token sequences.
      shape.max_decode_context =
          std::max<int32_t>(shape.max_decode_context, static_cast<int32_t>(end));
    }
  }
  if (shape.total > pass.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", shape.total, " tokens exceeds --max_batch_tokens ", pass.max_tokens));
  }
  const int32_t num_seqs = static_cast<int32_t>(pass.order.size());
  // Graph replay for decode steps, padded to a bucket.
  const int32_t padded = shape.all_decode ? GraphBatch(num_seqs) : num_seqs;
  const bool use_graph = graphable && options.cuda_graphs && shape.all_decode &&
                         shape.local_seqs == num_seqs && wanted_rows == num_seqs &&
                         padded <= pass.max_seqs && padded <= pass.max_tokens;
  shape.num_seqs = use_graph ? padded : num_seqs;
  if (use_graph) shape.local_seqs = padded;
  shape.table_stride = std::min(NextPow2(max_table), max_blocks);
  if (use_graph) {
    shape.plan = GraphShape(padded, max_context).plan;
  } else if (shape.all_decode && shape.local_seqs > 0) {
    shape.plan = PlanDecode(shape.local_seqs, max_context);
  } else if (shape.decode_seqs > 0) {
    shape.plan = PlanDecode(shape.decode_seqs, shape.max_decode_context);
  }

  const MetaView& m = pass.hmeta;
  pass.remote.Clear();
  int64_t row = 0;
  for (int32_t k = 0; k < num_seqs; ++k) {
    const StepSequence& s = batch[pass.order[k]];
    const bool remote = s.remote.service != nullptr;
    for (size_t j = 0; j < s.tokens.size(); ++j) {
      const int32_t pos = s.start_position + static_cast<int32_t>(j);
      m.tokens[row + j] = s.tokens[j];
      m.positions[row + j] = pos;
      m.slots[row + j] =
          remote ? int64_t{scratch_block} * bs : int64_t{s.block_table[pos / bs]} * bs + pos % bs;
    }
    if (remote) {
      pass.remote.Add(s.remote, s.start_position, row - shape.local_tokens);
    } else {
      const int32_t used = static_cast<int32_t>((s.start_position + s.tokens.size() + bs - 1) / bs);
      std::memcpy(m.tables + int64_t{k} * shape.table_stride, s.block_table.data(),
                  static_cast<size_t>(used) * 4);
      m.context_lens[k] = s.start_position + static_cast<int32_t>(s.tokens.size());
      m.query_lens[k] = static_cast<int32_t>(s.tokens.size());
      m.query_starts[k] = static_cast<int32_t>(row);
    }
    row += static_cast<int64_t>(s.tokens.size());
    if (s.want_logits) m.rows[shape.head_rows++] = static_cast<int32_t>(row - 1);
  }
  // Padding sequences: one token at position 0 of the scratch block.
  for (int32_t k = num_seqs; k < shape.num_seqs; ++k) {
    m.tokens[row] = 0;
    m.positions[row] = 0;
    m.slots[row] = int64_t{scratch_block} * bs;
    m.tables[int64_t{k} * shape.table_stride] = scratch_block;
    m.context_lens[k] = 1;
    m.query_lens[k] = 1;
    m.query_starts[k] = static_cast<int32_t>(row);
    ++row;
  }
  shape.total = row;
  if (use_graph) shape.local_tokens = row;
  // Every row wanted, in order (decode): the head reads the normed rows in
  // place; a graph computes the padding rows' logits too.
  shape.gather = shape.head_rows != row;
  if (use_graph) {
    shape.head_rows = row;
    shape.gather = false;
  }
  const size_t meta_bytes =
      reinterpret_cast<const char*>(m.tables +
                                    int64_t{std::max(shape.num_seqs, 1)} * shape.table_stride) -
      pass.host_meta.get<const char>();
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMemcpyAsync(pass.meta.get(), pass.host_meta.get(),
                                                    meta_bytes, cudaMemcpyHostToDevice, stream),
                                    "metadata"));
  return use_graph;
}

absl::Status Impl::Norm(Pass& pass, const DeviceBuffer& weight, int64_t rows) {
  kc::RmsNormArgs a;
  a.x = pass.residual.get();
  a.x_dtype = DType::kF32;
  a.x_stride = config.hidden_size;
  a.weight = weight.get<float>();
  a.out = pass.hn.get();
  a.out_stride = config.hidden_size;
  a.rows = rows;
  a.dim = config.hidden_size;
  a.eps = config.rms_norm_eps;
  a.pdl = options.pdl_chain;
  return kc::LaunchRmsNorm(a, stream);
}

absl::Status Impl::NormInto(Pass& pass, const DeviceBuffer& weight, int64_t rows, kc::GemmArgs& g) {
  kc::GemmArgs fused = g;
  fused.x = pass.residual.get();
  fused.x_stride = config.hidden_size;
  fused.norm_weight = weight.get<float>();
  fused.norm_eps = config.rms_norm_eps;
  if (options.gemv_norm && gemm->FusesNorm(fused)) {
    g = fused;
    return absl::OkStatus();
  }
  return Norm(pass, weight, rows);
}

absl::Status Impl::EnqueueEmbedding(Pass& pass) {
  const int64_t h = config.hidden_size;
  // A bf16 embedding goes to tmp, and layer 0's fused add+norm starts the
  // f32 residual stream from it; f32 rows are copied into the residual
  // stream directly (the gather moves bits: an f32 row is 2 * hidden bf16).
  if (f32_embedding) {
    return kc::LaunchEmbedding({pass.dmeta.tokens, pass.shape.total, embedding.get(),
                                config.vocab_size, 2 * h, pass.residual.get()},
                               stream);
  }
  return kc::LaunchEmbedding(
      {pass.dmeta.tokens, pass.shape.total, embedding.get(), config.vocab_size, h, pass.tmp.get()},
      stream);
}

kc::PagedKvBf16 Impl::LayerCacheBf16(int32_t l) {
  return {kv_pool.get<char>() + kv_spec.KeyOffsetBytes(l, 0),
          kv_spec.num_blocks,
          kv_spec.block_size,
          config.num_key_value_heads,
          config.head_dim,
          kv_spec.block_stride_elements(),
          kv_spec.value_offset_elements()};
}

absl::Status Impl::EnqueueQkv(Pass& pass, int32_t l, bool* kv_stored) {
  *kv_stored = false;
  const StepShape& shape = pass.shape;
  const int64_t h = config.hidden_size;
  Layer& layer = layers[l];
  kc::GemmArgs g{pass.hn.get(),
                 h,
                 layer.qkv.get(),
                 layer.qkv_bias.get(),
                 pass.qkv32.get(),
                 qkv_width(),
                 shape.total,
                 qkv_width(),
                 h};
  g.y_dtype = DType::kF32;
  if (l == 0 && !f32_embedding) {
    TRIDENT_RETURN_IF_ERROR(AddRmsNorm(pass.residual.get<float>(), pass.tmp.get(),
                                       /*replace=*/true, layer.input_norm.get<float>(), shape.total,
                                       h, config.rms_norm_eps, pass.hn.get(), options.pdl_chain,
                                       stream));
  } else {
    TRIDENT_RETURN_IF_ERROR(NormInto(pass, layer.input_norm, shape.total, g));
  }
  // One token on Hopper's GEMV: RoPE is the projection's epilogue, into
  // the bf16 rows directly.
  kc::GemmRope epilogue{pass.dmeta.positions, inv_freq.get<float>(), config.num_attention_heads,
                        config.num_key_value_heads, config.head_dim};
  if (shape.local_tokens == shape.total && !kv_spec.fp8()) {
    // Every token is local and the cache bf16: the projection's epilogue,
    // or else the RoPE kernel, stores k and v as well (the KV append's).
    epilogue.kv = LayerCacheBf16(l);
    epilogue.slots = pass.dmeta.slots;
  }
  kc::GemmArgs rotated = g;
  rotated.y = pass.qkv.get();
  rotated.y_dtype = DType::kBF16;
  if (options.gemv_rope && gemm->FusesRope(rotated, epilogue)) {
    *kv_stored = epilogue.kv.base != nullptr;
    return gemm->RunRope(rotated, epilogue, stream);
  }
  TRIDENT_RETURN_IF_ERROR(gemm->Run(g, stream));
  kc::RopeQkvArgs rope;
  rope.in = pass.qkv32.get<float>();
  rope.in_stride = qkv_width();
  rope.out = pass.qkv.get();
  rope.out_stride = qkv_width();
  rope.num_q_heads = config.num_attention_heads;
  rope.num_kv_heads = config.num_key_value_heads;
  rope.head_dim = config.head_dim;
  rope.positions = pass.dmeta.positions;
  rope.num_tokens = shape.total;
  rope.inv_freq = inv_freq.get<float>();
  rope.pdl = options.pdl_chain;
  rope.kv = epilogue.kv;
  rope.slots = epilogue.slots;
  *kv_stored = epilogue.kv.base != nullptr;
  return kc::LaunchRopeQkv(rope, stream);
}

absl::Status Impl::EnqueuePreAttention(Pass& pass, int32_t l) {
  const StepShape& shape = pass.shape;
  bool kv_stored = false;
  TRIDENT_RETURN_IF_ERROR(EnqueueQkv(pass, l, &kv_stored));
  if (shape.remote_rows() > 0) {
    // The CPU-resident rows' q/k/v, for their services.
    const size_t row_bytes = static_cast<size_t>(qkv_width()) * 2;
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpyAsync(pass.host_remote_qkv.get(),
                                  pass.qkv.get<char>() + shape.local_tokens * row_bytes,
                                  shape.remote_rows() * row_bytes, cudaMemcpyDeviceToHost, stream),
                  "remote q/k/v"));
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaEventRecord(pass.qkv_ready, stream), "remote q/k/v"));
  }
  if (shape.local_tokens == 0) return absl::OkStatus();
  // A tensor-parallel step reports a layer once every rank wrote its KV
  // (after the o projection's sum).
  if (kv_stored) return tp.group != nullptr ? absl::OkStatus() : ReportLayer(pass, l);
  // The fields the bf16 and FP8 appends share: the step's k and v (sections
  // of the qkv rows) and slots.
  auto fill = [&](auto& append) {
    append.k = pass.qkv.get<char>() + q_out() * 2;
    append.k_stride = qkv_width();
    append.v = pass.qkv.get<char>() + (q_out() + kv_out()) * 2;
    append.v_stride = qkv_width();
    append.slots = pass.dmeta.slots;
    append.num_tokens = shape.local_tokens;
    append.pdl = options.pdl_chain;
  };
  if (kv_spec.fp8()) {
    kc::KvAppendFp8Args append;
    fill(append);
    append.kv.base = kv_pool.get<char>() + kv_spec.KeyOffsetBytes(l, 0);
    append.kv.num_blocks = kv_spec.num_blocks;
    append.kv.block_size = kv_spec.block_size;
    append.kv.num_kv_heads = config.num_key_value_heads;
    append.kv.head_dim = config.head_dim;
    append.kv.block_stride_bytes = kv_spec.block_stride_elements();
    append.kv.value_offset_bytes = kv_spec.value_offset_elements();
    append.kv.scale_offset_bytes = kv_spec.scale_offset_elements();
    TRIDENT_RETURN_IF_ERROR(kc::LaunchKvAppendFp8(append, stream));
  } else {
    kc::KvAppendArgs append;
    fill(append);
    append.kv = LayerCacheBf16(l);
    TRIDENT_RETURN_IF_ERROR(kc::LaunchKvAppend(append, stream));
  }
  // A tensor-parallel step reports a layer once every rank wrote its KV
  // (after the o projection's sum).
  return tp.group != nullptr ? absl::OkStatus() : ReportLayer(pass, l);
}

absl::Status Impl::ReportLayer(Pass& pass, int32_t l) {
  const StepShape& shape = pass.shape;
  if (layer_observer != nullptr && !shape.all_decode && &pass == &passes[0]) {
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
  return absl::OkStatus();
}

absl::Status Impl::EnqueueLocalAttention(Pass& pass, int32_t l) {
  const StepShape& shape = pass.shape;
  if (shape.local_seqs == 0) return absl::OkStatus();
  // The fields decode and prefill attention share: this step's q, output,
  // one layer's paged KV and the block tables.
  auto paged_args = [&](auto& a) {
    a.q = pass.qkv.get();
    a.q_stride = qkv_width();
    a.out = pass.attn.get();
    a.out_stride = q_out();
    a.kv_base = kv_pool.get<char>() + kv_spec.KeyOffsetBytes(l, 0);
    a.block_stride_elems = kv_spec.block_stride_elements();
    a.value_offset_elems = kv_spec.value_offset_elements();
    a.scale_offset_elems = kv_spec.fp8() ? kv_spec.scale_offset_elements() : 0;
    a.block_size = kv_spec.block_size;
    a.num_q_heads = config.num_attention_heads;
    a.num_kv_heads = config.num_key_value_heads;
    a.head_dim = config.head_dim;
    a.block_tables = pass.dmeta.tables;
    a.max_blocks_per_seq = shape.table_stride;
    a.context_lens = pass.dmeta.context_lens;
    a.batch = shape.local_seqs;
    a.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  };
  // Decode launch over the leading one-token sequences (all of them in a
  // decode step), prefill launch over the rest.
  const int32_t decode_seqs = shape.all_decode ? shape.local_seqs : shape.decode_seqs;
  if (decode_seqs > 0) {
    kc::PagedDecodeArgs a;
    paged_args(a);
    a.batch = decode_seqs;
    a.kv_dtype = kv_spec.fp8() ? kc::DecodeKvDtype::kFp8E4M3 : kc::DecodeKvDtype::kBf16;
    a.pdl = options.pdl_chain;
    // The step's kernels write no cached position of a decode sequence but
    // its last (this step's token); its inputs are uploaded before them.
    a.stable_prefix = options.pdl_chain && options.decode_stable_prefix;
    TRIDENT_RETURN_IF_ERROR(kc::LaunchPagedDecodeAttention(a, shape.plan, decode_workspace.get(),
                                                           decode_workspace.bytes(), stream));
  }
  if (decode_seqs == shape.local_seqs) return absl::OkStatus();
  kc::PagedPrefillArgs a;
  paged_args(a);
  a.kv_fp8 = kv_spec.fp8();
  a.block_tables += int64_t{decode_seqs} * shape.table_stride;
  a.context_lens += decode_seqs;
  a.batch = shape.local_seqs - decode_seqs;
  a.query_lens = pass.dmeta.query_lens + decode_seqs;
  a.query_starts = pass.dmeta.query_starts + decode_seqs;
  a.max_query_len = shape.max_query;
  return kc::LaunchPagedPrefillAttention(a, stream);
}

std::pair<float*, bool> Impl::RowParallelOut(Pass& pass, bool down) {
  if (tp.group == nullptr) return {pass.residual.get<float>(), true};
  // NCCL sums the residual in place: rank 0 adds its part to it, the others
  // put theirs in its place. The peer kernel reads each rank's partial.
  if (tp.nccl_step) return {pass.residual.get<float>(), tp.rank() == 0};
  return {Partial(down), false};
}

absl::Status Impl::EnqueuePostAttention(Pass& pass, int32_t l) {
  TRIDENT_RETURN_IF_ERROR(EnqueueOProj(pass, l));
  if (tp.group != nullptr) TRIDENT_RETURN_IF_ERROR(EnqueuePeerSum(pass, /*down=*/false));
  TRIDENT_RETURN_IF_ERROR(EnqueueMlp(pass, l));
  if (tp.group != nullptr) TRIDENT_RETURN_IF_ERROR(EnqueuePeerSum(pass, /*down=*/true));
  return absl::OkStatus();
}

absl::Status Impl::EnqueueOProj(Pass& pass, int32_t l) {
  const StepShape& shape = pass.shape;
  if (shape.remote_rows() > 0) {
    // The services' answers (ReceiveRemote put them in host_remote_o).
    const size_t row_bytes = static_cast<size_t>(q_out()) * 2;
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpyAsync(pass.attn.get<char>() + shape.local_tokens * row_bytes,
                                  pass.host_remote_o.get(), shape.remote_rows() * row_bytes,
                                  cudaMemcpyHostToDevice, stream),
                  "remote attention"));
  }
  const auto [out, accumulate] = RowParallelOut(pass, /*down=*/false);
  const Layer& layer = layers[l];
  kc::GemmArgs g{pass.attn.get(),
                 q_out(),
                 layer.o.get(),
                 layer.o_bias.get(),
                 out,
                 config.hidden_size,
                 shape.total,
                 config.hidden_size,
                 q_out()};
  g.y_dtype = DType::kF32;
  g.accumulate = accumulate;
  return gemm->Run(g, stream);
}

absl::Status Impl::EnqueueMlp(Pass& pass, int32_t l) {
  const int64_t h = config.hidden_size;
  const int64_t inter = config.intermediate_size;
  const int64_t total = pass.shape.total;
  const Layer& layer = layers[l];
  kc::GemmArgs up{pass.hn.get(),
                  h,
                  layer.gate_up.get(),
                  layer.gate_up_bias.get(),
                  pass.gate_up32.get(),
                  2 * inter,
                  total,
                  2 * inter,
                  h};
  up.y_dtype = DType::kF32;
  TRIDENT_RETURN_IF_ERROR(NormInto(pass, layer.post_norm, total, up));
  kc::GemmArgs fused = up;
  fused.y = pass.act.get();
  fused.y_stride = inter;
  if (gemm->FusesSiluMul(fused)) {
    // One row on Hopper: the activation is the projection's epilogue.
    TRIDENT_RETURN_IF_ERROR(gemm->RunSiluMul(fused, stream));
  } else {
    TRIDENT_RETURN_IF_ERROR(gemm->Run(up, stream));
    kc::SiluMulArgs silu{pass.gate_up32.get(), 2 * inter, pass.act.get(), inter, total, inter};
    silu.gate_up_dtype = DType::kF32;
    silu.pdl = options.pdl_chain;
    TRIDENT_RETURN_IF_ERROR(kc::LaunchSiluMul(silu, stream));
  }
  const auto [out, accumulate] = RowParallelOut(pass, /*down=*/true);
  kc::GemmArgs down{
      pass.act.get(), inter, layer.down.get(), layer.down_bias.get(), out, h, total, h, inter};
  down.y_dtype = DType::kF32;
  down.accumulate = accumulate;
  return gemm->Run(down, stream);
}

absl::Status Impl::EnqueueHead(Pass& pass) {
  const StepShape& shape = pass.shape;
  // A rank without columns of the head has no logits to write.
  if (shape.head_rows == 0 || head_vocab() == 0) return absl::OkStatus();
  const int64_t h = config.hidden_size;
  // fp32 logits: bf16 would round near-ties (an ulp is 1/16 at 10) before
  // anyone samples them.
  // Under tensor parallelism, this rank's block of columns of rank 0's
  // logits (peer memory).
  float* out = tp.group != nullptr ? tp.group->ranks[0]->logits.get<float>() + tp.layout.first_vocab
                                   : logits.get<float>();
  kc::GemmArgs head_args{pass.hn.get(),
                         h,
                         head(),
                         nullptr,
                         out + pass.logits_row0 * config.vocab_size,
                         config.vocab_size,
                         shape.head_rows,
                         head_vocab(),
                         h};
  if (shape.gather) {
    // The wanted rows of the normed hidden states, gathered like an embedding
    // lookup with row ids for token ids.
    TRIDENT_RETURN_IF_ERROR(Norm(pass, final_norm, shape.total));
    TRIDENT_RETURN_IF_ERROR(kc::LaunchEmbedding(
        {pass.dmeta.rows, shape.head_rows, pass.hn.get(), shape.total, h, last.get()}, stream));
    head_args.x = last.get();
  } else {
    TRIDENT_RETURN_IF_ERROR(NormInto(pass, final_norm, shape.total, head_args));
  }
  head_args.y_dtype = DType::kF32;
  return gemm->Run(head_args, stream);
}

absl::Status Impl::Enqueue(Pass& pass) {
  TRIDENT_RETURN_IF_ERROR(EnqueueEmbedding(pass));
  for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
    TRIDENT_RETURN_IF_ERROR(EnqueuePreAttention(pass, l));
    TRIDENT_RETURN_IF_ERROR(EnqueueLocalAttention(pass, l));
    TRIDENT_RETURN_IF_ERROR(EnqueuePostAttention(pass, l));
  }
  TRIDENT_RETURN_IF_ERROR(EnqueueHead(pass));
  // One rank's whole step is a graph capture's (decode steps: the peer
  // kernel sums); the head's barrier ends it.
  return tp.group != nullptr ? EnqueueHeadBarrier() : absl::OkStatus();
}

absl::Status Impl::SendRemote(Pass& pass, int32_t layer) {
  if (pass.remote.empty()) return absl::OkStatus();
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaEventSynchronize(pass.qkv_ready), "remote q/k/v"));
  return pass.remote.Start(layer, DType::kBF16, pass.host_remote_qkv.get(), qkv_width());
}

absl::Status Impl::ReceiveRemote(Pass& pass) {
  if (pass.remote.empty()) return absl::OkStatus();
  return pass.remote.Finish(remote_timeout, DType::kBF16, pass.host_remote_o.get(), q_out(),
                            remote_timing);
}

absl::Status Impl::RunLayers() {
  for (int p = 0; p < num_passes; ++p) TRIDENT_RETURN_IF_ERROR(EnqueueEmbedding(passes[p]));
  Pass& main = passes[0];
  Pass& cpu = passes[1];
  for (int32_t l = 0; l < config.num_hidden_layers; ++l) {
    // Pipelined: the second sub-batch's q/k/v are copied out first, and its
    // requests are answered while the GPU runs the first's whole layer.
    if (num_passes == 2) TRIDENT_RETURN_IF_ERROR(EnqueuePreAttention(cpu, l));
    TRIDENT_RETURN_IF_ERROR(EnqueuePreAttention(main, l));
    TRIDENT_RETURN_IF_ERROR(EnqueueLocalAttention(main, l));
    absl::Status cpu_sent = num_passes == 2 ? SendRemote(cpu, l) : absl::OkStatus();
    absl::Status sent = SendRemote(main, l);
    // Every request sent is waited for, even after a failure.
    absl::Status received = ReceiveRemote(main);
    if (cpu_sent.ok() && sent.ok() && received.ok()) {
      TRIDENT_RETURN_IF_ERROR(EnqueuePostAttention(main, l));
    }
    absl::Status cpu_received = num_passes == 2 ? ReceiveRemote(cpu) : absl::OkStatus();
    for (const absl::Status* status : {&cpu_sent, &sent, &received, &cpu_received}) {
      TRIDENT_RETURN_IF_ERROR(*status);
    }
    if (num_passes == 2) TRIDENT_RETURN_IF_ERROR(EnqueuePostAttention(cpu, l));
  }
  for (int p = 0; p < num_passes; ++p) TRIDENT_RETURN_IF_ERROR(EnqueueHead(passes[p]));
  return absl::OkStatus();
}

GraphMapKey GraphKey(const StepShape& shape) {
  return std::make_tuple(shape.num_seqs, shape.plan.num_splits * 16 + shape.plan.variant,
                         shape.table_stride);
}

int32_t Impl::TableStride(int32_t max_context) const {
  const int32_t bs = kv_spec.block_size;
  const int32_t max_blocks = (max_model_len + bs - 1) / bs;
  return std::min(NextPow2(std::max(1, (max_context + bs - 1) / bs)), max_blocks);
}

StepShape Impl::GraphShape(int32_t padded, int32_t max_context) const {
  StepShape shape;
  shape.total = padded;
  shape.num_seqs = padded;
  shape.local_seqs = padded;
  shape.local_tokens = padded;
  shape.all_decode = true;
  shape.max_query = 1;
  shape.table_stride = TableStride(max_context);
  // Graphs bake the split count in: plan for the context bucket.
  shape.plan = PlanDecode(padded, std::min(NextPow2(max_context), max_model_len));
  shape.head_rows = padded;
  shape.gather = false;
  return shape;
}

absl::Status Impl::CaptureGraphs() {
  if (!options.cuda_graphs) return absl::OkStatus();
  const absl::Time start = absl::Now();
  size_t free_before = 0, free_after = 0, total = 0;
  cudaMemGetInfo(&free_before, &total);
  Pass& pass = passes[0];
  pass.logits_row0 = 0;
  const int32_t max_batch = static_cast<int32_t>(
      std::min<int64_t>({options.graph_max_batch > 0 ? options.graph_max_batch : pass.max_seqs,
                         pass.max_seqs, pass.max_tokens}));
  const int32_t max_context = options.graph_max_context > 0
                                  ? std::min(options.graph_max_context, max_model_len)
                                  : max_model_len;
  int32_t buckets = 0;
  for (int32_t n = 1; n <= max_batch; n = GraphBatch(n) + 1) {
    const int32_t padded = GraphBatch(n);
    if (padded > max_batch) break;
    ++buckets;
    for (int32_t c = 1;; c *= 2) {
      pass.shape = GraphShape(padded, std::min(c, max_context));
      // Shapes that share a graph are captured once (a capture launches
      // nothing: the metadata holds no step).
      if (!graphs.contains(GraphKey(pass.shape))) TRIDENT_RETURN_IF_ERROR(LaunchGraph(pass));
      if (c >= max_context) break;
    }
  }
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "graph warm-up"));
  cudaMemGetInfo(&free_after, &total);
  graphs_sealed = true;
  graph_capture_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  TRIDENT_LOG(INFO) << "captured " << graphs.size() << " decode graphs at start-up (" << buckets
                    << " batch sizes up to " << max_batch << ", contexts up to " << max_context
                    << " tokens) in " << graph_capture_seconds << " s, "
                    << (free_before > free_after ? (free_before - free_after) >> 20 : 0)
                    << " MiB; none is captured while serving" << TuneNote(gemm->tune_stats());
  return absl::OkStatus();
}

absl::Status Impl::LaunchGraph(Pass& pass) {
  const StepShape& shape = pass.shape;
  const GraphMapKey key = GraphKey(shape);
  auto it = graphs.find(key);
  if (it == graphs.end() && graphs_sealed) {
    // No graph for this shape (beyond --cuda_graph_max_batch/_context):
    // launched kernel by kernel, never captured while serving.
    graph_misses.fetch_add(1, std::memory_order_relaxed);
    return Enqueue(pass);
  }
  if (it == graphs.end()) {
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture"));
    const absl::Status enqueued = Enqueue(pass);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    TRIDENT_RETURN_IF_ERROR(enqueued);
    TRIDENT_RETURN_IF_ERROR(CudaCheck(ended, "end capture"));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TRIDENT_RETURN_IF_ERROR(CudaCheck(instantiated, "graph instantiate"));
    it = graphs.emplace(key, exec).first;
    TRIDENT_LOG(DEBUG) << "captured decode graph: batch " << shape.num_seqs << ", "
                       << shape.plan.num_splits << " splits, table stride " << shape.table_stride;
    // Uploaded now, so that its first replay costs no more than the others.
    return CudaCheck(cudaGraphUpload(it->second, stream), "graph upload");
  }
  graph_replays.fetch_add(1, std::memory_order_relaxed);
  return CudaCheck(cudaGraphLaunch(it->second, stream), "graph launch");
}

absl::StatusOr<int64_t> Impl::Run(absl::Span<const StepSequence> batch) {
  if (tp.group != nullptr) return RunTensorParallel(batch);
  TRIDENT_RETURN_IF_ERROR(Split(batch));
  if (passes[0].order.empty()) return int64_t{0};
  bool any_remote = num_passes == 2;
  for (int32_t i : passes[0].order) any_remote = any_remote || batch[i].remote.service != nullptr;
  passes[0].logits_row0 = 0;
  TRIDENT_ASSIGN_OR_RETURN(const bool use_graph, Stage(passes[0], batch, !any_remote));
  if (num_passes == 2) {
    passes[1].logits_row0 = passes[0].shape.head_rows;
    TRIDENT_RETURN_IF_ERROR(Stage(passes[1], batch, /*graphable=*/false).status());
  }
  if (use_graph) {
    TRIDENT_RETURN_IF_ERROR(LaunchGraph(passes[0]));
  } else if (!any_remote) {
    TRIDENT_RETURN_IF_ERROR(Enqueue(passes[0]));
  } else {
    TRIDENT_RETURN_IF_ERROR(RunLayers());
  }
  // A graph's padding rows come after the wanted ones.
  return static_cast<int64_t>(row_origin.size());
}

absl::Status Impl::Forward(absl::Span<const StepSequence> batch, float* logits_out) {
  TRIDENT_ASSIGN_OR_RETURN(const int64_t wanted, Run(batch));
  if (wanted == 0) return CudaCheck(cudaStreamSynchronize(stream), "step");
  const size_t row_bytes = static_cast<size_t>(config.vocab_size) * 4;
  TRIDENT_RETURN_IF_ERROR(
      CudaCheck(cudaMemcpyAsync(host_logits.get(), logits.get(), wanted * row_bytes,
                                cudaMemcpyDeviceToHost, stream),
                "logits"));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "step"));
  for (int64_t r = 0; r < wanted; ++r) {
    std::memcpy(reinterpret_cast<char*>(logits_out) + row_origin[r] * row_bytes,
                host_logits.get<char>() + r * row_bytes, row_bytes);
  }
  return absl::OkStatus();
}

absl::Status Impl::StageSampling(absl::Span<const RowSampling> rows, size_t* in_bytes,
                                 size_t* seen_at, size_t* counts_at) {
  sample_batch.Clear();
  // In the step's row order.
  for (int32_t origin : row_origin) {
    const RowSampling& r = rows[origin];
    sample_batch.Add(*r.params, *r.penalties, r.output_position);
  }
  // Rows, seen tokens and output counts in one pinned block.
  const size_t rows_bytes = sample_batch.rows().size() * sizeof(kc::SamplingRow);
  const size_t seen_bytes = sample_batch.seen_tokens().size() * sizeof(int32_t);
  const size_t counts_bytes = sample_batch.output_counts().size() * sizeof(kc::SamplingTokenCount);
  *seen_at = (rows_bytes + 15) / 16 * 16;
  *counts_at = (*seen_at + seen_bytes + 15) / 16 * 16;
  *in_bytes = std::max<size_t>(*counts_at + counts_bytes, 16);
  if (*in_bytes > host_sample_in.bytes()) {
    const size_t capacity = std::max(*in_bytes * 2, size_t{1} << 20);
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaStreamSynchronize(stream), "step"));
    TRIDENT_RETURN_IF_ERROR(host_sample_in.Allocate(capacity, "sampler inputs"));
    TRIDENT_RETURN_IF_ERROR(sample_in.Allocate(capacity, "sampler inputs"));
  }
  char* hin = host_sample_in.get<char>();
  std::memcpy(hin, sample_batch.rows().data(), rows_bytes);
  std::memcpy(hin + *seen_at, sample_batch.seen_tokens().data(), seen_bytes);
  std::memcpy(hin + *counts_at, sample_batch.output_counts().data(), counts_bytes);
  return absl::OkStatus();
}

absl::Status Impl::ForwardSample(absl::Span<const StepSequence> batch,
                                 absl::Span<const RowSampling> rows,
                                 absl::Span<sampling::SampledToken> out) {
  size_t wanted_rows = 0;
  for (const StepSequence& s : batch) wanted_rows += s.want_logits ? 1 : 0;
  if (rows.size() != wanted_rows || out.size() != wanted_rows) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardSample: ", rows.size(),
                                                   " row parameters and ", out.size(),
                                                   " outputs for ", wanted_rows, " wanted rows"));
  }
  TRIDENT_ASSIGN_OR_RETURN(const int64_t wanted, Run(batch));
  if (wanted == 0) return CudaCheck(cudaStreamSynchronize(stream), "step");
  // Staged while the step runs (the last step's sampler inputs were copied
  // before it ended).
  size_t in_bytes = 0, seen_at = 0, counts_at = 0;
  TRIDENT_RETURN_IF_ERROR(StageSampling(rows, &in_bytes, &seen_at, &counts_at));
  TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMemcpyAsync(sample_in.get(), host_sample_in.get(), in_bytes,
                                                    cudaMemcpyHostToDevice, stream),
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
  a.seen_tokens = !sample_batch.seen_tokens().empty()
                      ? reinterpret_cast<const int32_t*>(sample_in.get<char>() + seen_at)
                      : nullptr;
  a.output_counts =
      !sample_batch.output_counts().empty()
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
  a.greedy_only = sample_batch.greedy_only();
  TRIDENT_RETURN_IF_ERROR(kc::LaunchSample(a, stream));
  // Tokens and logprobs; the top lists only when asked for.
  char* hout = host_sample_out.get<char>();
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
    const size_t origin = static_cast<size_t>(row_origin[r]);
    sampling::SampledToken& t = out[origin];
    const sampling::SamplingParams& p = *rows[origin].params;
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

}  // namespace trident::backend::cuda_internal
