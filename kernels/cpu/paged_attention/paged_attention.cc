#include "kernels/cpu/paged_attention/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cpu/target_clones.h"
#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {
namespace {

using numeric::DType;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Rows (query token x q head of one kv head) per work item: enough to reuse
// each converted K/V block many times, few enough to stay in L1/L2.
constexpr int32_t kRowsPerTile = 32;
// Split-K: a context chunk is at least this many tokens, so that merging
// partial results stays cheap next to the chunk's own work.
constexpr int32_t kMinSplitTokens = 512;
// AppendKv: below this many tokens a parallel region costs more than it saves.
constexpr int64_t kMinParallelAppendTokens = 64;

// e^x for x <= 0 in fp32, vectorizable: Cephes' expf polynomial after
// reduction by ln 2 (about 1 ulp); x below -87 gives ~0 instead of a denormal.
inline float ExpNonPositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

TRIDENT_TARGET_CLONES void WidenBf16(
    const uint16_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    dst[i] = f;
  }
}

// The running softmax state of `num_rows` query rows (one q head of one query
// token each), updated with `num_tokens` consecutive cached tokens starting at
// position `first_pos`; row r sees only positions <= row_pos[r].
struct Rows {
  const float* q;      // [num_rows][head_dim]
  const int32_t* pos;  // [num_rows]
  float* max;          // [num_rows], running max of scores
  float* sum;          // [num_rows], running sum of e^(score - max)
  float* acc;          // [num_rows][head_dim], running sum of e^(score - max) * v
  int32_t num_rows;
};

// Four tokens per pass: four independent dot-product chains (QK) and a quarter
// of the accumulator loads and stores (PV); measured 2-3x over one at a time.
TRIDENT_TARGET_CLONES void AttendChunk(
    const Rows& rows, const float* k, const float* v, int32_t num_tokens, int32_t first_pos,
    int32_t head_dim, float scale, float* scores) {
  const int64_t d = head_dim;
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const int32_t valid = std::min(num_tokens, rows.pos[r] - first_pos + 1);
    if (valid <= 0) continue;
    const float* q = rows.q + r * d;
    int32_t t = 0;
    for (; t + 4 <= valid; t += 4) {
      const float* k0 = k + t * d;
      const float* k1 = k0 + d;
      const float* k2 = k1 + d;
      const float* k3 = k2 + d;
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t i = 0; i < d; ++i) {
        s0 += q[i] * k0[i];
        s1 += q[i] * k1[i];
        s2 += q[i] * k2[i];
        s3 += q[i] * k3[i];
      }
      scores[t] = s0 * scale;
      scores[t + 1] = s1 * scale;
      scores[t + 2] = s2 * scale;
      scores[t + 3] = s3 * scale;
    }
    for (; t < valid; ++t) {
      const float* kt = k + t * d;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i < d; ++i) dot += q[i] * kt[i];
      scores[t] = dot * scale;
    }
    float chunk_max = kNegInf;
    for (t = 0; t < valid; ++t) chunk_max = std::max(chunk_max, scores[t]);
    const float old_max = rows.max[r];
    const float new_max = std::max(old_max, chunk_max);
    const float correction = old_max == kNegInf ? 0.0f : ExpNonPositive(old_max - new_max);
    float chunk_sum = 0.0f;
#pragma omp simd reduction(+ : chunk_sum)
    for (int32_t j = 0; j < valid; ++j) {
      scores[j] = ExpNonPositive(scores[j] - new_max);
      chunk_sum += scores[j];
    }
    rows.max[r] = new_max;
    rows.sum[r] = rows.sum[r] * correction + chunk_sum;
    float* acc = rows.acc + r * d;
    if (correction != 1.0f) {
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) acc[i] *= correction;
    }
    for (t = 0; t + 4 <= valid; t += 4) {
      const float p0 = scores[t], p1 = scores[t + 1], p2 = scores[t + 2], p3 = scores[t + 3];
      const float* v0 = v + t * d;
      const float* v1 = v0 + d;
      const float* v2 = v1 + d;
      const float* v3 = v2 + d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) acc[i] += p0 * v0[i] + p1 * v1[i] + p2 * v2[i] + p3 * v3[i];
    }
    for (; t < valid; ++t) {
      const float p = scores[t];
      const float* vt = v + t * d;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) acc[i] += p * vt[i];
    }
  }
}

