// Decode attention on the CPU: one new query token per sequence, for a batch
// of sequences whose KV cache is held in host DRAM. This is the kernel of the
// CPU attention service; it is bandwidth-bound, so it reads every cached K and
// V element exactly once per call.
//
// KV layout of one layer of one sequence (fixed: the service and the wire
// protocol rely on it). Block b covers tokens [b * block_size,
// (b + 1) * block_size) and starts at `seq.kv + b * block_stride_elems`
// (elements of the KV dtype: the blocks of one sequence-layer sit at a
// uniform stride), or, for a sequence with a block table (kRows only), at
// `seq.blocks[b]` (blocks anywhere: a shared prefix held once, attended in
// place by every sequence that starts with it):
//
//   seq.kv + b * block_stride_elems
//   |
//   v
//   [ K: [num_kv_heads][block_size * head_dim] ] ... [ V: same shape ] ...
//   ^ block b                                         ^ + value_offset_elems
//
// Each kv head's block_size * head_dim elements of K (and of V) are ordered
// by `DecodeKvPacking`:
//
//   kRows   K and V: [block_size][head_dim], a token's row contiguous. Every
//           dtype. Element (h, t, d) of K is at
//             seq.kv + (t / block_size) * block_stride_elems
//                    + (h * block_size + t % block_size) * head_dim + d.
//   kPairs  bf16 only, block_size a multiple of 32: the order vdpbf16ps and
//           AMX-BF16 tiles consume without repacking (32-bit words of two
//           bf16), so neither q·K nor P·V needs a horizontal reduction or a
//           widening step:
//             K: [head_dim / 2][block_size][2]: word (i, t) = K[t][2i, 2i+1]
//             V: [block_size / 2][head_dim][2]: word (j, d) = V[2j, 2j+1][d]
//
// DecodeKvElementOffset() computes either; V elements sit
// `value_offset_elems` after their K. Elements are bf16 (the product), f32 or
// f16; all math is fp32 (bf16 uses bf16 products with fp32 accumulation: q
// rounded to bf16 for q·K, and with kPairs the softmax weights rounded to
// bf16 for P·V, as GPU flash-attention kernels do).
//
// Math, for every sequence s and q head h (kv head h / group, group =
// num_q_heads / num_kv_heads), over the tokens t < context_len:
//
//   score[t] = scale * q[h] . K[t]
//   o[h]     = sum_t softmax(score)[t] * V[t]
//   lse[h]   = ln(sum_t e^score[t])      (the log of the softmax denominator)
//
// Two outputs of disjoint token ranges merge exactly: with M = max(lse1, lse2),
//   o = (o1 e^(lse1 - M) + o2 e^(lse2 - M)) / (e^(lse1 - M) + e^(lse2 - M)).
//
// Work split (flash decoding): the batch's tokens, sequence after sequence
// (every kv head of a token together), are cut into `num_threads`
// contiguous ranges of about equal token counts, cut at block boundaries.
// Each thread runs an fp32 online softmax over its ranges with all q heads of
// a kv head together (so a KV byte is read once). With kPairs it walks a
// range block by block, every kv head of a block in turn, so that it reads
// the range's K and V as two forward streams, and prefetches the next tile
// of its stream; with kRows it walks each kv head's whole range in turn,
// prefetching the next block. A sequence that one thread covers whole is
// finalized by that thread in Run(); one that is cut leaves partials that
// Merge() combines with a log-sum-exp merge.
//
// Threading: the caller owns the threads. The service runs
//
//   TRIDENT_RETURN_IF_ERROR(kernel->Plan(layout, num_q_heads, scale, seqs, n));
//   pool.RunOnEach(n, [&](int i) { kernel->Run(i); });    // then a barrier,
//   pool.RunOnEach(n, [&](int i) { kernel->Merge(i); });  // then a barrier.
//
// and tests and benchmarks call RunDecodeAttentionOmp(), which does the same
// on OpenMP threads. No allocation per call: Create() allocates all scratch
// for its capacity limits; Plan, Run and Merge allocate nothing and never
// block.

#ifndef TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_H_
#define TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {

// Instruction-set path of the kernel, chosen at Create() from cpuid.
//
//   kAvx2        AVX2 + FMA + F16C: every dtype widened to fp32, 8-wide FMA.
//   kAvx512Bf16  AVX-512 (F, BW, DQ, VL) + AVX512-BF16: bf16 q·K with
//                vdpbf16ps (q rounded to bf16, fp32 accumulation); P·V in
//                fp32 FMA for kRows, vdpbf16ps for kPairs; f32 and f16 KV
//                widened to fp32, 16-wide FMA.
//   kAmx         kAvx512Bf16 plus AMX-BF16 tiles for the bf16 q·K of kRows
//                (scores S^T = K_block x q^T, K tiles loaded straight from
//                the cache rows); everything else is kAvx512Bf16's.
//   kAuto        the fastest path the CPU has (see Create()).
enum class DecodeIsa { kAuto, kAvx2, kAvx512Bf16, kAmx };

// "auto", "avx2", "avx512_bf16", "amx".
absl::string_view DecodeIsaName(DecodeIsa isa);

// Whether this CPU (cpuid and OS register state, //common/cpu:cpu_features)
// has what `isa` needs; kAuto is always available here and resolved by
// Create(). AMX also needs the per-process tile permission, which Create()
// requests.
bool DecodeIsaAvailable(DecodeIsa isa);

// Element order inside one kv head's share of a block; see the file comment.
enum class DecodeKvPacking { kRows, kPairs };

// "rows", "pairs".
absl::string_view DecodeKvPackingName(DecodeKvPacking packing);

// One layer's KV geometry, shared by every sequence of a call. Offsets and
// strides count elements of `dtype`, not bytes.
struct DecodeKvLayout {
  numeric::DType dtype = numeric::DType::kBF16;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;    // A multiple of 16, at most 256.
  int32_t block_size = 0;  // Tokens per block; a multiple of 32 for kPairs.
  // From block b to block b + 1: at least value_offset_elems + one half
  // (num_kv_heads * block_size * head_dim).
  int64_t block_stride_elems = 0;
  // From a block's K to its V: at least one half.
  int64_t value_offset_elems = 0;
  DecodeKvPacking packing = DecodeKvPacking::kRows;
};

// Offset, in elements from the sequence-layer's start, of element (token,
// kv head, dim) of K (`value` false) or V. No validation.
int64_t DecodeKvElementOffset(const DecodeKvLayout& layout, int32_t token, int32_t head,
                              int32_t dim, bool value);

// One sequence of the batch. Pointers are borrowed for the duration of one
// Plan/Run/Merge cycle; q must stay unchanged and o, lse untouched by others
// until the last Merge returns.
struct DecodeSequence {
  const void* kv = nullptr;  // Block 0 of this sequence's layer, see the layout.
  int32_t context_len = 0;   // Cached tokens, the new token's k/v included; >= 1.
  const float* q = nullptr;  // [num_q_heads][head_dim]
  float* o = nullptr;        // [num_q_heads][head_dim]; must not overlap q or KV.
  float* lse = nullptr;      // [num_q_heads], or nullptr when not wanted.
  // A block table instead of kv (kRows only): block b of this
  // sequence-layer (its K; V value_offset_elems after it) starts at
  // blocks[b], for every b < ceil(context_len / block_size); kv is then
  // ignored. block_stride_elems still bounds a block's extent.
  const void* const* blocks = nullptr;
};

// Capacity limits of a DecodeAttention object. Scratch for all of them is
// allocated once, in Create().
struct DecodeAttentionOptions {
  int32_t max_threads = 1;     // Largest `num_threads` Plan() accepts.
  int32_t max_sequences = 1;   // Largest batch.
  int32_t max_q_heads = 64;    // Largest num_q_heads (and so kv heads and group).
  int32_t max_head_dim = 128;  // Largest head_dim; a multiple of 16, at most 256.
  DecodeIsa isa = DecodeIsa::kAuto;
};

// A reusable decode-attention kernel with preallocated scratch.
//
// Thread-compatible, in phases: Plan() on one thread; then Run(i) exactly once
// for every i in [0, num_threads), concurrently on any threads; then, after
// all Run calls returned, Merge(i) exactly once for every i, concurrently;
// outputs are complete when every Merge returned. The next Plan() may follow.
// Threads that call Run/Merge may differ from call to call; each uses only
// scratch slot i. With kAmx, Run() loads the tile configuration on the
// calling thread and releases the tiles before it returns.
class DecodeAttention {
 public:
  // Validates `options` and allocates all scratch. kAuto picks kAmx (when
  // the CPU has it and the kernel grants the tile permission; it measured
  // faster than AVX512-BF16, see the .cc), else kAvx512Bf16, else kAvx2; a
  // forced ISA is used as given.
  //
  // kInvalidArgument naming the field for a non-positive limit or a head_dim
  // limit not a multiple of 16 or above 256; kFailedPrecondition when the CPU
  // lacks the forced ISA (or any path, for kAuto), or the kernel refuses the
  // AMX tile permission.
  static absl::StatusOr<std::unique_ptr<DecodeAttention>> Create(
      const DecodeAttentionOptions& options);

