#include "services/attention/kv_attention_computer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/fault/fault_points.h"
#include "common/logging/log.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"

namespace trident::attention {
namespace {

using transport::attention::FromWire;
using transport::attention::QkvRowElements;
using transport::attention::RequestView;
using transport::attention::ToWire;
using transport::attention::WireElementSize;

// K of block 0 of `layer` (the kernel's DecodeSequence::kv and
// DecodeKvAppend::kv address block 0 of a uniform block run); a sequence
// with an in-place prefix has none (its blocks go through a table).
char* LayerBase(const PinnedSequence& s, int32_t layer) {
  return s.data + layer * s.layout->layer_stride_bytes;
}

// Whether two sequences' KV reads with one kernel layout.
bool SameKernelLayout(const SequenceLayout& a, const SequenceLayout& b) {
  return a.block_size == b.block_size && a.packing == b.packing &&
         a.block_stride_bytes == b.block_stride_bytes &&
         a.value_offset_bytes == b.value_offset_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvAttentionComputer>> KvAttentionComputer::Create(
    SequenceStore* store, Executor executor, kernels::cpu::DecodeIsa isa) {
  TRIDENT_ASSIGN_OR_RETURN(
      std::unique_ptr<kernels::cpu::DecodeAttention> kernel,
      kernels::cpu::DecodeAttention::Create({.max_threads = executor.threads,
                                             .max_sequences = kMaxSequences,
                                             .max_q_heads = kMaxQHeads,
                                             .max_head_dim = transport::attention::kMaxHeadDim,
                                             .isa = isa}));
  return std::unique_ptr<KvAttentionComputer>(
      new KvAttentionComputer(store, std::move(executor), std::move(kernel)));
}

KvAttentionComputer::KvAttentionComputer(SequenceStore* store, Executor executor,
                                         std::unique_ptr<kernels::cpu::DecodeAttention> kernel)
    : store_(store), executor_(std::move(executor)), kernel_(std::move(kernel)) {}

kernels::cpu::DecodeKvLayout KvAttentionComputer::KernelLayout(const SequenceLayout& layout) {
  const int64_t element = static_cast<int64_t>(numeric::ElementSize(layout.dtype));
  return kernels::cpu::DecodeKvLayout{
      .dtype = layout.dtype,
      .num_kv_heads = layout.num_kv_heads,
      .head_dim = layout.head_dim,
      .block_size = layout.block_size,
      .block_stride_elems = static_cast<int64_t>(layout.block_stride_bytes) / element,
      .value_offset_elems = static_cast<int64_t>(layout.value_offset_bytes) / element,
      .packing = layout.packing == KvPacking::kPairs ? kernels::cpu::DecodeKvPacking::kPairs
                                                     : kernels::cpu::DecodeKvPacking::kRows};
}

absl::Status KvAttentionComputer::Compute(const RequestView& request, char* reply_rows) {
  TRIDENT_RETURN_IF_ERROR(fault::FaultPoint("attention.step"));
  const int32_t n = request.header.num_sequences;
  handles_.resize(n);
  positions_.resize(n);
  pinned_.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    handles_[i] = request.sequences[i].handle;
    positions_[i] = request.sequences[i].position;
  }
  const transport::attention::RequestHeader& h = request.header;
  const SequenceStore::Access access{.owner_incarnation = h.owner_incarnation,
                                     .write_key = h.write_key,
                                     .attends = (h.flags & transport::attention::kAppendOnly) == 0};
  TRIDENT_RETURN_IF_ERROR(store_->Pin(access, handles_, positions_, absl::MakeSpan(pinned_)));
  absl::Cleanup unpin = [this] { store_->Unpin(handles_); };
  TRIDENT_RETURN_IF_ERROR(CheckShapes(request));
  Append(request);
  if ((request.header.flags & transport::attention::kAppendOnly) != 0) return absl::OkStatus();
  return Attend(request, reply_rows);
}

absl::Status KvAttentionComputer::CheckShapes(const RequestView& request) const {
  const transport::attention::RequestHeader& h = request.header;
  for (const PinnedSequence& s : pinned_) {
    const SequenceLayout& l = *s.layout;
    const bool append_only = (h.flags & transport::attention::kAppendOnly) != 0;
    if ((!append_only && l.num_q_heads != h.num_q_heads) || l.num_kv_heads != h.num_kv_heads ||
        l.head_dim != h.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence handle ", s.handle, " was admitted with ", l.num_q_heads, " q heads, ",
          l.num_kv_heads, " kv heads and head_dim ", l.head_dim, "; the request has ",
          h.num_q_heads, ", ", h.num_kv_heads, " and ", h.head_dim));
    }
    const SequenceLayout& first = *pinned_.front().layout;
    if (l.dtype != first.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence handles ", pinned_.front().handle, " and ", s.handle,
                       " differ in KV dtype; one request must not mix them"));
    }
    if (h.layer < 0 || h.layer >= l.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", h.layer, " of sequence handle ",
                                                     s.handle, " is outside its ", l.num_layers,
                                                     " layers"));
    }
  }
  return absl::OkStatus();
}

