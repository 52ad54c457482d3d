#ifndef TRIDENT_COMMON_NUMERIC_COUNTER_STREAM_H_
#define TRIDENT_COMMON_NUMERIC_COUNTER_STREAM_H_

// Generated weights as a counter-based stream: element i of a stream is
// SplitMix64(base + i) mapped to a uniform value, so that any block of a
// tensor is computed alone, by the host (model/generate's WriteModel and
// RandomWeights) or by a device where the block lives (kernels/cuda's
// random_fill). Header-only and the same bits on both: the product and the
// sum are rounded separately everywhere (never fused into one FMA, whatever
// the compiler's contraction flags).

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define TRIDENT_STREAM_HD __host__ __device__
#else
#define TRIDENT_STREAM_HD
#endif

namespace trident::numeric {

TRIDENT_STREAM_HD inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// mean + (2u - 1) half_width for u = the top 24 bits of SplitMix64(base + i)
// over 2^24: uniform in [mean - half_width, mean + half_width). 2u - 1 is
// exact; the product is rounded before the sum.
TRIDENT_STREAM_HD inline float StreamUniform(uint64_t base, uint64_t i, float mean,
                                             float half_width) {
  const uint64_t r = SplitMix64(base + i);
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);  // [0, 1), exact
#if defined(__CUDA_ARCH__)
  return __fadd_rn(mean, __fmul_rn(2.0f * u - 1.0f, half_width));
#else
  float product = (2.0f * u - 1.0f) * half_width;
#if defined(__GNUC__) && defined(__x86_64__)
  asm("" : "+x"(product));  // Materialized: no FMA with the sum below.
#elif defined(__GNUC__) && defined(__aarch64__)
  asm("" : "+w"(product));
#else
  volatile float stored = product;
  product = stored;
#endif
  return mean + product;
#endif
}

// A row-major block of a 2-D tensor (1-D: one column) whose elements are a
// counter-based stream: element (r, c) of the block is the tensor's element
// (row0 + r, col0 + c), i.e. StreamUniform(base, (row0 + r) * tensor_cols +
// col0 + c, mean, half_width), times 0.25 where quarter_rows[r] is set
// (quarter_rows empty: no row is scaled).
struct CounterStreamBlock {
  uint64_t base = 0;
  float mean = 0.0f;
  float half_width = 0.0f;
  int64_t tensor_cols = 1;
  int64_t row0 = 0;
  int64_t col0 = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> quarter_rows;  // empty or `rows` flags
};

// Element (r, c) of `block` in f32 (before any bf16 rounding).
inline float BlockElement(const CounterStreamBlock& block, int64_t r, int64_t c) {
  const uint64_t i = static_cast<uint64_t>((block.row0 + r) * block.tensor_cols + block.col0 + c);
  const float v = StreamUniform(block.base, i, block.mean, block.half_width);
  return !block.quarter_rows.empty() && block.quarter_rows[static_cast<size_t>(r)] != 0 ? v * 0.25f
                                                                                        : v;
}

}  // namespace trident::numeric

#endif  // TRIDENT_COMMON_NUMERIC_COUNTER_STREAM_H_
