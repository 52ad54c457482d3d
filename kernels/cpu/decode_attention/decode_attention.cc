#include "kernels/cpu/decode_attention/decode_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/cpu/cpu_features.h"
#include "common/numeric/dtype.h"
#include "kernels/cpu/decode_attention/decode_attention_internal.h"

namespace trident::kernels::cpu {
namespace {

using decode_internal::IsaKernels;
using decode_internal::SegmentArgs;
using decode_internal::SegmentFn;
using decode_internal::ThreadScratch;
using numeric::DType;

constexpr int32_t kMaxHeadDim = 256;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// `bytes` rounded up to whole cache lines, so per-thread regions share none.
size_t RoundToLines(size_t bytes) { return (bytes + 63) / 64 * 64; }
int32_t RoundUp16(int32_t n) { return (n + 15) / 16 * 16; }

absl::Status ValidateOptions(const DecodeAttentionOptions& o) {
  auto positive = [](absl::string_view field, int32_t value) {
    return value >= 1 ? absl::OkStatus()
                      : absl::InvalidArgumentError(
                            absl::StrCat("options.", field, " is ", value, "; must be >= 1"));
  };
  for (const auto& [field, value] :
       {std::pair<absl::string_view, int32_t>{"max_threads", o.max_threads},
        {"max_sequences", o.max_sequences},
        {"max_q_heads", o.max_q_heads}}) {
    if (absl::Status s = positive(field, value); !s.ok()) return s;
  }
  if (o.max_head_dim < 16 || o.max_head_dim > kMaxHeadDim || o.max_head_dim % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("options.max_head_dim is ", o.max_head_dim,
                                                   "; must be a multiple of 16 in [16, 256]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<DecodeIsa> ResolveIsa(DecodeIsa requested) {
  if (requested != DecodeIsa::kAuto) {
    if (!DecodeIsaAvailable(requested)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "decode attention ISA ", DecodeIsaName(requested), " is not available on this CPU (",
          trident::cpu::CpuFeaturesString(trident::cpu::GetCpuFeatures()), ")"));
    }
    if (requested == DecodeIsa::kAmx && !decode_internal::RequestAmxPermission()) {
      return absl::FailedPreconditionError(
          "the kernel refused the AMX tile-data permission (arch_prctl ARCH_REQ_XCOMP_PERM)");
    }
    return requested;
  }
  // AMX read faster than AVX512-BF16 at 10 of the 11 shapes of
  // bench/RESULTS.md's kernel table (and within 1% at the eleventh); it
  // needs the kernel's tile-data permission, else the next path.
  if (DecodeIsaAvailable(DecodeIsa::kAmx) && decode_internal::RequestAmxPermission()) {
    return DecodeIsa::kAmx;
  }
  for (DecodeIsa isa : {DecodeIsa::kAvx512Bf16, DecodeIsa::kAvx2}) {
    if (DecodeIsaAvailable(isa)) return isa;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("decode attention needs AVX2, FMA and F16C; this CPU has ",
                   trident::cpu::CpuFeaturesString(trident::cpu::GetCpuFeatures())));
}

IsaKernels KernelsFor(DecodeIsa isa) {
  switch (isa) {
    case DecodeIsa::kAvx2:
      return decode_internal::Avx2Kernels();
    case DecodeIsa::kAvx512Bf16:
      return decode_internal::Avx512Bf16Kernels();
    case DecodeIsa::kAmx:
      return decode_internal::AmxKernels();
    case DecodeIsa::kAuto:
      break;
  }
  return {};
}

absl::Status ValidateLayout(const DecodeKvLayout& l, int32_t max_head_dim) {
  if (l.dtype != DType::kF32 && l.dtype != DType::kBF16 && l.dtype != DType::kF16) {
    return absl::InvalidArgumentError("layout.dtype must be kF32, kBF16 or kF16");
  }
  if (l.num_kv_heads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.num_kv_heads is ", l.num_kv_heads, "; must be >= 1"));
  }
  if (l.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.block_size is ", l.block_size, "; must be >= 1"));
  }
  if (l.head_dim < 16 || l.head_dim > std::min(max_head_dim, kMaxHeadDim) || l.head_dim % 16) {
    return absl::InvalidArgumentError(absl::StrCat("layout.head_dim is ", l.head_dim,
                                                   "; must be a multiple of 16 in [16, ",
                                                   std::min(max_head_dim, kMaxHeadDim), "]"));
  }
  if (l.packing == DecodeKvPacking::kPairs && (l.dtype != DType::kBF16 || l.block_size % 32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.packing pairs needs bf16 and a block_size multiple of 32; got ",
                     numeric::DTypeName(l.dtype), " and ", l.block_size));
  }
  if (l.packing != DecodeKvPacking::kRows && l.packing != DecodeKvPacking::kPairs) {
    return absl::InvalidArgumentError("layout.packing must be kRows or kPairs");
  }
  const int64_t half = static_cast<int64_t>(l.num_kv_heads) * l.block_size * l.head_dim;
  if (l.value_offset_elems < half) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout.value_offset_elems is ", l.value_offset_elems,
                     "; must be >= num_kv_heads * block_size * head_dim = ", half));
  }
  if (l.block_stride_elems < l.value_offset_elems + half) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout.block_stride_elems is ", l.block_stride_elems, "; must be >= value_offset_elems + ",
        half, " = ", l.value_offset_elems + half));
  }
  return absl::OkStatus();
}