void KvAttentionComputer::ForRanges(size_t n, const std::function<void(size_t, size_t)>& fn) {
  const size_t threads =
      n >= kParallelRows ? std::min(n, static_cast<size_t>(std::max(1, executor_.threads))) : 1;
  if (threads == 1) {
    fn(0, n);
    return;
  }
  executor_.run([&](int thread) {
    const size_t t = static_cast<size_t>(thread);
    if (t >= threads) return;
    const size_t begin = n * t / threads, end = n * (t + 1) / threads;
    if (begin < end) fn(begin, end);
  });
}

void KvAttentionComputer::Append(const RequestView& request) {
  const transport::attention::RequestHeader& h = request.header;
  const bool append_only = (h.flags & transport::attention::kAppendOnly) != 0;
  const size_t n = static_cast<size_t>(h.num_sequences);
  // bf16 on the wire into a bf16 store: the rows go in as they are, with no
  // f32 copy of k and v.
  const bool raw = h.dtype == transport::attention::WireDType::kBF16 &&
                   pinned_.front().layout->dtype == numeric::DType::kBF16;
  q_.resize(n * (append_only ? 0 : int64_t{h.num_q_heads} * h.head_dim));
  if (!raw) {
    k_.resize(n * int64_t{h.num_kv_heads} * h.head_dim);
    v_.resize(k_.size());
  }
  appends_.resize(n);
  // Entries are independent: a decode step's sequences, or a migration's
  // chunk of tokens, split over the threads (which also holds the
  // dispatcher, and the decode steps queued behind it, as briefly as it
  // can).
  ForRanges(n, [&](size_t begin, size_t end) { AppendRange(request, raw, begin, end); });
}

void KvAttentionComputer::AppendRange(const RequestView& request, bool raw, size_t begin,
                                      size_t end) {
  const transport::attention::RequestHeader& h = request.header;
  const int64_t row = QkvRowElements(h);
  const bool append_only = (h.flags & transport::attention::kAppendOnly) != 0;
  const int64_t q_elems = append_only ? 0 : int64_t{h.num_q_heads} * h.head_dim;
  const int64_t kv_elems = int64_t{h.num_kv_heads} * h.head_dim;
  const size_t element = WireElementSize(h.dtype);
  for (size_t i = begin; i < end; ++i) {
    const char* wire = request.rows + i * row * element;
    if (!append_only) FromWire(h.dtype, wire, &q_[i * q_elems], q_elems);
    kernels::cpu::DecodeKvAppend& append = appends_[i];
    const PinnedSequence& s = pinned_[i];
    if (s.layout->prefix_blocks > 0) {
      // Its block, addressed as block 0 (Pin kept the position past the
      // read-only prefix).
      const int32_t bs = s.layout->block_size;
      append = kernels::cpu::DecodeKvAppend{
          .kv = const_cast<char*>(SequenceBlock(s, h.layer, positions_[i] / bs)),
          .position = positions_[i] % bs};
    } else {
      append = kernels::cpu::DecodeKvAppend{.kv = LayerBase(s, h.layer), .position = positions_[i]};
    }
    const char* k_wire = wire + q_elems * element;
    const char* v_wire = wire + (q_elems + kv_elems) * element;
    if (raw) {
      append.k_bf16 = reinterpret_cast<const uint16_t*>(k_wire);
      append.v_bf16 = reinterpret_cast<const uint16_t*>(v_wire);
      continue;
    }
    FromWire(h.dtype, k_wire, &k_[i * kv_elems], kv_elems);
    FromWire(h.dtype, v_wire, &v_[i * kv_elems], kv_elems);
    append.k = &k_[i * kv_elems];
    append.v = &v_[i * kv_elems];
  }
  // CheckShapes made the shapes agree and Pin the positions fit; runs of
  // one layout at a time.
  for (size_t run = begin; run < end;) {
    size_t run_end = run + 1;
    while (run_end < end && SameKernelLayout(*pinned_[run].layout, *pinned_[run_end].layout)) {
      ++run_end;
    }
    TRIDENT_CHECK_OK(
        kernels::cpu::AppendDecodeKv(KernelLayout(*pinned_[run].layout),
                                     absl::MakeConstSpan(appends_).subspan(run, run_end - run)));
    run = run_end;
  }
}

