#include <cuda_bf16.h>

#include <cstdint>

#include "common/sampling/philox.h"
#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/sampling/sampling_kernel.h"
#include "kernels/cuda/wgmma/wgmma_device.h"

namespace trident::kernels::cuda::internal {
namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
// Weights lie in [0, 1], so their float bits have bits 31 and 30 clear: the
// radix selects run over the low 30 bits in three 10-bit digits, and each
// level's 1024 bins map one-to-one onto the block's threads for the scans.
constexpr int kRadixBits = 10;
constexpr int kBins = 1 << kRadixBits;
constexpr int kLevels = 3;
// Ordered (ascending id) scans give each thread kItems consecutive ids so the
// workspace is read with 16-byte loads.
constexpr int kItems = 4;
constexpr int kChunk = kThreads * kItems;
constexpr int kMaxTop = 20;
// Logits each thread loads ahead in the first pass over a row.
constexpr int kPassLoads = 8;
constexpr int kNoId = 0x7fffffff;
static_assert(kBins == kThreads);
static_assert(kWarps == 32);

struct Shared {
  // Histograms of weights for the radix selects: [level] for the top_k
  // search (reused by top_p while it follows the same digits), [kLevels] for
  // the top_p search once it leaves them. Masses in fixed point.
  u64 mass[kLevels + 1][kBins];
  unsigned count[kLevels + 1][kBins];
  u64 scratch_u64[kWarps];
  unsigned scratch_u32[kWarps];
  float scratch_f[kWarps];
  float scratch_f2[kWarps];
  int scratch_i[kWarps];
  // Broadcast slots, each written by one thread between barriers.
  int found;
  unsigned found_count;
  unsigned found_above_count;
  u64 found_above_mass;
};

__device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x) & 31; }
__device__ __forceinline__ int Warp() { return static_cast<int>(threadIdx.x) >> 5; }

// NaN compares as -inf, as on the CPU.
__device__ __forceinline__ float Key(float x) { return isnan(x) ? -INFINITY : x; }

__device__ __forceinline__ float Load(const float* row, int i) { return row[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* row, int i) {
  return __bfloat162float(row[i]);
}

// Larger value first, then lower id: the CPU's order for argmax, top_k ties
// and top logprobs.
__device__ __forceinline__ bool Better(float v, int id, float best_v, int best_id) {
  return v > best_v || (v == best_v && id < best_id);
}

struct Best {
  float value;
  int id;
};

__device__ Best WarpBest(Best b) {
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, b.value, o);
    const int id = __shfl_xor_sync(0xffffffffu, b.id, o);
    if (Better(v, id, b.value, b.id)) b = {v, id};
  }
  return b;
}

// Every reduction below starts with a barrier (the scratch may still be read
// by the previous one) and leaves the result in every thread: each warp
// reduces the 32 warp partials itself. Butterfly reductions with commutative
// operations give all lanes the same value, so results are block-uniform.
__device__ Best BlockBest(Best b, Shared& sh) {
  b = WarpBest(b);
  __syncthreads();
  if (Lane() == 0) {
    sh.scratch_f[Warp()] = b.value;
    sh.scratch_i[Warp()] = b.id;
  }
  __syncthreads();
  return WarpBest({sh.scratch_f[Lane()], sh.scratch_i[Lane()]});
}

__device__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ float BlockMax(float v, Shared& sh) {
  v = WarpMax(v);
  __syncthreads();
  if (Lane() == 0) sh.scratch_f[Warp()] = v;
  __syncthreads();
  return WarpMax(sh.scratch_f[Lane()]);
}

template <typename T>
__device__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ u64 BlockSum(u64 v, Shared& sh) {
  v = WarpSum(v);
  __syncthreads();
  if (Lane() == 0) sh.scratch_u64[Warp()] = v;
  __syncthreads();
  return WarpSum(sh.scratch_u64[Lane()]);
}

__device__ unsigned BlockSum(unsigned v, Shared& sh) {
  v = WarpSum(v);
  __syncthreads();
  if (Lane() == 0) sh.scratch_u32[Warp()] = v;
  __syncthreads();
  return WarpSum(sh.scratch_u32[Lane()]);
}