// A contiguous token range of one sequence, all its kv heads, run by one
// thread.
struct Segment {
  int32_t seq;
  int32_t token_begin;
  int32_t token_end;
  int32_t slot;  // Partial slot, or -1 when the segment is the whole context.
};

// A sequence cut between threads: partial slots [first_slot, first_slot +
// num_slots) hold its pieces (every q head).
struct Split {
  int32_t seq;
  int32_t first_slot;
  int32_t num_slots;
};

}  // namespace

struct DecodeAttention::State {
  IsaKernels kernels;
  // Capacity-derived strides, in elements.
  int32_t max_group = 0;
  int32_t max_head_dim = 0;
  int64_t slot_floats = 0;  // One partial slot: acc [max_group][max_head_dim], max, sum.
  size_t thread_bytes = 0;  // One thread's scratch region.
  std::unique_ptr<char, FreeDeleter> thread_scratch;
  std::unique_ptr<float, FreeDeleter> partials;

  // The plan; vectors are reserved at capacity in Create() and never grow.
  DecodeKvLayout layout;
  int32_t num_q_heads = 0;
  int32_t group = 0;
  float scale = 1.0f;
  int32_t num_threads = 0;  // 0: no valid plan.
  std::vector<DecodeSequence> seqs;
  std::vector<Segment> segments;
  std::vector<int32_t> thread_first_segment;  // num_threads + 1 entries.
  std::vector<Split> splits;

  char* ThreadRegion(int32_t t) const { return thread_scratch.get() + thread_bytes * t; }
  float* Slot(int32_t slot) const { return partials.get() + slot_floats * slot; }
};