absl::Status KvAttentionComputer::Attend(const RequestView& request, char* reply_rows) {
  const transport::attention::RequestHeader& h = request.header;
  const int64_t q_elems = int64_t{h.num_q_heads} * h.head_dim;
  const size_t n = static_cast<size_t>(h.num_sequences);
  o_.resize(n * q_elems);
  // Block tables of the sequences with an in-place prefix, sized first so
  // that pointers into them stay put.
  size_t table_entries = 0;
  for (size_t i = 0; i < n; ++i) {
    const SequenceLayout& l = *pinned_[i].layout;
    if (l.prefix_blocks > 0) table_entries += (positions_[i] + l.block_size) / l.block_size;
  }
  tables_.resize(table_entries);
  size_t table_used = 0;
  int64_t bytes = 0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(h.head_dim));
  // One kernel call per layout among the request's sequences (usually one).
  done_.assign(n, false);
  for (size_t first = 0; first < n; ++first) {
    if (done_[first]) continue;
    const SequenceLayout& layout = *pinned_[first].layout;
    sequences_.clear();
    for (size_t i = first; i < n; ++i) {
      const PinnedSequence& s = pinned_[i];
      if (done_[i] || !SameKernelLayout(layout, *s.layout)) continue;
      done_[i] = true;
      kernels::cpu::DecodeSequence seq{.context_len = positions_[i] + 1,
                                       .q = &q_[i * q_elems],
                                       .o = &o_[i * q_elems]};
      if (s.layout->prefix_blocks > 0) {
        const int32_t blocks = (positions_[i] + s.layout->block_size) / s.layout->block_size;
        const void** table = &tables_[table_used];
        for (int32_t b = 0; b < blocks; ++b) table[b] = SequenceBlock(s, h.layer, b);
        table_used += static_cast<size_t>(blocks);
        seq.blocks = table;
      } else {
        seq.kv = LayerBase(s, h.layer);
      }
      sequences_.push_back(seq);
      bytes += int64_t{positions_[i] + 1} * 2 * h.num_kv_heads * h.head_dim *
               static_cast<int64_t>(numeric::ElementSize(s.layout->dtype));
    }
    TRIDENT_RETURN_IF_ERROR(
        kernel_->Plan(KernelLayout(layout), h.num_q_heads, scale, sequences_, executor_.threads));
    kernels::cpu::DecodeAttention* kernel = kernel_.get();
    executor_.run([kernel](int thread) { kernel->Run(thread); });
    executor_.run([kernel](int thread) { kernel->Merge(thread); });
  }
  kv_bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
  const size_t element = WireElementSize(h.dtype);
  ForRanges(n, [&](size_t begin, size_t end) {
    ToWire(h.dtype, &o_[begin * q_elems], reply_rows + begin * q_elems * element,
           (end - begin) * q_elems);
  });
  return absl::OkStatus();
}

absl::StatusOr<size_t> KvAttentionComputer::BlockGetBytes(
    const transport::attention::RequestView& request) {
  if (blocks_ == nullptr) return absl::UnimplementedError("this service has no block store");
  return static_cast<size_t>(request.header.num_sequences) * blocks_->block_bytes();
}

absl::Status KvAttentionComputer::ServeBlocks(const transport::attention::RequestView& request,
                                              char* reply) {
  if (blocks_ == nullptr) return absl::UnimplementedError("this service has no block store");
  const transport::attention::RequestHeader& h = request.header;
  if ((h.flags & transport::attention::kAppendOnly) != 0) {
    return blocks_->Write(
        h.owner_incarnation, h.write_key, h.layer, h.num_sequences, request.rows,
        request.block_bytes,
        [this](absl::Span<const BlockStore::BlockCopy> copies) { CopyInParallel(copies); });
  }
  return blocks_->Read(
      h.owner_incarnation, h.write_key, h.layer, h.num_sequences, reply,
      static_cast<size_t>(h.num_sequences) * blocks_->block_bytes(),
      [this](absl::Span<const BlockStore::BlockCopy> copies) { CopyInParallel(copies); });
}

void KvAttentionComputer::CopyInParallel(absl::Span<const BlockStore::BlockCopy> copies) {
  size_t total = 0;
  for (const BlockStore::BlockCopy& c : copies) total += c.bytes;
  const size_t threads = std::max(1, executor_.threads);
  if (threads == 1 || total < kParallelCopyBytes) {
    for (const BlockStore::BlockCopy& c : copies) std::memcpy(c.to, c.from, c.bytes);
    return;
  }
  executor_.run([&](int thread) { CopyPart(copies, threads, static_cast<size_t>(thread)); });
}

}  // namespace trident::attention