// One unit of parallel work: query tokens [token_begin, token_end) of one
// sequence, all q heads of kv head `kv_head`, against cached positions
// [kv_begin, kv_end).
struct WorkItem {
  int32_t seq;
  int32_t kv_head;
  int32_t token_begin;
  int32_t token_end;
  int32_t kv_begin;
  int32_t kv_end;
  int32_t num_splits;  // Items sharing this (seq, kv_head, tokens); 1 = no split.
  int64_t partial;     // With splits: offset of this item's partial state.
};

// Per-thread buffers, sized for the largest tile.
struct Scratch {
  std::vector<float> q, max, sum, acc, scores, k, v;
  std::vector<int32_t> pos;
};

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

void RunItem(const PagedKv& kv, const float* q, int64_t q_stride, int32_t group,
             const AttentionSequence& seq, const WorkItem& item, float scale, float* out,
             int64_t out_stride, float* partials, Scratch& s) {
  const int32_t d = kv.head_dim;
  const int32_t bs = kv.block_size;
  const int32_t num_tokens = item.token_end - item.token_begin;
  const int32_t num_rows = num_tokens * group;
  const int32_t first_query_pos = seq.context_len - seq.query_len;
  for (int32_t j = 0; j < num_tokens; ++j) {
    const int64_t row = seq.query_row + item.token_begin + j;
    for (int32_t h = 0; h < group; ++h) {
      const int32_t r = j * group + h;
      std::memcpy(&s.q[static_cast<int64_t>(r) * d],
                  q + row * q_stride + static_cast<int64_t>(item.kv_head * group + h) * d,
                  sizeof(float) * d);
      s.pos[r] = first_query_pos + item.token_begin + j;
    }
  }
  std::fill_n(s.max.begin(), num_rows, kNegInf);
  std::fill_n(s.sum.begin(), num_rows, 0.0f);
  std::fill_n(s.acc.begin(), static_cast<int64_t>(num_rows) * d, 0.0f);
  const Rows rows{s.q.data(), s.pos.data(), s.max.data(), s.sum.data(), s.acc.data(), num_rows};

  // Causal: nothing past the last query token's position.
  const int32_t kv_end = std::min(item.kv_end, first_query_pos + item.token_end);
  const int64_t head_offset = static_cast<int64_t>(item.kv_head) * bs * d;
  const int64_t elem_size = static_cast<int64_t>(numeric::ElementSize(kv.dtype));
  for (int32_t begin = item.kv_begin; begin < kv_end;) {
    const int32_t logical = begin / bs;
    const int32_t offset = begin % bs;
    const int32_t n = std::min(bs - offset, kv_end - begin);
    const int64_t k_elem = static_cast<int64_t>(seq.block_table[logical]) * kv.block_stride_elems +
                           head_offset + static_cast<int64_t>(offset) * d;
    const int64_t v_elem = k_elem + kv.value_offset_elems;
    const float* k;
    const float* v;
    if (kv.dtype == DType::kF32) {
      k = static_cast<const float*>(kv.base) + k_elem;
      v = static_cast<const float*>(kv.base) + v_elem;
    } else {
      const uint16_t* base = static_cast<const uint16_t*>(kv.base);
      WidenBf16(base + k_elem, s.k.data(), static_cast<int64_t>(n) * d);
      WidenBf16(base + v_elem, s.v.data(), static_cast<int64_t>(n) * d);
      k = s.k.data();
      v = s.v.data();
    }
    const int32_t next = begin + n;
    if (next < kv_end) {
      // Blocks are scattered, so the hardware prefetcher cannot see the next
      // one coming; ask for it while this one is computed.
      const int64_t next_k =
          static_cast<int64_t>(seq.block_table[next / bs]) * kv.block_stride_elems + head_offset +
          static_cast<int64_t>(next % bs) * d;
      const int64_t bytes = static_cast<int64_t>(std::min(bs, kv_end - next)) * d * elem_size;
      const char* next_k_ptr = static_cast<const char*>(kv.base) + next_k * elem_size;
      const char* next_v_ptr = next_k_ptr + kv.value_offset_elems * elem_size;
      for (int64_t off = 0; off < bytes; off += 64) {
        __builtin_prefetch(next_k_ptr + off);
        __builtin_prefetch(next_v_ptr + off);
      }
    }
    AttendChunk(rows, k, v, n, begin, d, scale, s.scores.data());
    begin = next;
  }

  if (item.num_splits == 1) {
    for (int32_t r = 0; r < num_rows; ++r) {
      const int64_t row = seq.query_row + item.token_begin + r / group;
      float* o =
          out + row * out_stride + static_cast<int64_t>(item.kv_head * group + r % group) * d;
      const float inv = 1.0f / s.sum[r];
      const float* acc = &s.acc[static_cast<int64_t>(r) * d];
      for (int32_t i = 0; i < d; ++i) o[i] = acc[i] * inv;
    }
    return;
  }
  // Partial state per row: max, sum, acc[d].
  float* p = partials + item.partial;
  for (int32_t r = 0; r < num_rows; ++r) {
    float* pr = p + static_cast<int64_t>(r) * (d + 2);
    pr[0] = s.max[r];
    pr[1] = s.sum[r];
    std::memcpy(pr + 2, &s.acc[static_cast<int64_t>(r) * d], sizeof(float) * d);
  }
}