namespace {

// Cuts the batch's work, the sequences' tokens laid end to end (every kv
// head of a token together), into `num_threads` contiguous ranges of about
// total / threads tokens each. A cut inside a sequence moves to the nearest
// block boundary.
void SplitWork(DecodeAttention::State& s, int32_t num_threads) {
  s.segments.clear();
  s.splits.clear();
  s.thread_first_segment.clear();
  const int32_t bs = s.layout.block_size;
  const int64_t units = static_cast<int64_t>(s.seqs.size());
  auto unit_len = [&](int64_t u) -> int64_t { return s.seqs[u].context_len; };
  int64_t total = 0;
  for (const DecodeSequence& q : s.seqs) total += q.context_len;

  int64_t cut_unit = 0, cut_prefix = 0;  // Cursor finding range ends.
  int64_t unit = 0, prefix = 0;          // Cursor emitting segments.
  int64_t begin = 0;
  int32_t next_slot = 0;
  for (int32_t t = 0; t < num_threads; ++t) {
    s.thread_first_segment.push_back(static_cast<int32_t>(s.segments.size()));
    int64_t end = total;
    if (t + 1 < num_threads) {
      const int64_t target = total * (t + 1) / num_threads;
      while (cut_unit < units && cut_prefix + unit_len(cut_unit) <= target) {
        cut_prefix += unit_len(cut_unit++);
      }
      if (cut_unit < units) {
        const int64_t rounded = (target - cut_prefix + bs / 2) / bs * bs;
        end = cut_prefix + std::min(rounded, unit_len(cut_unit));
      }
    }
    end = std::max(end, begin);
    for (int64_t pos = begin; pos < end;) {
      while (prefix + unit_len(unit) <= pos) prefix += unit_len(unit++);
      const int64_t len = unit_len(unit);
      const int64_t seg_end = std::min(end, prefix + len);
      Segment seg{static_cast<int32_t>(unit), static_cast<int32_t>(pos - prefix),
                  static_cast<int32_t>(seg_end - prefix), -1};
      if (seg.token_begin != 0 || seg.token_end != len) {
        seg.slot = next_slot++;
        if (!s.splits.empty() && s.splits.back().seq == seg.seq) {
          ++s.splits.back().num_slots;
        } else {
          s.splits.push_back(Split{seg.seq, seg.slot, 1});
        }
      }
      s.segments.push_back(seg);
      pos = seg_end;
    }
    begin = end;
  }
  s.thread_first_segment.push_back(static_cast<int32_t>(s.segments.size()));
}

ThreadScratch ScratchOf(const DecodeAttention::State& s, int32_t t, float** acc) {
  char* p = s.ThreadRegion(t);
  const int64_t group_dims = static_cast<int64_t>(s.max_group) * s.max_head_dim;
  ThreadScratch scratch;
  scratch.q16 = reinterpret_cast<uint16_t*>(p);
  p += RoundToLines(RoundUp16(s.max_group) * static_cast<size_t>(s.max_head_dim) * 2);
  scratch.q32 = reinterpret_cast<float*>(p);
  p += RoundToLines(group_dims * 4);
  scratch.p = reinterpret_cast<float*>(p);
  p += RoundToLines(static_cast<size_t>(RoundUp16(s.max_group)) * decode_internal::kTileTokens * 4);
  scratch.pad = reinterpret_cast<uint16_t*>(p);
  p += RoundToLines(16 * kMaxHeadDim * 2);
  scratch.corr = reinterpret_cast<float*>(p);
  p += RoundToLines(RoundUp16(s.max_group) * 4);
  *acc = reinterpret_cast<float*>(p);
  return scratch;
}

// o = acc / sum and lse = max + ln(sum) for `group` rows.
void Finalize(const float* acc, int64_t acc_stride, const float* max, const float* sum,
              int32_t group, int32_t head_dim, float* o, float* lse) {
  for (int32_t g = 0; g < group; ++g) {
    const float inv = 1.0f / sum[g];
    const float* a = acc + g * acc_stride;
    float* out = o + static_cast<int64_t>(g) * head_dim;
    for (int32_t d = 0; d < head_dim; ++d) out[d] = a[d] * inv;
    if (lse != nullptr) lse[g] = max[g] + std::log(sum[g]);
  }
}

}  // namespace

