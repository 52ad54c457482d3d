// AVX-512 + AVX512-BF16 segment kernels. Initial version: the AVX2 ones.

#include "kernels/cpu/decode_attention/decode_attention_internal.h"

namespace trident::kernels::cpu::decode_internal {

IsaKernels Avx512Bf16Kernels() { return Avx2Kernels(); }

}  // namespace trident::kernels::cpu::decode_internal
