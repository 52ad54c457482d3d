// AMX-BF16 segment kernels. Initial version: the AVX-512 ones.

#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/cpu/decode_attention/decode_attention_internal.h"

namespace trident::kernels::cpu::decode_internal {

bool RequestAmxPermission() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

IsaKernels AmxKernels() { return Avx512Bf16Kernels(); }

}  // namespace trident::kernels::cpu::decode_internal