// Combines the partial states of the `item.num_splits` items starting at `item`.
void MergeSplits(const WorkItem* first, int32_t group, int32_t d, const AttentionSequence& seq,
                 const float* partials, float* out, int64_t out_stride) {
  const int32_t num_rows = (first->token_end - first->token_begin) * group;
  const int64_t row_size = d + 2;
  for (int32_t r = 0; r < num_rows; ++r) {
    float global_max = kNegInf;
    for (int32_t i = 0; i < first->num_splits; ++i) {
      global_max = std::max(global_max, partials[first[i].partial + r * row_size]);
    }
    const int64_t row = seq.query_row + first->token_begin + r / group;
    float* o =
        out + row * out_stride + static_cast<int64_t>(first->kv_head * group + r % group) * d;
    std::fill_n(o, d, 0.0f);
    float total = 0.0f;
    for (int32_t i = 0; i < first->num_splits; ++i) {
      const float* pr = partials + first[i].partial + r * row_size;
      if (pr[0] == kNegInf) continue;  // The chunk lies wholly after this row.
      const float w = std::exp(pr[0] - global_max);
      total += w * pr[1];
      for (int32_t k = 0; k < d; ++k) o[k] += w * pr[2 + k];
    }
    const float inv = 1.0f / total;
    for (int32_t k = 0; k < d; ++k) o[k] *= inv;
  }
}

}  // namespace

absl::Status ValidatePagedKv(const PagedKv& kv) {
  if (kv.base == nullptr) return absl::InvalidArgumentError("PagedKv: base is null");
  if (kv.dtype != DType::kF32 && kv.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedKv: dtype ", numeric::DTypeName(kv.dtype), " is not f32 or bf16"));
  }
  if (kv.block_size <= 0 || kv.num_kv_heads <= 0 || kv.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedKv: block_size ", kv.block_size, ", num_kv_heads ", kv.num_kv_heads,
                     " and head_dim ", kv.head_dim, " must be positive"));
  }
  const int64_t half = static_cast<int64_t>(kv.num_kv_heads) * kv.block_size * kv.head_dim;
  if (kv.value_offset_elems < half) {
    return absl::InvalidArgumentError(absl::StrCat("PagedKv: value_offset_elems ",
                                                   kv.value_offset_elems, " is less than the ",
                                                   half, " elements of a block's keys"));
  }
  if (kv.block_stride_elems < kv.value_offset_elems + half) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedKv: block_stride_elems ", kv.block_stride_elems,
        " is less than value_offset_elems + the ", half, " elements of a block's values"));
  }
  return absl::OkStatus();
}

void AppendKv(const PagedKv& kv, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
              const int64_t* slots, int64_t num_tokens) {
  const int32_t d = kv.head_dim;
#pragma omp parallel for schedule(static) if (num_tokens >= kMinParallelAppendTokens)
  for (int64_t i = 0; i < num_tokens; ++i) {
    const int64_t slot = slots[i];
    if (slot < 0) continue;
    const int64_t block_elem = (slot / kv.block_size) * kv.block_stride_elems;
    const int64_t offset = slot % kv.block_size;
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const int64_t k_elem = block_elem + (static_cast<int64_t>(h) * kv.block_size + offset) * d;
      const int64_t v_elem = k_elem + kv.value_offset_elems;
      const float* k_src = k + i * k_stride + static_cast<int64_t>(h) * d;
      const float* v_src = v + i * v_stride + static_cast<int64_t>(h) * d;
      if (kv.dtype == DType::kF32) {
        std::memcpy(static_cast<float*>(kv.base) + k_elem, k_src, sizeof(float) * d);
        std::memcpy(static_cast<float*>(kv.base) + v_elem, v_src, sizeof(float) * d);
      } else {
        numeric::FloatToBf16(k_src, static_cast<uint16_t*>(kv.base) + k_elem, d);
        numeric::FloatToBf16(v_src, static_cast<uint16_t*>(kv.base) + v_elem, d);
      }
    }
  }
}

