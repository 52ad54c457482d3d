#ifndef TRIDENT_KERNELS_CPU_SILU_MUL_SILU_MUL_H_
#define TRIDENT_KERNELS_CPU_SILU_MUL_SILU_MUL_H_

// SwiGLU's activation: out = silu(gate) * up, where silu(x) = x / (1 + e^-x).
//
// Input rows hold the fused gate/up projection, gate first:
//   gate_up[t] = [ gate[t][0 .. hidden) | up[t][0 .. hidden) ]   (2 * hidden values)
//   out[t]     = [ silu(gate[t][i]) * up[t][i] for i in [0, hidden) ]
//
// This is the plain reference: the CPU backend's kernel and the check for the
// CUDA kernel of the same name.

#include <cstdint>

namespace trident::kernels::cpu {

// REQUIRES: gate_up holds num_tokens * 2 * hidden floats, out num_tokens *
// hidden; they do not overlap.
void SiluMulReference(const float* gate_up, float* out, int64_t num_tokens, int64_t hidden);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_SILU_MUL_SILU_MUL_H_
