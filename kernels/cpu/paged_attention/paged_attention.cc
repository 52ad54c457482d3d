#include "kernels/cpu/paged_attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace trident::kernels::cpu {
namespace {

using numeric::DType;

constexpr int32_t kQueryTile = 16;

inline const float* RowAsFloat(const PagedKv& kv, const void* block_base, int32_t head,
                               int32_t token, float* scratch) {
  const int64_t offset = (static_cast<int64_t>(head) * kv.block_size + token) * kv.head_dim;
  if (kv.dtype == DType::kF32) return static_cast<const float*>(block_base) + offset;
  const uint16_t* src = static_cast<const uint16_t*>(block_base) + offset;
  for (int32_t d = 0; d < kv.head_dim; ++d) scratch[d] = numeric::Bf16ToFloat(src[d]);
  return scratch;
}

inline const char* BlockBase(const PagedKv& kv, int32_t block) {
  return static_cast<const char*>(kv.base) +
         static_cast<int64_t>(block) * kv.block_stride_elems * numeric::ElementSize(kv.dtype);
}

struct Task {
  int32_t seq;
  int32_t kv_head;
  int32_t first_query;  // Index within the sequence's query tokens.
  int32_t num_queries;
};

}  // namespace

void AppendKv(const PagedKv& kv, const float* k, int64_t k_stride, const float* v,
              int64_t v_stride, const int64_t* slots, int64_t num_tokens) {
  const size_t elem = numeric::ElementSize(kv.dtype);
#pragma omp parallel for schedule(static) if (num_tokens > 64)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t block = slots[t] / kv.block_size;
    const int32_t offset = static_cast<int32_t>(slots[t] % kv.block_size);
    char* kbase = static_cast<char*>(kv.base) + block * kv.block_stride_elems * elem;
    char* vbase = kbase + kv.value_offset_elems * elem;
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const int64_t dst = (static_cast<int64_t>(h) * kv.block_size + offset) * kv.head_dim;
      const float* ksrc = k + t * k_stride + static_cast<int64_t>(h) * kv.head_dim;
      const float* vsrc = v + t * v_stride + static_cast<int64_t>(h) * kv.head_dim;
      if (kv.dtype == DType::kF32) {
        std::copy(ksrc, ksrc + kv.head_dim, reinterpret_cast<float*>(kbase) + dst);
        std::copy(vsrc, vsrc + kv.head_dim, reinterpret_cast<float*>(vbase) + dst);
      } else {
        numeric::FloatToBf16(ksrc, reinterpret_cast<uint16_t*>(kbase) + dst, kv.head_dim);
        numeric::FloatToBf16(vsrc, reinterpret_cast<uint16_t*>(vbase) + dst, kv.head_dim);
      }
    }
  }
}

void PagedAttention(const PagedKv& kv, const float* q, int64_t q_stride, int32_t num_q_heads,
                    absl::Span<const AttentionSequence> seqs, float scale, float* out,
                    int64_t out_stride) {
  const int32_t group = num_q_heads / kv.num_kv_heads;
  const int32_t d = kv.head_dim;
  const int32_t bs = kv.block_size;
  std::vector<Task> tasks;
  for (int32_t s = 0; s < static_cast<int32_t>(seqs.size()); ++s) {
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      for (int32_t j = 0; j < seqs[s].query_len; j += kQueryTile) {
        tasks.push_back({s, h, j, std::min(kQueryTile, seqs[s].query_len - j)});
      }
    }
  }
  const size_t elem = numeric::ElementSize(kv.dtype);
