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
// sum of e^(score - max) * V). With `resume`, the state holds an earlier
// range of the same (sequence, kv head) and is carried on, not reset.
struct SegmentArgs {
  const void* k = nullptr;  // K of block 0 of this kv head (head offset applied).
  // Or, with a block table (kRows only): block b's K of this kv head is
  // blocks[b] + head_offset_elems.
  const void* const* blocks = nullptr;
  int64_t head_offset_elems = 0;
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
  bool resume = false;
  // The tile this thread reads after the segment's last one, for
  // prefetching (kPairs): the kv head's K (as `k`) and the tile's first
  // token; next_token < 0: none.
  const void* next_k = nullptr;
  int32_t next_token = -1;
  ThreadScratch scratch;
};

using SegmentFn = void (*)(const SegmentArgs& args);

// kRows: K of block b of the segment's kv head.
template <typename T>
inline const T* BlockK(const SegmentArgs& a, int64_t b) {
  if (a.blocks != nullptr) return static_cast<const T*>(a.blocks[b]) + a.head_offset_elems;
  return static_cast<const T*>(a.k) + b * a.block_stride_elems;
}

// DecodeKvPacking::kPairs: where one 32-token tile of a segment's kv head
// starts (k null: no tile). K word (i, t) (dims 2i, 2i + 1 of tile token t)
// is at k + i * k_row + 2t; V word (j, d) (tile tokens 2j, 2j + 1 of dim d)
// at v + j * 2 * head_dim + 2d.
struct PairTile {
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t k_row = 0;  // 2 * block_size elements.
};

// The tile starting at `token` (a multiple of 32) of the kv head whose K
// starts at head_k (same layout as the segment's).
inline PairTile PairTileOf(const SegmentArgs& a, const void* head_k, int32_t token) {
  const uint16_t* base = static_cast<const uint16_t*>(head_k);
  const int64_t block = token / a.block_size;
  const int64_t t0 = token % a.block_size;
  const uint16_t* k = base + block * a.block_stride_elems;
  return PairTile{.k = k + 2 * t0,
                  .v = k + a.value_offset_elems + t0 * a.head_dim,
                  .k_row = 2 * static_cast<int64_t>(a.block_size)};
}

// The segment's tile starting at `token`, or what the thread reads after the
// segment when `token` is at or past its end (no tile: k null).
inline PairTile PairTileAt(const SegmentArgs& a, int32_t token) {
  if (token < a.token_end) return PairTileOf(a, a.k, token);
  if (a.next_token < 0) return PairTile{};
  return PairTileOf(a, a.next_k, a.next_token);
}

// The kernels of one ISA path, one per KV dtype, plus hooks run once per
// Run() call on the calling thread (AMX tile configuration and release).
struct IsaKernels {
  SegmentFn f32 = nullptr;
  SegmentFn bf16 = nullptr;
  SegmentFn f16 = nullptr;
  SegmentFn bf16_pairs = nullptr;  // DecodeKvPacking::kPairs.
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