void DecodeAttention::Run(int32_t thread_index) {
  const State& s = *state_;
  const DecodeKvLayout& l = s.layout;
  const SegmentFn fn = l.packing == DecodeKvPacking::kPairs ? s.kernels.bf16_pairs
                       : l.dtype == DType::kBF16            ? s.kernels.bf16
                       : l.dtype == DType::kF16             ? s.kernels.f16
                                                            : s.kernels.f32;
  const int32_t first = s.thread_first_segment[thread_index];
  const int32_t last = s.thread_first_segment[thread_index + 1];
  if (first == last) return;
  const int64_t elem_bytes = static_cast<int64_t>(numeric::ElementSize(l.dtype));
  const int64_t head_elems = static_cast<int64_t>(l.block_size) * l.head_dim;
  const int64_t group_dims = static_cast<int64_t>(s.group) * l.head_dim;
  float* whole_acc = nullptr;
  SegmentArgs args;
  args.scratch = ScratchOf(s, thread_index, &whole_acc);
  args.block_stride_elems = l.block_stride_elems;
  args.value_offset_elems = l.value_offset_elems;
  args.block_size = l.block_size;
  args.head_dim = l.head_dim;
  args.group = s.group;
  args.scale = s.scale;
  args.acc_stride = s.max_head_dim;
  if (s.kernels.begin_run != nullptr) s.kernels.begin_run();
  for (int32_t i = first; i < last; ++i) {
    const Segment& seg = s.segments[i];
    const DecodeSequence& q = s.seqs[seg.seq];
    float* acc = seg.slot < 0 ? whole_acc : s.Slot(seg.slot);
    float* max = acc + static_cast<int64_t>(s.max_group) * s.max_head_dim;
    float* sum = max + s.max_group;
    // kPairs: one block of every kv head in turn, so that the thread reads
    // the sequence's K and V as two forward streams (a kv head's share of a
    // block is only 8 KiB); kRows: each kv head's whole range in turn.
    const int32_t chunk =
        l.packing == DecodeKvPacking::kPairs ? l.block_size : seg.token_end - seg.token_begin;
    auto head_k = [&](int32_t h) {
      return static_cast<const char*>(q.kv) + h * head_elems * elem_bytes;
    };
    for (int32_t c = seg.token_begin; c < seg.token_end; c += chunk) {
      args.token_begin = c;
      args.token_end = std::min(c + chunk, seg.token_end);
      args.resume = c != seg.token_begin;
      for (int32_t h = 0; h < l.num_kv_heads; ++h) {
        args.blocks = q.blocks;
        args.head_offset_elems = h * head_elems;
        args.k = q.blocks != nullptr ? nullptr : head_k(h);
        const bool last_head = h + 1 == l.num_kv_heads;
        args.next_k = q.blocks != nullptr ? nullptr : head_k(last_head ? 0 : h + 1);
        args.next_token = !last_head ? c : args.token_end < seg.token_end ? args.token_end : -1;
        args.q = q.q + h * group_dims;
        args.acc = acc + static_cast<int64_t>(h) * s.group * args.acc_stride;
        args.max = max + h * s.group;
        args.sum = sum + h * s.group;
        fn(args);
      }
    }
    if (seg.slot < 0) {
      Finalize(acc, args.acc_stride, max, sum, s.num_q_heads, l.head_dim, q.o, q.lse);
    }
  }
  if (s.kernels.end_run != nullptr) s.kernels.end_run();
}

void DecodeAttention::Merge(int32_t thread_index) {
  const State& s = *state_;
  const int64_t items = static_cast<int64_t>(s.splits.size()) * s.num_q_heads;
  const int64_t first = items * thread_index / s.num_threads;
  const int64_t last = items * (thread_index + 1) / s.num_threads;
  const int32_t d = s.layout.head_dim;
  const int64_t group_dims = static_cast<int64_t>(s.max_group) * s.max_head_dim;
  for (int64_t item = first; item < last; ++item) {
    const Split& split = s.splits[item / s.num_q_heads];
    const int32_t head = static_cast<int32_t>(item % s.num_q_heads);
    float max = -std::numeric_limits<float>::infinity();
    for (int32_t i = 0; i < split.num_slots; ++i) {
      max = std::max(max, s.Slot(split.first_slot + i)[group_dims + head]);
    }
    const DecodeSequence& q = s.seqs[split.seq];
    float* o = q.o + static_cast<int64_t>(head) * d;
    float sum = 0.0f;
    std::fill_n(o, d, 0.0f);
    for (int32_t i = 0; i < split.num_slots; ++i) {
      const float* slot = s.Slot(split.first_slot + i);
      const float weight = std::exp(slot[group_dims + head] - max);
      sum += slot[group_dims + s.max_group + head] * weight;
      const float* acc = slot + static_cast<int64_t>(head) * s.max_head_dim;
      for (int32_t j = 0; j < d; ++j) o[j] += acc[j] * weight;
    }
    const float inv = 1.0f / sum;
    for (int32_t j = 0; j < d; ++j) o[j] *= inv;
    if (q.lse != nullptr) q.lse[head] = max + std::log(sum);
  }
}

