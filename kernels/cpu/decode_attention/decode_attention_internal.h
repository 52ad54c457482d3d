// Internal to //kernels/cpu/decode_attention: the interface between the
// portable planner (decode_attention.cc) and the per-ISA segment kernels
// (decode_attention_{avx2,avx512,amx}.cc, each compiled with per-function
// target attributes so the rest of the binary stays portable).

#ifndef TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_INTERNAL_H_
#define TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_INTERNAL_H_

#include <cstdint>

namespace trident::kernels::cpu::decode_internal {

// Tokens whose scores one pass of a segment kernel holds before P·V.
inline constexpr int32_t kTileTokens = 32;

// Per-thread scratch a segment kernel may use; sized by the planner from the
// capacity limits (max group = max_q_heads, max head_dim), 64-byte aligned.
struct ThreadScratch {
  uint16_t* q16 = nullptr;  // max_group * max_head_dim bf16 (AMX: VNNI-packed, 16-col padded).
  float* q32 = nullptr;     // max_group * max_head_dim floats.
  float* p = nullptr;       // max_group * kTileTokens floats (AMX: 16-col padded tiles).
  uint16_t* pad = nullptr;  // 16 * 256 bf16: a zero-padded partial K tile (AMX).
  float* corr = nullptr;    // max_group floats, 16-padded: per-row accumulator rescale.
};

// One contiguous token range [token_begin, token_end) of one (sequence, kv
// head), all `group` q heads of the kv head together. Writes, for every row
// g < group, the unnormalized online-softmax state: max[g] (of scaled
// scores), sum[g] (of e^(score - max)) and acc + g * acc_stride ([head_dim]:
// sum of e^(score - max) * V).
struct SegmentArgs {
  const void* k = nullptr;  // K of block 0 of this kv head (head offset applied).
  int64_t block_stride_elems = 0;
  int64_t value_offset_elems = 0;
  int32_t block_size = 0;
  int32_t head_dim = 0;
  int32_t group = 0;
  int32_t token_begin = 0;
  int32_t token_end = 0;
  const float* q = nullptr;  // [group][head_dim], unscaled.
  float scale = 1.0f;
  float* acc = nullptr;
  int64_t acc_stride = 0;
  float* max = nullptr;
  float* sum = nullptr;
  ThreadScratch scratch;
};

using SegmentFn = void (*)(const SegmentArgs& args);

// The kernels of one ISA path, one per KV dtype, plus hooks run once per
// Run() call on the calling thread (AMX tile configuration and release).
struct IsaKernels {
  SegmentFn f32 = nullptr;
  SegmentFn bf16 = nullptr;
  SegmentFn f16 = nullptr;
  void (*begin_run)() = nullptr;  // May be null.
  void (*end_run)() = nullptr;    // May be null.
};

// Each returns its path's kernels; call only where the CPU has the ISA.
IsaKernels Avx2Kernels();
IsaKernels Avx512Bf16Kernels();
IsaKernels AmxKernels();

// Requests the AMX tile-data permission for the process (Linux
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)); true if granted.
bool RequestAmxPermission();

}  // namespace trident::kernels::cpu::decode_internal

#endif  // TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_INTERNAL_H_