// Running log-sum-exp: max m and sum s of exp(x - m).
struct Lse {
  float m;
  float s;
};

__device__ __forceinline__ void LseAdd(Lse& a, float x) {
  if (x == -INFINITY) return;
  if (x > a.m) {
    a.s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - x)) + 1.0f;
    a.m = x;
  } else {
    a.s += x == a.m ? 1.0f : expf(x - a.m);
  }
}

__device__ __forceinline__ Lse LseMerge(Lse a, Lse b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  const float sa = a.m == m ? a.s : (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m));
  const float sb = b.m == m ? b.s : (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m));
  return {m, sa + sb};
}

__device__ Lse WarpLse(Lse a) {
  for (int o = 16; o > 0; o >>= 1) {
    a = LseMerge(a, {__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)});
  }
  return a;
}

__device__ Lse BlockLse(Lse a, Shared& sh) {
  a = WarpLse(a);
  __syncthreads();
  if (Lane() == 0) {
    sh.scratch_f[Warp()] = a.m;
    sh.scratch_f2[Warp()] = a.s;
  }
  __syncthreads();
  return WarpLse({sh.scratch_f[Lane()], sh.scratch_f2[Lane()]});
}

// Inclusive scan of (count, mass) in thread order; also returns the block
// totals.
__device__ void BlockInclusiveScan(unsigned& c, u64& m, unsigned& total_c, u64& total_m,
                                   Shared& sh) {
  const int lane = Lane();
  const int warp = Warp();
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned uc = __shfl_up_sync(0xffffffffu, c, o);
    const u64 um = __shfl_up_sync(0xffffffffu, m, o);
    if (lane >= o) {
      c += uc;
      m += um;
    }
  }
  __syncthreads();
  if (lane == 31) {
    sh.scratch_u32[warp] = c;
    sh.scratch_u64[warp] = m;
  }
  __syncthreads();
  unsigned wc = sh.scratch_u32[lane];
  u64 wm = sh.scratch_u64[lane];
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned uc = __shfl_up_sync(0xffffffffu, wc, o);
    const u64 um = __shfl_up_sync(0xffffffffu, wm, o);
    if (lane >= o) {
      wc += uc;
      wm += um;
    }
  }
  const unsigned prev_c = __shfl_sync(0xffffffffu, wc, (warp + 31) & 31);
  const u64 prev_m = __shfl_sync(0xffffffffu, wm, (warp + 31) & 31);
  if (warp > 0) {
    c += prev_c;
    m += prev_m;
  }
  total_c = __shfl_sync(0xffffffffu, wc, 31);
  total_m = __shfl_sync(0xffffffffu, wm, 31);
}

// ceil(p * total) exactly, for p in (0, 1).
__device__ u64 CeilMul(float p, u64 total) {
  const unsigned bits = __float_as_uint(p);
  const unsigned biased = (bits >> 23) & 0xffu;
  u64 mantissa = bits & 0x7fffffu;
  int exponent = -149;
  if (biased != 0) {
    mantissa |= 0x800000u;
    exponent = static_cast<int>(biased) - 150;
  }
  const unsigned __int128 product = static_cast<unsigned __int128>(mantissa) * total;
  if (exponent >= 0) return total;  // p >= 1: never called so; keep everything.
  const int shift = -exponent;
  if (shift >= 128) return product != 0 ? 1 : 0;
  unsigned __int128 q = product >> shift;
  if ((q << shift) != product) ++q;
  return static_cast<u64>(q);
}

// Fixed-point weights: w * 2^scale_bits truncated, with scale_bits chosen so
// that a whole row sums below 2^62. Integer sums are exact and associative,
// so every ordering of the block's partial sums gives the same masses and
// the radix levels stay consistent with each other.
struct Fixed {
  float scale;
  __device__ __forceinline__ u64 operator()(float w) const { return __float2ull_rz(w * scale); }
};

