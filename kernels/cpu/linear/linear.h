// A fully connected layer on the CPU through oneDNN:
//
//   y[m, o] = sum_i x[m, i] * W[o, i]  (+ bias[o])
//
// with W in Hugging Face layout, [out_features, in_features] row-major, and
// x and y fp32 row-major. Weights are copied once, in Create, into the layout
// oneDNN's matmul prefers on this CPU ("pre-packed"), so Forward does no
// weight work and the caller's weight buffer may be freed after Create.
//
// Compute types:
//   kF32 weights   f32 x f32 -> f32 matmul.
//   kBF16 weights  x is rounded to bf16 and a bf16 x bf16 matmul accumulates
//                  in f32 (errors ~2^-9 relative on x). With
//                  LinearCompute::kBf16SplitActivations, x is instead split
//                  into two bf16 terms, x = hi + lo, and one matmul over the
//                  2m rows [hi; lo] gives y = W·hi + W·lo: the weights are
//                  read once, x keeps ~16 bits (errors ~2^-17), and the
//                  matmul does twice the work (measured: batch-1 decode of a
//                  125M model 1.6x slower on Sapphire Rapids with AMX).
//                  Needs a CPU where oneDNN 2.6 has bf16 matmuls (AVX-512;
//                  AMX is used where present). Elsewhere (AVX2-only CPUs) the
//                  weights are widened to f32 at Create and the f32 matmul
//                  runs: exact, twice the memory.
//   `compute_dtype()` says which one this layer uses. LinearCompute::kF32
//   widens bf16 weights once at Create and runs the exact f32 matmul.
//
// Forward takes any m (1 for one decode token, thousands for a prefill); the
// matmul primitive for each m is created on first use and cached.

#ifndef TRIDENT_KERNELS_CPU_LINEAR_LINEAR_H_
#define TRIDENT_KERNELS_CPU_LINEAR_LINEAR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {

enum class LinearCompute {
  // bf16 x bf16 for bf16 weights where the CPU has it (x rounded to bf16),
  // else f32.
  kWeightDtype,
  // As kWeightDtype, but x is carried as two bf16 terms (see above): ~2^-17
  // instead of 2^-9 relative error on x, at the cost of a 2m-row matmul.
  kBf16SplitActivations,
  // Always f32 x f32 (bf16 weights are widened at Create).
  kF32,
};

// Thread-compatible: Forward keeps a primitive cache and a bf16 scratch
// buffer, so calls on one Linear must not overlap; successive calls may come
// from different threads. Forward's matmul runs on the calling thread's OpenMP
// threads (see common/cpu/threads.h). Distinct Linear objects are independent.
class Linear {
 public:
  // `compute` picks the matmul type for bf16 weights (see the file comment).
  // `weight` holds out_features * in_features elements of `weight_dtype`
  // (kF32: float, kBF16: uint16_t bits); `bias` holds out_features floats or
  // is null. Neither is referenced after Create returns.
  //
  // Returns kInvalidArgument for non-positive sizes, a null weight, or a
  // weight_dtype other than kF32/kBF16; kInternal if oneDNN cannot create or
  // run the matmul or the weight reorder.
  static absl::StatusOr<std::unique_ptr<Linear>> Create(
      int64_t in_features, int64_t out_features, numeric::DType weight_dtype, const void* weight,
      const float* bias, LinearCompute compute = LinearCompute::kWeightDtype);

  Linear(const Linear&) = delete;
  Linear& operator=(const Linear&) = delete;
  ~Linear();

  // y[m, out_features] = x[m, in_features] * W^T (+ bias). m == 0 does
  // nothing.
  // REQUIRES: x holds m * in_features floats and y m * out_features, not
  // overlapping; m >= 0.
  void Forward(const float* x, int64_t m, float* y) const;

  int64_t in_features() const;
  int64_t out_features() const;
  // kF32 or kBF16: the type x and W are multiplied in (accumulation is f32).
  numeric::DType compute_dtype() const;
  // Bytes of the pre-packed weights, all of which one Forward reads.
  size_t packed_weight_bytes() const;
  // oneDNN's name for the implementation Forward(m) runs, e.g.
  // "brg:avx512_core_amx" or "gemm:jit"; for logs and benchmarks. Creates and
  // caches the primitive for m, so it is no more thread-safe than Forward.
  std::string ImplementationName(int64_t m) const;

 private:
  struct Impl;  // oneDNN objects; keeps dnnl.hpp out of this header.
  explicit Linear(std::unique_ptr<Impl> impl);
  // One matmul of m rows of `src` (in the compute type) into y.
  static void Run(Impl& impl, int64_t m, void* src, float* y);

  std::unique_ptr<Impl> impl_;
};

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_LINEAR_LINEAR_H_
