#ifndef TRIDENT_KERNELS_CUDA_ROPE_ROPE_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_ROPE_ROPE_DEVICE_H_

// The arithmetic of the RoPE kernels, for nvcc only (a .cu file's include),
// shared with kernels that rotate in their own epilogue (Hopper's GEMV) so
// that both give the same bits.

namespace trident::kernels::cuda::rope {

// cos and sin of pair i's angle at `position`: the product rounded, then
// the accurate sincosf (full range reduction), not __sincosf.
__device__ __forceinline__ void CosSin(float position, float inv_freq, float& c, float& s) {
  sincosf(__fmul_rn(position, inv_freq), &s, &c);
}

// x' = a * c - b * s and y' = b * c + a * s, every product and sum rounded on
// its own, as the CPU reference (built with -ffp-contract=off) computes them.
__device__ __forceinline__ void Rotate(float a, float b, float c, float s, float& x, float& y) {
  x = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  y = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

}  // namespace trident::kernels::cuda::rope

#endif  // TRIDENT_KERNELS_CUDA_ROPE_ROPE_DEVICE_H_