  ~DecodeAttention();
  DecodeAttention(const DecodeAttention&) = delete;
  DecodeAttention& operator=(const DecodeAttention&) = delete;

  // Plans one call: validates the arguments and splits the work over
  // `num_threads`. Allocates nothing. The pointers in `seqs` are copied, not
  // the span's storage: `seqs` may be freed after Plan returns, the data
  // they point to may not (see DecodeSequence).
  //
  // kInvalidArgument naming the field: a layout field out of range (dtype,
  // positive num_kv_heads and block_size, head_dim a multiple of 16 in
  // [16, 256] and <= options.max_head_dim, strides under which a block's K
  // and V overlap neither each other nor the next block); num_q_heads not a
  // positive multiple of num_kv_heads or above options.max_q_heads; more
  // sequences than options.max_sequences; a sequence with a null kv (and no
  // block table), q or o, or context_len < 1; a block table with kPairs; num_threads outside [1, options.max_threads]; a
  // non-finite scale. On error the previous plan is dropped
  // (Run and Merge of it are no longer allowed).
  absl::Status Plan(const DecodeKvLayout& layout, int32_t num_q_heads, float scale,
                    absl::Span<const DecodeSequence> seqs, int32_t num_threads);

  // Phase 1 on thread slot `thread_index`: attends this slot's token ranges,
  // writes finished (sequence, kv head) outputs directly and the partials of
  // cut ones to scratch. Never blocks, never allocates.
  // REQUIRES: the last Plan() succeeded; 0 <= thread_index < its num_threads.
  void Run(int32_t thread_index);

  // Phase 2 on thread slot `thread_index`: finalizes a disjoint share of the
  // (sequence, q head) outputs whose kv head was cut between slots.
  // REQUIRES: Run(i) returned for every slot i of the plan.
  void Merge(int32_t thread_index);

  // The ISA path this object runs (never kAuto).
  DecodeIsa isa() const { return isa_; }
  const DecodeAttentionOptions& options() const { return options_; }
  // Threads of the last successful Plan(); 0 before one.
  int32_t planned_threads() const;

  struct State;  // Scratch and plan; defined in the .cc.

 private:
  DecodeAttention(const DecodeAttentionOptions& options, DecodeIsa isa,
                  std::unique_ptr<State> state);

  const DecodeAttentionOptions options_;
  const DecodeIsa isa_;
  std::unique_ptr<State> state_;
};

// Plan() then Run() and Merge() on `num_threads` OpenMP threads of the
// calling thread's pool (one parallel region, a barrier between the phases).
// For tests and benchmarks; the service uses its own pool. Same errors as
// Plan(), nothing run on error.
absl::Status RunDecodeAttentionOmp(DecodeAttention& kernel, const DecodeKvLayout& layout,
                                   int32_t num_q_heads, float scale,
                                   absl::Span<const DecodeSequence> seqs, int32_t num_threads);

// The new token of one sequence: its k and v, float32 [num_kv_heads][head_dim]
// each, to be stored at token position `position` of the sequence-layer at
// `kv` (same layout as DecodeSequence::kv).
struct DecodeKvAppend {
  void* kv = nullptr;
  int32_t position = 0;
  // The token's k and v rows (num_kv_heads * head_dim each, head-major):
  // f32, or instead bf16 bits in k_bf16 / v_bf16 (a bf16 layout only; stored
  // as they are, without a conversion).
  const float* k = nullptr;
  const float* v = nullptr;
  const uint16_t* k_bf16 = nullptr;
  const uint16_t* v_bf16 = nullptr;
};

// Stores each token's k and v, converted to layout.dtype (bf16 and f16 round
// to nearest even). Allocates nothing; runs on the calling thread (split
// `tokens` across threads to parallelize: entries are independent).
// kInvalidArgument naming the field for a bad layout (as in Plan) or an entry
// with a null pointer (k and v, or k_bf16 and v_bf16, exactly one pair), bf16
// rows for a layout that is not bf16, or a negative position; nothing is
// written then.
// REQUIRES: the block holding each position is allocated; entries write
// distinct positions.
absl::Status AppendDecodeKv(const DecodeKvLayout& layout, absl::Span<const DecodeKvAppend> tokens);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_H_