absl::Status RunDecodeAttentionOmp(DecodeAttention& kernel, const DecodeKvLayout& layout,
                                   int32_t num_q_heads, float scale,
                                   absl::Span<const DecodeSequence> seqs, int32_t num_threads) {
  if (absl::Status s = kernel.Plan(layout, num_q_heads, scale, seqs, num_threads); !s.ok()) {
    return s;
  }
#pragma omp parallel num_threads(num_threads)
  {
    // libgomp may give fewer threads than asked (nesting, limits): the
    // threads it gives take the remaining slots in turn.
    const int32_t team = omp_get_num_threads();
    for (int32_t i = omp_get_thread_num(); i < num_threads; i += team) kernel.Run(i);
#pragma omp barrier
    for (int32_t i = omp_get_thread_num(); i < num_threads; i += team) kernel.Merge(i);
  }
  return absl::OkStatus();
}

namespace {

// What is wrong with entry `t` of AppendDecodeKv, or OK.
absl::Status CheckAppendEntry(const DecodeKvLayout& layout, const DecodeKvAppend& t, size_t i) {
  const bool f32 = t.k != nullptr || t.v != nullptr;
  const bool bf16 = t.k_bf16 != nullptr || t.v_bf16 != nullptr;
  const char* null_field = nullptr;
  if (t.kv == nullptr) {
    null_field = "kv";
  } else if (bf16 && !f32) {
    null_field = t.k_bf16 == nullptr ? "k_bf16" : t.v_bf16 == nullptr ? "v_bf16" : nullptr;
  } else {
    null_field = t.k == nullptr ? "k" : t.v == nullptr ? "v" : nullptr;
  }
  if (null_field != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tokens[", i, "].", null_field, " is null"));
  }
  if (f32 && bf16) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens[", i, "] has both f32 (k, v) and bf16 (k_bf16, v_bf16) rows"));
  }
  if (bf16 && layout.dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("tokens[", i, "] has bf16 rows for a ",
                                                   numeric::DTypeName(layout.dtype), " layout"));
  }
  if (t.position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens[", i, "].position is ", t.position, "; must be >= 0"));
  }
  return absl::OkStatus();
}

uint16_t ToBf16Bits(float x) { return numeric::FloatToBf16(x); }
uint16_t ToBf16Bits(uint16_t bits) { return bits; }

// One token into the pair packing (bf16, see DecodeKvElementOffset), from
// f32 or bf16 rows.
template <typename Src>
void AppendPairToken(const DecodeKvLayout& layout, const DecodeKvAppend& t, const Src* k_row,
                     const Src* v_row) {
  const int64_t bs = layout.block_size;
  const int32_t d = layout.head_dim;
  const int64_t slot = t.position % bs;
  uint16_t* block = static_cast<uint16_t*>(t.kv) + (t.position / bs) * layout.block_stride_elems;
  for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
    uint16_t* k = block + h * bs * d + 2 * slot;  // Word (0, slot).
    uint16_t* v = block + layout.value_offset_elems + h * bs * d + (slot / 2) * 2 * d + slot % 2;
    const Src* k_src = k_row + static_cast<int64_t>(h) * d;
    const Src* v_src = v_row + static_cast<int64_t>(h) * d;
    for (int32_t j = 0; j < d; j += 2) {
      k[j * bs] = ToBf16Bits(k_src[j]);  // Word (j / 2, slot) at j / 2 * 2 * bs.
      k[j * bs + 1] = ToBf16Bits(k_src[j + 1]);
    }
    for (int32_t j = 0; j < d; ++j) v[2 * j] = ToBf16Bits(v_src[j]);
  }
}

// One token into the row packing, from f32 rows (converted) or bf16 rows
// (a bf16 layout: copied).
void AppendRowToken(const DecodeKvLayout& layout, const DecodeKvAppend& t) {
  const int64_t elem_bytes = static_cast<int64_t>(numeric::ElementSize(layout.dtype));
  const int32_t d = layout.head_dim;
  for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
    const int64_t k_elem = DecodeKvElementOffset(layout, t.position, h, 0, false);
    for (const bool value : {false, true}) {
      char* dst = static_cast<char*>(t.kv) +
                  (k_elem + (value ? layout.value_offset_elems : 0)) * elem_bytes;
      const int64_t row = static_cast<int64_t>(h) * d;
      if (t.k_bf16 != nullptr) {
        std::memcpy(dst, (value ? t.v_bf16 : t.k_bf16) + row, sizeof(uint16_t) * d);
        continue;
      }
      const float* src = (value ? t.v : t.k) + row;
      switch (layout.dtype) {
        case DType::kF32:
          std::memcpy(dst, src, sizeof(float) * d);
          break;
        case DType::kBF16:
          numeric::FloatToBf16(src, reinterpret_cast<uint16_t*>(dst), d);
          break;
        case DType::kF16:
          for (int32_t j = 0; j < d; ++j) {
            reinterpret_cast<uint16_t*>(dst)[j] = numeric::FloatToHalf(src[j]);
          }
          break;
        case DType::kFP8E4M3:
          break;  // ValidateLayout refuses it.
      }
    }
  }
}

}  // namespace