void PagedAttention(const PagedKv& kv, const float* q, int64_t q_stride, int32_t num_q_heads,
                    absl::Span<const AttentionSequence> seqs, float scale, float* out,
                    int64_t out_stride) {
  const int32_t group = num_q_heads / kv.num_kv_heads;
  const int32_t d = kv.head_dim;
  const int32_t tokens_per_tile = std::max(1, kRowsPerTile / group);

  // Items without splitting: (sequence, kv head, query tile).
  std::vector<WorkItem> items;
  int64_t longest_context = 0;
  for (int32_t s = 0; s < static_cast<int32_t>(seqs.size()); ++s) {
    longest_context = std::max<int64_t>(longest_context, seqs[s].context_len);
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      for (int32_t t = 0; t < seqs[s].query_len; t += tokens_per_tile) {
        items.push_back(WorkItem{s, h, t, std::min(seqs[s].query_len, t + tokens_per_tile), 0,
                                 seqs[s].context_len, 1, 0});
      }
    }
  }
  if (items.empty()) return;

  // Too few items to occupy every thread twice over (small decode batches):
  // split each context into chunks, merged afterwards.
  const int32_t num_threads = omp_get_max_threads();
  const int64_t wanted = 2 * static_cast<int64_t>(num_threads);
  std::vector<float> partials;
  if (static_cast<int64_t>(items.size()) < wanted && longest_context >= 2 * kMinSplitTokens) {
    const int32_t max_splits = static_cast<int32_t>((wanted + items.size() - 1) / items.size());
    std::vector<WorkItem> split_items;
    int64_t partial_floats = 0;
    for (const WorkItem& item : items) {
      const int32_t context = seqs[item.seq].context_len;
      const int32_t splits = std::clamp(context / kMinSplitTokens, 1, max_splits);
      // Chunk boundaries on block boundaries.
      const int32_t chunk = CeilDiv(CeilDiv(context, splits), kv.block_size) * kv.block_size;
      const int32_t actual = CeilDiv(context, chunk);
      const int64_t rows = static_cast<int64_t>(item.token_end - item.token_begin) * group;
      for (int32_t i = 0; i < actual; ++i) {
        WorkItem split = item;
        split.kv_begin = i * chunk;
        split.kv_end = std::min(context, (i + 1) * chunk);
        split.num_splits = actual;
        split.partial = partial_floats;
        if (actual > 1) partial_floats += rows * (d + 2);
        split_items.push_back(split);
      }
    }
    items = std::move(split_items);
    partials.resize(partial_floats);
  }

  const int64_t max_rows = static_cast<int64_t>(tokens_per_tile) * group;
#pragma omp parallel
  {
    Scratch scratch;
    scratch.q.resize(max_rows * d);
    scratch.pos.resize(max_rows);
    scratch.max.resize(max_rows);
    scratch.sum.resize(max_rows);
    scratch.acc.resize(max_rows * d);
    scratch.scores.resize(kv.block_size);
    if (kv.dtype == DType::kBF16) {
      scratch.k.resize(static_cast<int64_t>(kv.block_size) * d);
      scratch.v.resize(static_cast<int64_t>(kv.block_size) * d);
    }
#pragma omp for schedule(dynamic, 1)
    for (size_t i = 0; i < items.size(); ++i) {
      RunItem(kv, q, q_stride, group, seqs[items[i].seq], items[i], scale, out, out_stride,
              partials.data(), scratch);
    }
    if (!partials.empty()) {
#pragma omp for schedule(dynamic, 1)
      for (size_t i = 0; i < items.size(); ++i) {
        // The first item of each split group merges the group.
        if (items[i].num_splits > 1 && items[i].kv_begin == 0) {
          MergeSplits(&items[i], group, d, seqs[items[i].seq], partials.data(), out, out_stride);
        }
      }
    }
  }
}

}  // namespace trident::kernels::cpu
