#ifndef TRIDENT_KERNELS_CUDA_WGMMA_TENSOR_MAP_H_
#define TRIDENT_KERNELS_CUDA_WGMMA_TENSOR_MAP_H_

// Host side of the tensor copy engine (TMA) for the launchers of sm_90a
// kernels: the driver's cuTensorMapEncodeTiled, found at run time (the
// runtime links no driver symbol), and a 2-D map over rows of a matrix.

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::wgmma {

using TensorMapEncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                          const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                          const cuuint32_t*, CUtensorMapInterleave,
                                          CUtensorMapSwizzle, CUtensorMapL2promotion,
                                          CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, or null.
inline TensorMapEncodeTiled TensorMapEncoder() {
  static const TensorMapEncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<TensorMapEncodeTiled>(nullptr);
    }
    return reinterpret_cast<TensorMapEncodeTiled>(fn);
  }();
  return encode;
}

// A map over `rows` rows of `row_elems` elements of `type` (`elem_bytes`
// each), `row_stride_bytes` apart (a multiple of 16, base 16-byte aligned),
// in boxes of box_elems x box_rows; what lies past the matrix reads as
// zeros. False when the driver has no encoder or refuses the shape.
inline bool EncodeRowMap(CUtensorMap* map, const void* base, CUtensorMapDataType type,
                         uint64_t row_elems, uint64_t rows, uint64_t row_stride_bytes,
                         uint32_t box_elems, uint32_t box_rows, CUtensorMapSwizzle swizzle) {
  const TensorMapEncodeTiled encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {row_elems, rows};
  const cuuint64_t strides[1] = {row_stride_bytes};
  const cuuint32_t box[2] = {box_elems, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace trident::kernels::cuda::wgmma

#endif  // TRIDENT_KERNELS_CUDA_WGMMA_TENSOR_MAP_H_