absl::Status AppendDecodeKv(const DecodeKvLayout& layout, absl::Span<const DecodeKvAppend> tokens) {
  if (absl::Status s = ValidateLayout(layout, kMaxHeadDim); !s.ok()) return s;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (absl::Status s = CheckAppendEntry(layout, tokens[i], i); !s.ok()) return s;
  }
  for (const DecodeKvAppend& t : tokens) {
    if (layout.packing != DecodeKvPacking::kPairs) {
      AppendRowToken(layout, t);
    } else if (t.k_bf16 != nullptr) {
      AppendPairToken(layout, t, t.k_bf16, t.v_bf16);
    } else {
      AppendPairToken(layout, t, t.k, t.v);
    }
  }
  return absl::OkStatus();
}

int64_t DecodeKvElementOffset(const DecodeKvLayout& layout, int32_t token, int32_t head,
                              int32_t dim, bool value) {
  const int64_t bs = layout.block_size;
  const int64_t t = token % bs;
  const int64_t d = layout.head_dim;
  const int64_t tile = (token / bs) * layout.block_stride_elems + head * bs * d +
                       (value ? layout.value_offset_elems : 0);
  if (layout.packing == DecodeKvPacking::kRows) return tile + t * d + dim;
  return value ? tile + (t / 2) * 2 * d + 2 * dim + t % 2
               : tile + (dim / 2) * 2 * bs + 2 * t + dim % 2;
}

absl::string_view DecodeKvPackingName(DecodeKvPacking packing) {
  return packing == DecodeKvPacking::kPairs ? "pairs" : "rows";
}

absl::string_view DecodeIsaName(DecodeIsa isa) {
  switch (isa) {
    case DecodeIsa::kAuto:
      return "auto";
    case DecodeIsa::kAvx2:
      return "avx2";
    case DecodeIsa::kAvx512Bf16:
      return "avx512_bf16";
    case DecodeIsa::kAmx:
      return "amx";
  }
  return "unknown";
}