struct RadixResult {
  bool found;
  unsigned bits;         // The value found (float bits).
  unsigned above_count;  // Positive weights strictly greater.
  u64 above_mass;        // Their fixed-point mass.
  unsigned eq_count;     // Weights equal to it.
};

enum class RadixMode { kCount, kMass };

__device__ __forceinline__ int DigitShift(int level) { return (kLevels - 1 - level) * kRadixBits; }

// Zeroes histogram `slot` and fills it with the level-`level` digits of the
// positive weights whose higher digits equal `prefix`.
__device__ void BuildHistogram(const float* ws, int vocab, int level, unsigned prefix, int slot,
                               Fixed fixed, Shared& sh) {
  __syncthreads();
  sh.count[slot][threadIdx.x] = 0;
  sh.mass[slot][threadIdx.x] = 0;
  __syncthreads();
  const int shift = DigitShift(level);
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float w = ws[i];
    const unsigned bits = __float_as_uint(w);
    if (w > 0.0f && (bits >> (shift + kRadixBits)) == prefix) {
      const unsigned digit = (bits >> shift) & (kBins - 1);
      atomicAdd(&sh.count[slot][digit], 1u);
      const u64 f = fixed(w);
      if (f != 0) atomicAdd(&sh.mass[slot][digit], f);
    }
  }
  __syncthreads();
}

// Radix select over the positive weights in ws (histogram 0 already holds
// their top digits).
//   kCount: the k-th largest value (threshold = k): above_count < k <=
//           above_count + eq_count.
//   kMass:  the value v at which the mass, accumulated from the largest
//           value down, reaches threshold: above_mass < threshold <=
//           above_mass + eq_count * v. With `floor_bits` > 0 only values >=
//           floor_bits count, and histograms 1 and 2 are those a kCount search
//           for floor_bits left behind (reused while the digits agree); then
//           not found means even all of them stay below threshold.
// kCount fills histograms 1 and 2; kMass builds fresh ones in slot kLevels.
__device__ RadixResult RadixSearch(RadixMode mode, u64 threshold, unsigned floor_bits,
                                   const float* ws, int vocab, Fixed fixed, Shared& sh) {
  unsigned prefix = 0;
  unsigned carry_count = 0;
  u64 carry_mass = 0;
  bool on_floor_path = floor_bits != 0;
  for (int level = 0; level < kLevels; ++level) {
    int slot = 0;
    if (level > 0) {
      if (mode == RadixMode::kCount) {
        slot = level;
        BuildHistogram(ws, vocab, level, prefix, slot, fixed, sh);
      } else if (on_floor_path) {
        slot = level;
      } else {
        slot = kLevels;
        BuildHistogram(ws, vocab, level, prefix, slot, fixed, sh);
      }
    }
    const int shift = DigitShift(level);
    const int floor_digit =
        on_floor_path ? static_cast<int>((floor_bits >> shift) & (kBins - 1)) : 0;
    // Thread t looks at bin kBins - 1 - t, so the scan runs from the largest
    // values down.
    const int bin = kBins - 1 - static_cast<int>(threadIdx.x);
    const unsigned own_c = sh.count[slot][bin];
    const u64 own_m = sh.mass[slot][bin];
    unsigned c = own_c;
    u64 m = own_m;
    unsigned total_c;
    u64 total_m;
    __syncthreads();
    if (threadIdx.x == 0) sh.found = -1;
    BlockInclusiveScan(c, m, total_c, total_m, sh);
    const unsigned above_c = carry_count + (c - own_c);
    const u64 above_m = carry_mass + (m - own_m);
    bool crossing;
    if (mode == RadixMode::kCount) {
      crossing = own_c > 0 && above_c < threshold && above_c + own_c >= threshold;
    } else {
      crossing = bin >= floor_digit && above_m < threshold && above_m + own_m >= threshold;
    }
    if (crossing) {
      sh.found = bin;
      sh.found_count = own_c;
      sh.found_above_count = above_c;
      sh.found_above_mass = above_m;
    }
    __syncthreads();
    const int found = sh.found;
    if (found < 0) return {false, 0, 0, 0, 0};
    carry_count = sh.found_above_count;
    carry_mass = sh.found_above_mass;
    prefix = (prefix << kRadixBits) | static_cast<unsigned>(found);
    on_floor_path = on_floor_path && found == floor_digit;
    if (level == kLevels - 1) return {true, prefix, carry_count, carry_mass, sh.found_count};
  }
  return {false, 0, 0, 0, 0};  // Unreachable.
}