#pragma omp parallel
  {
    // Per (query, head-in-group): running max, running sum, accumulator.
    std::vector<float> m(kQueryTile * group), l(kQueryTile * group);
    std::vector<float> acc(static_cast<size_t>(kQueryTile) * group * d);
    std::vector<float> kbuf(d), vbuf(d);
    std::vector<float> scores(static_cast<size_t>(kQueryTile) * group * bs);
#pragma omp for schedule(dynamic)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const Task& task = tasks[ti];
      const AttentionSequence& seq = seqs[task.seq];
      const int32_t first_pos = seq.context_len - seq.query_len + task.first_query;
      const int32_t last_pos = first_pos + task.num_queries - 1;
      const int32_t rows = task.num_queries * group;
      std::fill(m.begin(), m.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.begin() + rows, 0.0f);
      std::fill(acc.begin(), acc.begin() + static_cast<size_t>(rows) * d, 0.0f);
      const int32_t num_blocks = last_pos / bs + 1;
      for (int32_t bi = 0; bi < num_blocks; ++bi) {
        const char* kblock = BlockBase(kv, seq.block_table[bi]);
        const char* vblock = kblock + kv.value_offset_elems * elem;
        const int32_t start = bi * bs;
        const int32_t tokens = std::min(bs, last_pos + 1 - start);
        // Scores of every (query, head) against this block's tokens.
        for (int32_t t = 0; t < tokens; ++t) {
          const float* krow = RowAsFloat(kv, kblock, task.kv_head, t, kbuf.data());
          for (int32_t qi = 0; qi < task.num_queries; ++qi) {
            const int64_t row = seq.query_row + task.first_query + qi;
            for (int32_t g = 0; g < group; ++g) {
              const float* qrow =
                  q + row * q_stride + static_cast<int64_t>(task.kv_head * group + g) * d;
              float dot = 0;
#pragma omp simd reduction(+ : dot)
              for (int32_t x = 0; x < d; ++x) dot += qrow[x] * krow[x];
              scores[(static_cast<size_t>(qi) * group + g) * bs + t] = dot * scale;
            }
          }
        }
        // Online softmax update, then accumulate V.
        for (int32_t qi = 0; qi < task.num_queries; ++qi) {
          const int32_t visible = std::min(tokens, first_pos + qi + 1 - start);
          if (visible <= 0) continue;
          for (int32_t g = 0; g < group; ++g) {
            const int32_t r = qi * group + g;
            float* sc = &scores[static_cast<size_t>(r) * bs];
            float block_max = sc[0];
            for (int32_t t = 1; t < visible; ++t) block_max = std::max(block_max, sc[t]);
            const float new_max = std::max(m[r], block_max);
            const float correction = std::exp(m[r] - new_max);
            float* a = &acc[static_cast<size_t>(r) * d];
            l[r] *= correction;
            for (int32_t x = 0; x < d; ++x) a[x] *= correction;
            for (int32_t t = 0; t < visible; ++t) {
              sc[t] = std::exp(sc[t] - new_max);
              l[r] += sc[t];
            }
            m[r] = new_max;
          }
        }
        for (int32_t t = 0; t < tokens; ++t) {
          const float* vrow = RowAsFloat(kv, vblock, task.kv_head, t, vbuf.data());
          for (int32_t qi = 0; qi < task.num_queries; ++qi) {
            if (start + t > first_pos + qi) continue;
            for (int32_t g = 0; g < group; ++g) {
              const int32_t r = qi * group + g;
              const float p = scores[static_cast<size_t>(r) * bs + t];
              float* a = &acc[static_cast<size_t>(r) * d];
#pragma omp simd
              for (int32_t x = 0; x < d; ++x) a[x] += p * vrow[x];
            }
          }
        }
      }
      for (int32_t qi = 0; qi < task.num_queries; ++qi) {
        const int64_t row = seq.query_row + task.first_query + qi;
        for (int32_t g = 0; g < group; ++g) {
          const int32_t r = qi * group + g;
          const float inv = 1.0f / l[r];
          float* o = out + row * out_stride + static_cast<int64_t>(task.kv_head * group + g) * d;
          const float* a = &acc[static_cast<size_t>(r) * d];
          for (int32_t x = 0; x < d; ++x) o[x] = a[x] * inv;
        }
      }
    }
  }
}

void PagedAttentionReference(const PagedKv& kv, const float* q, int64_t q_stride,
                             int32_t num_q_heads, absl::Span<const AttentionSequence> seqs,
                             float scale, float* out, int64_t out_stride) {
  const int32_t group = num_q_heads / kv.num_kv_heads;
  const int32_t d = kv.head_dim;
  std::vector<float> buf(d);
  for (const AttentionSequence& seq : seqs) {
    for (int32_t h = 0; h < num_q_heads; ++h) {
      const int32_t kvh = h / group;
      // Gather this head's K and V for the whole context.
      std::vector<std::vector<double>> keys, values;
      for (int32_t pos = 0; pos < seq.context_len; ++pos) {
        const char* kblock = BlockBase(kv, seq.block_table[pos / kv.block_size]);
        const char* vblock = kblock + kv.value_offset_elems * numeric::ElementSize(kv.dtype);
        const float* kr = RowAsFloat(kv, kblock, kvh, pos % kv.block_size, buf.data());
        keys.emplace_back(kr, kr + d);
        const float* vr = RowAsFloat(kv, vblock, kvh, pos % kv.block_size, buf.data());
        values.emplace_back(vr, vr + d);
      }
      for (int32_t j = 0; j < seq.query_len; ++j) {
        const int32_t pos = seq.context_len - seq.query_len + j;
        const float* qr = q + (seq.query_row + j) * q_stride + static_cast<int64_t>(h) * d;
        std::vector<double> s(pos + 1);
        double mx = -1e300;
        for (int32_t t = 0; t <= pos; ++t) {
          double dot = 0;
          for (int32_t x = 0; x < d; ++x) dot += static_cast<double>(qr[x]) * keys[t][x];
          s[t] = dot * scale;
          mx = std::max(mx, s[t]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        float* o = out + (seq.query_row + j) * out_stride + static_cast<int64_t>(h) * d;
        for (int32_t x = 0; x < d; ++x) {
          double a = 0;
          for (int32_t t = 0; t <= pos; ++t) a += s[t] * values[t][x];
          o[x] = static_cast<float>(a / sum);
        }
      }
    }
  }
}

}  // namespace trident::kernels::cpu