bool DecodeIsaAvailable(DecodeIsa isa) {
  const trident::cpu::CpuFeatures& f = trident::cpu::GetCpuFeatures();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512_bf16 = avx2 && f.avx512f && f.avx512_bf16;
  switch (isa) {
    case DecodeIsa::kAuto:
      return true;
    case DecodeIsa::kAvx2:
      return avx2;
    case DecodeIsa::kAvx512Bf16:
      return avx512_bf16;
    case DecodeIsa::kAmx:
#ifdef TRIDENT_DECODE_ATTENTION_AMX_EMULATION
      return avx512_bf16;  // Tiles emulated in scalar code (tests only).
#endif
      return avx512_bf16 && f.amx_tile && f.amx_bf16;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<DecodeAttention>> DecodeAttention::Create(
    const DecodeAttentionOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  absl::StatusOr<DecodeIsa> isa = ResolveIsa(options.isa);
  if (!isa.ok()) return isa.status();

  auto state = std::make_unique<State>();
  state->kernels = KernelsFor(*isa);
  state->max_group = options.max_q_heads;
  state->max_head_dim = options.max_head_dim;
  const int64_t group_dims = static_cast<int64_t>(options.max_q_heads) * options.max_head_dim;
  const int64_t padded_group_dims =
      static_cast<int64_t>(RoundUp16(options.max_q_heads)) * options.max_head_dim;
  // Thread region: q16, q32, p, pad, then acc, max, sum of a whole-context segment.
  state->thread_bytes = RoundToLines(padded_group_dims * 2) + RoundToLines(group_dims * 4) +
                        RoundToLines(static_cast<size_t>(RoundUp16(options.max_q_heads)) *
                                     decode_internal::kTileTokens * 4) +
                        RoundToLines(16 * kMaxHeadDim * 2) +
                        RoundToLines(RoundUp16(options.max_q_heads) * 4) +
                        RoundToLines((group_dims + 2 * options.max_q_heads) * 4);
  state->slot_floats =
      static_cast<int64_t>(RoundToLines((group_dims + 2 * options.max_q_heads) * 4) / 4);
  // A thread's token range cuts at most two (sequence, kv head) pairs: its
  // first and its last segment; the ones between are whole.
  const int64_t max_slots = 2 * static_cast<int64_t>(options.max_threads);
  state->thread_scratch.reset(
      static_cast<char*>(std::aligned_alloc(64, state->thread_bytes * options.max_threads)));
  state->partials.reset(
      static_cast<float*>(std::aligned_alloc(64, state->slot_floats * 4 * max_slots)));
  if (state->thread_scratch == nullptr || state->partials == nullptr) {
    return absl::ResourceExhaustedError("decode attention scratch allocation failed");
  }
  // The pad tile is zero in its unused rows and columns; see the AMX kernel.
  std::fill_n(state->thread_scratch.get(), state->thread_bytes * options.max_threads, 0);
  state->seqs.reserve(options.max_sequences);
  state->segments.reserve(static_cast<size_t>(options.max_sequences) + options.max_threads);
  state->thread_first_segment.reserve(options.max_threads + 1);
  state->splits.reserve(max_slots);
  return std::unique_ptr<DecodeAttention>(new DecodeAttention(options, *isa, std::move(state)));
}

DecodeAttention::DecodeAttention(const DecodeAttentionOptions& options, DecodeIsa isa,
                                 std::unique_ptr<State> state)
    : options_(options), isa_(isa), state_(std::move(state)) {}

DecodeAttention::~DecodeAttention() = default;

int32_t DecodeAttention::planned_threads() const { return state_->num_threads; }

absl::Status DecodeAttention::Plan(const DecodeKvLayout& layout, int32_t num_q_heads, float scale,
                                   absl::Span<const DecodeSequence> seqs, int32_t num_threads) {
  State& s = *state_;
  s.num_threads = 0;
  if (absl::Status st = ValidateLayout(layout, options_.max_head_dim); !st.ok()) return st;
  if (num_q_heads < 1 || num_q_heads % layout.num_kv_heads != 0 ||
      num_q_heads > options_.max_q_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_q_heads is ", num_q_heads, "; must be a positive multiple of layout.num_kv_heads (",
        layout.num_kv_heads, ") and <= options.max_q_heads (", options_.max_q_heads, ")"));
  }
  if (!std::isfinite(scale)) {
    return absl::InvalidArgumentError(absl::StrCat("scale is ", scale, "; must be finite"));
  }
  if (num_threads < 1 || num_threads > options_.max_threads) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_threads is ", num_threads,
                     "; must be in [1, options.max_threads = ", options_.max_threads, "]"));
  }
  if (seqs.size() > static_cast<size_t>(options_.max_sequences)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seqs has ", seqs.size(), " sequences; options.max_sequences is ", options_.max_sequences));
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DecodeSequence& q = seqs[i];
    const char* null_field = q.kv == nullptr && q.blocks == nullptr ? "kv"
                             : q.q == nullptr                         ? "q"
                             : q.o == nullptr ? "o"
                                              : nullptr;
    if (null_field != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("seqs[", i, "].", null_field, " is null"));
    }
    if (q.context_len < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("seqs[", i, "].context_len is ", q.context_len, "; must be >= 1"));
    }
    if (q.blocks != nullptr && layout.packing != DecodeKvPacking::kRows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "seqs[", i, "].blocks is set; a block table needs layout.packing rows, not ",
          DecodeKvPackingName(layout.packing)));
    }
  }
  s.layout = layout;
  s.num_q_heads = num_q_heads;
  s.group = num_q_heads / layout.num_kv_heads;
  s.scale = scale;
  s.seqs.assign(seqs.begin(), seqs.end());
  SplitWork(s, num_threads);
  s.num_threads = num_threads;
  return absl::OkStatus();
}

}  // namespace trident::kernels::cpu