// The id of the `rank`-th (1-based) weight whose bits are `bits`, in
// ascending id order; kNoId if there are fewer.
__device__ int FindTieBoundary(const float* ws, int vocab, unsigned bits, unsigned rank,
                               Shared& sh) {
  __syncthreads();
  if (threadIdx.x == 0) sh.found = -1;
  unsigned carry = 0;
  for (int base = 0; base < vocab; base += kChunk) {
    const int first = base + static_cast<int>(threadIdx.x) * kItems;
    float w[kItems] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (first < vocab) {
      const float4 v = *reinterpret_cast<const float4*>(ws + first);
      w[0] = v.x;
      w[1] = v.y;
      w[2] = v.z;
      w[3] = v.w;
    }
    unsigned local = 0;
    for (int k = 0; k < kItems; ++k) {
      local += (first + k < vocab && __float_as_uint(w[k]) == bits) ? 1u : 0u;
    }
    unsigned c = local;
    u64 unused = 0;
    unsigned total_c;
    u64 total_m;
    BlockInclusiveScan(c, unused, total_c, total_m, sh);
    unsigned seen = carry + c - local;
    if (seen < rank && seen + local >= rank) {
      for (int k = 0; k < kItems; ++k) {
        if (first + k < vocab && __float_as_uint(w[k]) == bits && ++seen == rank) {
          sh.found = first + k;
          break;
        }
      }
    }
    __syncthreads();
    if (sh.found >= 0) return sh.found;
    carry += total_c;
  }
  return kNoId;
}

// What survives top_k, top_p and min_p: either the weights >= min_p, or the
// weights above `cut_bits` plus the ties at it with id <= tie_last_id, or
// every positive weight.
struct Kept {
  bool by_min_p;
  bool by_cut;
  float min_p;
  unsigned cut_bits;
  int tie_last_id;

  __device__ __forceinline__ bool operator()(float w, int id) const {
    if (!(w > 0.0f)) return false;
    if (by_min_p) return w >= min_p;
    if (!by_cut) return true;
    const unsigned bits = __float_as_uint(w);
    return bits > cut_bits || (bits == cut_bits && id <= tie_last_id);
  }
};

// The first kept id, in ascending id order, whose running fixed-point mass
// exceeds `target`.
__device__ int Walk(const float* ws, int vocab, Kept kept, Fixed fixed, u64 target, Shared& sh) {
  __syncthreads();
  if (threadIdx.x == 0) sh.found = -1;
  u64 carry = 0;
  for (int base = 0; base < vocab; base += kChunk) {
    const int first = base + static_cast<int>(threadIdx.x) * kItems;
    u64 f[kItems] = {0, 0, 0, 0};
    if (first < vocab) {
      const float4 v = *reinterpret_cast<const float4*>(ws + first);
      const float w[kItems] = {v.x, v.y, v.z, v.w};
      for (int k = 0; k < kItems; ++k) {
        if (first + k < vocab && kept(w[k], first + k)) f[k] = fixed(w[k]);
      }
    }
    const u64 local = f[0] + f[1] + f[2] + f[3];
    unsigned unused = 0;
    u64 m = local;
    unsigned total_c;
    u64 total_m;
    BlockInclusiveScan(unused, m, total_c, total_m, sh);
    u64 cumulative = carry + m - local;
    if (cumulative <= target && cumulative + local > target) {
      for (int k = 0; k < kItems; ++k) {
        cumulative += f[k];
        if (cumulative > target) {
          sh.found = first + k;
          break;
        }
      }
    }
    __syncthreads();
    if (sh.found >= 0) return sh.found;
    carry += total_m;
  }
  return -1;
}

