#ifndef TRIDENT_KERNELS_CUDA_GEMM_SKINNY_SPLIT_H_
#define TRIDENT_KERNELS_CUDA_GEMM_SKINNY_SPLIT_H_

// How Hopper's skinny GEMM (gemm_skinny_sm90.cu) shares its work among CTAs,
// as plain arithmetic for the host and the device (and a CPU test).
//
// The work is `tiles` tiles of W's rows times `chunks` chunks of k: units
// numbered tile-major (unit = tile * chunks + chunk). CTA b of `grid` takes
// the contiguous units [Start(b), Start(b + 1)): every CTA gets the same
// count within one. A CTA's run crosses tiles; the part of the run inside
// one tile is a segment. A segment that covers its whole tile writes the
// result; the others write partial sums, and the last of a tile's CTAs to
// finish adds them up (in CTA order, so the result does not depend on who
// finishes last). Only a run's first and last segments can be partial, so
// each CTA needs two partial slots.

#include <cstdint>

namespace trident::kernels::cuda::internal {

#if defined(__CUDACC__)
#define TRIDENT_SKINNY_HD __host__ __device__ __forceinline__
#else
#define TRIDENT_SKINNY_HD inline
#endif

struct SkinnySplit {
  int64_t units = 0;
  int64_t chunks = 0;  // per tile
  int64_t grid = 0;

  TRIDENT_SKINNY_HD SkinnySplit(int64_t tiles, int64_t chunks_per_tile, int64_t ctas)
      : units(tiles * chunks_per_tile), chunks(chunks_per_tile), grid(ctas) {}

  // CTA b's first unit (Start(grid) = units).
  TRIDENT_SKINNY_HD int64_t Start(int64_t b) const { return units * b / grid; }

  // The CTA whose run holds unit u: the largest b with Start(b) <= u.
  TRIDENT_SKINNY_HD int64_t Owner(int64_t u) const { return ((u + 1) * grid - 1) / units; }

  // The CTAs that work on tile t: Owner of its first unit .. of its last.
  TRIDENT_SKINNY_HD int64_t FirstCta(int64_t t) const { return Owner(t * chunks); }
  TRIDENT_SKINNY_HD int64_t LastCta(int64_t t) const { return Owner(t * chunks + chunks - 1); }

  // The partial slot CTA b writes for tile t: 2 b for its run's first tile,
  // 2 b + 1 for its last.
  TRIDENT_SKINNY_HD int64_t Slot(int64_t b, int64_t t) const {
    return 2 * b + (Start(b) / chunks == t ? 0 : 1);
  }
};

#undef TRIDENT_SKINNY_HD

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_GEMM_SKINNY_SPLIT_H_