// Steps 4-8 of the CPU pipeline for a row whose penalized, NaN-free scaled
// logits have maximum `max_scaled` (> -inf). Returns the sampled id
// (block-uniform). Leaves the weights in ws.
template <typename T>
__device__ int SampleFromWeights(const T* logits, float* ws, const unsigned* bitmap, bool patched,
                                 const SamplingRow& p, int vocab, float max_scaled, Shared& sh) {
  const int log2_vocab = vocab > 1 ? 32 - __clz(vocab - 1) : 0;
  const Fixed fixed{ldexpf(1.0f, 62 - log2_vocab)};
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool top_p = p.top_p < 1.0f;
  if (top_k || top_p) {
    __syncthreads();
    sh.count[0][threadIdx.x] = 0;
    sh.mass[0][threadIdx.x] = 0;
    __syncthreads();
  }

  // Step 4, with the totals and the first radix level of every search.
  u64 total = 0;
  u64 min_p_mass = 0;
  unsigned positives = 0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const bool is_patched = patched && ((bitmap[i >> 5] >> (i & 31)) & 1u);
    const float x = Key(is_patched ? ws[i] : Load(logits, i));
    const float s = __fdiv_rn(x, p.temperature);
    // Equality first: at +inf, inf - inf would be NaN.
    const float w = s == max_scaled ? 1.0f : expf(__fsub_rn(s, max_scaled));
    ws[i] = w;
    if (w > 0.0f) {
      const u64 f = fixed(w);
      total += f;
      ++positives;
      if (w >= p.min_p) min_p_mass += f;
      if (top_k || top_p) {
        const unsigned digit = __float_as_uint(w) >> DigitShift(0);
        atomicAdd(&sh.count[0][digit], 1u);
        if (f != 0) atomicAdd(&sh.mass[0][digit], f);
      }
    }
  }
  total = BlockSum(total, sh);
  min_p_mass = BlockSum(min_p_mass, sh);
  positives = BlockSum(positives, sh);

  // Steps 5 and 6 keep a prefix of the order (weight descending, id
  // ascending): the weights above cut_bits and the first cut_ties (by id) of
  // the weights equal to it.
  bool cut = false;
  unsigned cut_bits = 0;
  u64 cut_above_mass = 0;
  unsigned cut_eq_count = 0;
  unsigned cut_ties = 0;
  const bool top_k_cuts = top_k && positives > static_cast<unsigned>(p.top_k);
  if (top_k_cuts) {
    const RadixResult r =
        RadixSearch(RadixMode::kCount, static_cast<u64>(p.top_k), 0, ws, vocab, fixed, sh);
    if (r.found) {
      cut = true;
      cut_bits = r.bits;
      cut_above_mass = r.above_mass;
      cut_eq_count = r.eq_count;
      cut_ties = static_cast<unsigned>(p.top_k) - r.above_count;
    }
  }
  if (top_p) {
    const u64 kept_total =
        cut ? cut_above_mass + u64{cut_ties} * fixed(__uint_as_float(cut_bits)) : total;
    const u64 target = CeilMul(p.top_p, kept_total);
    const RadixResult r =
        RadixSearch(RadixMode::kMass, target, cut ? cut_bits : 0u, ws, vocab, fixed, sh);
    if (r.found) {
      // The cut falls inside the ties at r.bits: keep the i-th of them (from
      // 0) while above_mass + i * v < target.
      const u64 v = fixed(__uint_as_float(r.bits));
      const u64 needed = (target - r.above_mass + v - 1) / v;
      const unsigned available = (cut && r.bits == cut_bits) ? cut_ties : r.eq_count;
      cut_ties = needed < available ? static_cast<unsigned>(needed) : available;
      cut_bits = r.bits;
      cut_above_mass = r.above_mass;
      cut_eq_count = r.eq_count;
      cut = true;
    }
    // Not found: top_p keeps all of top_k's survivors.
  }

  // Step 7: min_p (the top weight is 1) either removes nothing the cut kept
  // or is stricter than the cut, and then alone decides.
  Kept kept{false, cut, p.min_p, cut_bits, kNoId};
  u64 kept_total = total;
  if (p.min_p > 0.0f && (!cut || p.min_p > __uint_as_float(cut_bits))) {
    kept.by_min_p = true;
    kept_total = min_p_mass;
  } else if (cut) {
    kept_total = cut_above_mass + u64{cut_ties} * fixed(__uint_as_float(cut_bits));
    if (cut_ties < cut_eq_count) {
      kept.tie_last_id = FindTieBoundary(ws, vocab, cut_bits, cut_ties, sh);
    }
  }
  if (kept_total == 0) return 0;

  // Step 8: u = k * 2^-24; the sample is the first kept id whose running sum
  // exceeds u * total, i.e. floor(k * total / 2^24) for integer sums.
  const uint32_t k = sampling::PhiloxBits(p.seed, static_cast<uint64_t>(p.output_position)) >> 8;
  const u64 target = static_cast<u64>((static_cast<unsigned __int128>(k) * kept_total) >> 24);
  const int id = Walk(ws, vocab, kept, fixed, target, sh);
  return id < 0 ? 0 : id;
}

__device__ __forceinline__ void TopInsert(float* values, int* ids, int n, float v, int id) {
  if (!Better(v, id, values[n - 1], ids[n - 1])) return;
  int j = n - 1;
  while (j > 0 && Better(v, id, values[j - 1], ids[j - 1])) {
    values[j] = values[j - 1];
    ids[j] = ids[j - 1];
    --j;
  }
  values[j] = v;
  ids[j] = id;
}

__device__ __forceinline__ float LogProb(float x, double log_z) {
  return x == -INFINITY ? -INFINITY : static_cast<float>(static_cast<double>(x) - log_z);
}

// One block per row. The row's workspace holds penalized logits of the
// penalized tokens (marked in the shared bitmap), then the weights.
template <typename T>
__global__ void __launch_bounds__(kThreads) SampleKernel(SampleKernelArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  Shared& sh = *reinterpret_cast<Shared*>(smem);
  unsigned* bitmap = reinterpret_cast<unsigned*>(smem + sizeof(Shared));
  const int64_t row = blockIdx.x;
  const int vocab = a.vocab;
  const int tid = static_cast<int>(threadIdx.x);
  const SamplingRow p = a.params[row];
  const T* logits = static_cast<const T*>(a.logits) + row * a.logits_stride;
  float* ws = a.workspace + row * SampleWorkspaceRowFloats(vocab);

  // Steps 1 and 2 on the penalized tokens only. Tokens are distinct within
  // each list, so no two threads touch one token in the same phase.
  const bool repetition =
      p.repetition_penalty != 1.0f && a.seen_tokens != nullptr && p.seen_end > p.seen_begin;
  const bool additive = (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) &&
                        a.output_counts != nullptr && p.counts_end > p.counts_begin;
  const bool patched = repetition || additive;
  if (patched) {
    for (int i = tid; i < (vocab + 31) / 32; i += kThreads) bitmap[i] = 0;
    __syncthreads();
  }
  if (repetition) {
    const float r = p.repetition_penalty;
    for (int j = p.seen_begin + tid; j < p.seen_end; j += kThreads) {
      const int token = a.seen_tokens[j];
      if (token < 0 || token >= vocab) continue;
      const float x = Load(logits, token);
      ws[token] = x > 0.0f ? __fdiv_rn(x, r) : __fmul_rn(x, r);
      atomicOr(&bitmap[token >> 5], 1u << (token & 31));
    }
    __syncthreads();
  }
  if (additive) {
    for (int j = p.counts_begin + tid; j < p.counts_end; j += kThreads) {
      const SamplingTokenCount tc = a.output_counts[j];
      const int token = tc.token;
      if (token < 0 || token >= vocab) continue;
      float x = ((bitmap[token >> 5] >> (token & 31)) & 1u) ? ws[token] : Load(logits, token);
      // Two subtractions, as the CPU (and vLLM) apply them; no FMA.
      x = __fsub_rn(x, __fmul_rn(p.frequency_penalty, static_cast<float>(tc.count)));
      x = __fsub_rn(x, p.presence_penalty);
      ws[token] = x;
      atomicOr(&bitmap[token >> 5], 1u << (token & 31));
    }
    __syncthreads();
  }

  // One pass over the row: the greedy argmax or the maximum scaled logit,
  // and the raw logits' log-sum-exp and per-thread top lists for logprobs.
  const bool greedy = p.temperature == 0.0f;
  const bool want_logprobs = p.logprobs || p.top_logprobs > 0;
  int top_n = p.top_logprobs < a.max_top_logprobs ? p.top_logprobs : a.max_top_logprobs;
  top_n = top_n < vocab ? top_n : vocab;
  top_n = top_n > 0 ? top_n : 0;
  Best best{-INFINITY, kNoId};
  float max_scaled = -INFINITY;
  Lse lse{-INFINITY, 0.0f};
  float top_values[kMaxTop];
  int top_ids[kMaxTop];
  for (int j = 0; j < kMaxTop; ++j) {
    top_values[j] = -INFINITY;
    top_ids[j] = kNoId;
  }
  // kPassLoads logits per thread are loaded before any is used: one block
  // streams the whole row, so its speed is the loads it keeps in flight.
  // Each thread still visits its ids in ascending order.
  for (int base = tid; base < vocab; base += kThreads * kPassLoads) {
    float raws[kPassLoads];
#pragma unroll
    for (int u = 0; u < kPassLoads; ++u) {
      const int i = base + u * kThreads;
      raws[u] = i < vocab ? Load(logits, i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kPassLoads; ++u) {
      const int i = base + u * kThreads;
      if (i >= vocab) break;
      const float raw = raws[u];
      const bool is_patched = patched && ((bitmap[i >> 5] >> (i & 31)) & 1u);
      const float x = Key(is_patched ? ws[i] : raw);
      if (greedy) {
        if (Better(x, i, best.value, best.id)) best = {x, i};
      } else {
        max_scaled = fmaxf(max_scaled, __fdiv_rn(x, p.temperature));
      }
      if (want_logprobs) {
        const float key = Key(raw);
        LseAdd(lse, key);
        if (top_n > 0) TopInsert(top_values, top_ids, top_n, key, i);
      }
    }
  }

  int token = 0;
  if (greedy) {
    token = BlockBest(best, sh).id;
  } else {
    max_scaled = BlockMax(max_scaled, sh);
    if (max_scaled != -INFINITY) {
      token = SampleFromWeights(logits, ws, bitmap, patched, p, vocab, max_scaled, sh);
    }
  }

  double log_z = 0.0;
  if (want_logprobs) {
    lse = BlockLse(lse, sh);
    if (lse.m != -INFINITY) log_z = static_cast<double>(lse.m) + log(static_cast<double>(lse.s));
  }
  if (tid == 0) {
    a.tokens[row] = token;
    if (a.logprobs != nullptr) {
      a.logprobs[row] = want_logprobs ? LogProb(Key(Load(logits, token)), log_z) : 0.0f;
    }
  }
  if (a.max_top_logprobs > 0) {
    int32_t* out_ids = a.top_ids + row * a.max_top_logprobs;
    float* out_logprobs = a.top_logprobs + row * a.max_top_logprobs;
    // Merge the per-thread lists: top_n rounds of a block argmax over each
    // thread's best remaining entry.
    int head = 0;
    for (int j = 0; j < a.max_top_logprobs; ++j) {
      if (j < top_n) {
        const Best mine =
            head < top_n ? Best{top_values[head], top_ids[head]} : Best{-INFINITY, kNoId};
        const Best winner = BlockBest(mine, sh);
        if (mine.id != kNoId && mine.id == winner.id) ++head;
        if (tid == 0) {
          out_ids[j] = winner.id == kNoId ? -1 : winner.id;
          out_logprobs[j] = winner.id == kNoId ? -INFINITY : LogProb(winner.value, log_z);
        }
      } else if (tid == 0) {
        out_ids[j] = -1;
        out_logprobs[j] = -INFINITY;
      }
    }
  }
}

// Greedy rows without penalties or logprobs (SampleKernelArgs::greedy_only):
// a cluster of kArgmaxCluster CTAs per row, each the argmax of one slice of
// the row; rank 0 takes the best of the slices' bests from their shared
// memory. The same order as the one-block pass (larger value, then lower
// id; NaN as -inf), so the same tokens, read by 8 SMs a row instead of one.
constexpr int kArgmaxCluster = 8;
constexpr int kArgmaxThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads) ArgmaxKernel(SampleKernelArgs a) {
  __shared__ float best_value;
  __shared__ float best_id;  // the id's bits, for one f32 load from a peer
  __shared__ float warp_value[kArgmaxThreads / 32];
  __shared__ int warp_id[kArgmaxThreads / 32];
  const int64_t row = blockIdx.x / kArgmaxCluster;
  const int rank = static_cast<int>(blockIdx.x % kArgmaxCluster);
  const int tid = static_cast<int>(threadIdx.x);
  const int slice = (a.vocab + kArgmaxCluster - 1) / kArgmaxCluster;
  const int begin = rank * slice;
  const int end = min(a.vocab, begin + slice);
  const T* logits = static_cast<const T*>(a.logits) + row * a.logits_stride;
  Best best{-INFINITY, kNoId};
  for (int base = begin + tid; base < end; base += kArgmaxThreads * kPassLoads) {
    float raws[kPassLoads];
#pragma unroll
    for (int u = 0; u < kPassLoads; ++u) {
      const int i = base + u * kArgmaxThreads;
      raws[u] = i < end ? Load(logits, i) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kPassLoads; ++u) {
      const int i = base + u * kArgmaxThreads;
      if (i >= end) break;
      const float x = Key(raws[u]);
      if (Better(x, i, best.value, best.id)) best = {x, i};
    }
  }
  best = WarpBest(best);
  if (Lane() == 0) {
    warp_value[Warp()] = best.value;
    warp_id[Warp()] = best.id;
  }
  __syncthreads();
  if (Warp() == 0) {
    constexpr int kWarps = kArgmaxThreads / 32;
    best = WarpBest(Lane() < kWarps ? Best{warp_value[Lane()], warp_id[Lane()]}
                                    : Best{-INFINITY, kNoId});
    if (Lane() == 0) {
      best_value = best.value;
      best_id = __int_as_float(best.id);
    }
  }
  wgmma::ClusterSync();
  if (rank == 0 && Warp() == 0) {
    Best slice_best{-INFINITY, kNoId};
    if (Lane() < kArgmaxCluster) {
      slice_best = {
          wgmma::LoadClusterShared(wgmma::ClusterSharedAddress(&best_value, Lane())),
          __float_as_int(wgmma::LoadClusterShared(wgmma::ClusterSharedAddress(&best_id, Lane())))};
    }
    slice_best = WarpBest(slice_best);
    if (Lane() == 0) {
      a.tokens[row] = slice_best.id;
      if (a.logprobs != nullptr) a.logprobs[row] = 0.0f;
    }
  }
  // The peers' shared memory stays until rank 0 has read it.
  wgmma::ClusterSync();
}

}  // namespace

cudaError_t Sample(const SampleKernelArgs& args, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (args.greedy_only) {
    void (*argmax)(SampleKernelArgs) =
        args.logits_bf16 ? ArgmaxKernel<__nv_bfloat16> : ArgmaxKernel<float>;
    return pdl::LaunchClustered(argmax, dim3(static_cast<unsigned>(rows * kArgmaxCluster)),
                                dim3(kArgmaxThreads), 0, stream, /*pdl=*/false, kArgmaxCluster,
                                args);
  }
  const size_t shared_bytes =
      sizeof(Shared) + static_cast<size_t>((args.vocab + 31) / 32) * sizeof(unsigned);
  void (*kernel)(SampleKernelArgs) =
      args.logits_bf16 ? SampleKernel<__nv_bfloat16> : SampleKernel<float>;
  const cudaError_t error = cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes));
  if (error != cudaSuccess) return error;
  kernel<<<static_cast<unsigned>(rows), kThreads, shared_bytes, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
