#include "services/attention/kv_store/sequence_store.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"

namespace trident::attention {
namespace {

constexpr int kMaxSequenceIdBytes = 128;
constexpr int kMaxHeadDim = 256;
constexpr int kMaxBlockSize = 1024;
// A sequence's whole KV must stay addressable with 64-bit strides and fit a
// plausible budget; this only rejects absurd requests early.
constexpr int64_t kMaxSequenceTokens = int64_t{1} << 24;

absl::Status Positive(const char* field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, " must be > 0, got ", value));
}

}  // namespace

absl::StatusOr<SequenceLayout> LayoutFor(const SequenceSpec& spec) {
  TRIDENT_RETURN_IF_ERROR(Positive("num_layers", spec.num_layers));
  TRIDENT_RETURN_IF_ERROR(Positive("num_attention_heads", spec.num_q_heads));
  TRIDENT_RETURN_IF_ERROR(Positive("num_kv_heads", spec.num_kv_heads));
  TRIDENT_RETURN_IF_ERROR(Positive("head_dim", spec.head_dim));
  TRIDENT_RETURN_IF_ERROR(Positive("capacity_tokens", spec.capacity_tokens));
  if (spec.block_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_size_tokens must be >= 0 (0: the service's choice), got ", spec.block_size));
  }
  KvPacking packing = spec.packing;
  if (packing == KvPacking::kAuto) {
    packing = spec.dtype == numeric::DType::kBF16 ? KvPacking::kPairs : KvPacking::kRows;
  }
  if (packing == KvPacking::kPairs && spec.dtype != numeric::DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_layout KV_BLOCK_LAYOUT_HEAD_VNNI_PAIRS needs bf16 KV, got ",
                     numeric::DTypeName(spec.dtype)));
  }
  int32_t block_size = spec.block_size;
  if (block_size == 0) block_size = packing == KvPacking::kPairs ? 32 : 16;
  if (packing == KvPacking::kPairs) block_size = (block_size + 31) / 32 * 32;
  if (spec.num_q_heads % spec.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads (", spec.num_q_heads,
                                                   ") must be a multiple of num_kv_heads (",
                                                   spec.num_kv_heads, ")"));
  }
  if (spec.head_dim % 16 != 0 || spec.head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim must be a multiple of 16 and at most ",
                                                   kMaxHeadDim, ", got ", spec.head_dim));
  }
  if (block_size > kMaxBlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("block_size_tokens must be at most ",
                                                   kMaxBlockSize, ", got ", spec.block_size));
  }
  if (spec.capacity_tokens > kMaxSequenceTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity_tokens must be at most ", kMaxSequenceTokens, ", got ", spec.capacity_tokens));
  }
  SequenceLayout layout;
  layout.num_layers = spec.num_layers;
  layout.num_q_heads = spec.num_q_heads;
  layout.num_kv_heads = spec.num_kv_heads;
  layout.head_dim = spec.head_dim;
  layout.dtype = spec.dtype;
  layout.block_size = block_size;
  layout.packing = packing;
  const int64_t blocks = (int64_t{spec.capacity_tokens} + block_size - 1) / block_size;
  layout.capacity_tokens = static_cast<int32_t>(blocks * block_size);
  layout.value_offset_bytes = static_cast<uint64_t>(spec.num_kv_heads) * block_size *
                              spec.head_dim * numeric::ElementSize(spec.dtype);
  layout.block_stride_bytes = 2 * layout.value_offset_bytes;
  layout.layer_stride_bytes = static_cast<uint64_t>(blocks) * layout.block_stride_bytes;
  return layout;
}

const char* SequenceBlock(const PinnedSequence& s, int32_t layer, int32_t block) {
  const SequenceLayout& l = *s.layout;
  if (block < l.prefix_blocks) return s.prefix[block] + layer * l.block_stride_bytes;
  return s.data + layer * l.layer_stride_bytes + (block - l.prefix_blocks) * l.block_stride_bytes;
}

uint64_t LayoutBytes(const SequenceLayout& layout) {
  return static_cast<uint64_t>(layout.num_layers) * layout.layer_stride_bytes;
}

SequenceStore::SequenceStore(KvPool* pool, Clock* clock, SequenceStoreOptions options)
    : pool_(pool), clock_(clock), options_(options) {}

SequenceStore::~SequenceStore() {
  absl::MutexLock lock(&mu_);
  for (auto& [handle, sequence] : sequences_) {
    pool_->Free(sequence->span);
    if (sequence->prefix.release) sequence->prefix.release();
  }
}

absl::Status SequenceStore::CheckSession(const std::string& owner_id, uint64_t incarnation) const {
  auto it = sessions_.find(owner_id);
  if (it == sessions_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("owner '", owner_id, "' has no session here: call Connect first"));
  }
  if (it->second.incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("owner '", owner_id, "' names incarnation ", incarnation,
                     " but its session is incarnation ", it->second.incarnation));
  }
  return absl::OkStatus();
}

absl::Status SequenceStore::CheckOwner(const std::string& owner_id, uint64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  return CheckSession(owner_id, incarnation);
}

absl::StatusOr<int> SequenceStore::Connect(const std::string& owner_id, uint64_t incarnation) {
  if (owner_id.empty()) return absl::InvalidArgumentError("client.owner_id must be set");
  if (incarnation == 0) return absl::InvalidArgumentError("client.incarnation must be set");
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(owner_id);
  if (it != sessions_.end() && it->second.incarnation == incarnation) {
    it->second.ends_at = absl::InfiniteFuture();
    return 0;
  }
  int freed = 0;
  if (it != sessions_.end()) {
    freed = EndSessionLocked(owner_id);
    TRIDENT_LOG(INFO) << "owner " << owner_id << " connected with a new incarnation " << incarnation
                      << ": its old session's " << freed << " sequences freed";
  }
  sessions_[owner_id].incarnation = incarnation;
  return freed;
}

void SequenceStore::OwnerUnreachable(const std::string& owner_id, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(owner_id);
  if (it == sessions_.end() || it->second.incarnation != incarnation) return;
  if (it->second.ends_at == absl::InfiniteFuture()) {
    it->second.ends_at = clock_->Now() + options_.reconnect_grace;
    TRIDENT_LOG(WARNING) << "owner " << owner_id << " unreachable: its "
                         << it->second.handles_by_sequence_id.size()
                         << " sequences are freed unless it reconnects within "
                         << absl::FormatDuration(options_.reconnect_grace);
  }
}

absl::StatusOr<AdmittedSequence> SequenceStore::Admit(const SequenceSpec& spec,
                                                      InPlacePrefix prefix) {
  // The borrow goes back on every error path.
  absl::Cleanup give_back = [&prefix] {
    if (prefix.release) prefix.release();
  };
  TRIDENT_ASSIGN_OR_RETURN(SequenceLayout layout, LayoutFor(spec));
  if (!prefix.blocks.empty()) {
    const int64_t prefix_tokens = static_cast<int64_t>(prefix.blocks.size()) * layout.block_size;
    if (layout.packing != KvPacking::kRows || prefix_tokens >= layout.capacity_tokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "an in-place prefix of ", prefix_tokens, " tokens needs the rows layout and a longer "
          "capacity than ", layout.capacity_tokens, " tokens"));
    }
    layout.prefix_blocks = static_cast<int32_t>(prefix.blocks.size());
    layout.layer_stride_bytes -= layout.prefix_blocks * layout.block_stride_bytes;
  }
  absl::StatusOr<AdmittedSequence> admitted = AdmitLayout(spec, layout);
  if (!admitted.ok()) return admitted;
  std::move(give_back).Cancel();
  absl::MutexLock lock(&mu_);
  sequences_.at(admitted->handle)->prefix = std::move(prefix);
  return admitted;
}

absl::StatusOr<AdmittedSequence> SequenceStore::AdmitLayout(const SequenceSpec& spec,
                                                            const SequenceLayout& layout) {
  if (spec.sequence_id.empty()) return absl::InvalidArgumentError("sequence_id must be set");
  if (spec.sequence_id.size() > kMaxSequenceIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("sequence_id is ", spec.sequence_id.size(),
                                                   " bytes; at most ", kMaxSequenceIdBytes));
  }
  if (spec.idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("idle_timeout must not be negative");
  }
  {
    absl::MutexLock lock(&mu_);
    TRIDENT_RETURN_IF_ERROR(CheckSession(spec.owner_id, spec.owner_incarnation));
    if (sessions_[spec.owner_id].handles_by_sequence_id.contains(spec.sequence_id)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "owner '", spec.owner_id, "' already has sequence '", spec.sequence_id, "'"));
    }
  }
  // The memory is taken outside the lock (a NUMA pool may fault pages in);
  // the session is checked again below.
  absl::StatusOr<KvSpan> allocated = pool_->Allocate(LayoutBytes(layout));
  if (!allocated.ok()) {
    return absl::Status(
        allocated.status().code(),
        absl::StrCat("the KV memory budget cannot hold sequence '", spec.sequence_id, "' (",
                     LayoutBytes(layout), " bytes for ", layout.capacity_tokens,
                     " tokens): ", allocated.status().message()));
  }
  const KvSpan span = *allocated;
  absl::MutexLock lock(&mu_);
  absl::Status still_valid = CheckSession(spec.owner_id, spec.owner_incarnation);
  Session* session = still_valid.ok() ? &sessions_[spec.owner_id] : nullptr;
  if (still_valid.ok() && session->handles_by_sequence_id.contains(spec.sequence_id)) {
    still_valid = absl::AlreadyExistsError(
        absl::StrCat("owner '", spec.owner_id, "' already has sequence '", spec.sequence_id, "'"));
  }
  if (!still_valid.ok()) {
    pool_->Free(span);
    return still_valid;
  }
  auto sequence = std::make_unique<Sequence>();
  sequence->handle = next_handle_++;
  sequence->write_key =
      absl::Uniform<uint64_t>(absl::IntervalClosed, keys_, 1, std::numeric_limits<uint64_t>::max());
  sequence->owner_id = spec.owner_id;
  sequence->owner_incarnation = spec.owner_incarnation;
  sequence->sequence_id = spec.sequence_id;
  sequence->layout = layout;
  sequence->span = span;
  sequence->last_used = clock_->Now();
  sequence->idle_timeout =
      spec.idle_timeout > absl::ZeroDuration() ? spec.idle_timeout : options_.default_idle_timeout;
  AdmittedSequence admitted{.handle = sequence->handle,
                            .write_key = sequence->write_key,
                            .layout = layout,
                            .data = span.data,
                            .reserved_bytes = span.bytes};
  session->handles_by_sequence_id[spec.sequence_id] = sequence->handle;
  held_bytes_ += static_cast<int64_t>(span.bytes);
  sequences_[sequence->handle] = std::move(sequence);
  return admitted;
}

absl::StatusOr<int64_t> SequenceStore::Release(const std::string& owner_id, uint64_t incarnation,
                                               uint64_t handle) {
  absl::MutexLock lock(&mu_);
  TRIDENT_RETURN_IF_ERROR(CheckSession(owner_id, incarnation));
  auto it = sequences_.find(handle);
  if (it == sequences_.end() || it->second->freed || it->second->owner_id != owner_id) return 0;
  return FreeLocked(handle, FreeCause::kReleased);
}

int64_t SequenceStore::FreeLocked(uint64_t handle, FreeCause cause) {
  auto it = sequences_.find(handle);
  Sequence& sequence = *it->second;
  const int64_t bytes = static_cast<int64_t>(sequence.span.bytes);
  auto session = sessions_.find(sequence.owner_id);
  if (session != sessions_.end())
    session->second.handles_by_sequence_id.erase(sequence.sequence_id);
  switch (cause) {
    case FreeCause::kReleased:
      ++released_;
      break;
    case FreeCause::kSessionEnded:
      ++freed_session_ended_;
      break;
    case FreeCause::kIdle:
      ++freed_idle_;
      break;
  }
  if (sequence.pins > 0) {
    sequence.freed = true;
    return bytes;
  }
  EraseLocked(it);
  return bytes;
}

void SequenceStore::EraseLocked(
    absl::flat_hash_map<uint64_t, std::unique_ptr<Sequence>>::iterator it) {
  Sequence& sequence = *it->second;
  pool_->Free(sequence.span);
  held_bytes_ -= static_cast<int64_t>(sequence.span.bytes);
  if (sequence.prefix.release) sequence.prefix.release();
  sequences_.erase(it);
}

int SequenceStore::EndSessionLocked(const std::string& owner_id) {
  auto it = sessions_.find(owner_id);
  std::vector<uint64_t> handles;
  for (const auto& [id, handle] : it->second.handles_by_sequence_id) handles.push_back(handle);
  for (uint64_t handle : handles) FreeLocked(handle, FreeCause::kSessionEnded);
  sessions_.erase(owner_id);
  return static_cast<int>(handles.size());
}

absl::Status SequenceStore::Pin(const Access& access, absl::Span<const uint64_t> handles,
                                absl::Span<const int32_t> positions,
                                absl::Span<PinnedSequence> out) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < handles.size(); ++i) {
    auto it = sequences_.find(handles[i]);
    if (it == sequences_.end() || it->second->freed) {
      return absl::NotFoundError(absl::StrCat("sequence handle ", handles[i], " is not held"));
    }
    const Sequence& sequence = *it->second;
    if (access.write_key != 0) {
      if (sequence.write_key != access.write_key) {
        return absl::FailedPreconditionError(
            absl::StrCat("wrong write key for sequence handle ", handles[i]));
      }
      if (sequence.attended) {
        return absl::FailedPreconditionError(
            absl::StrCat("sequence handle ", handles[i],
                         " takes no more prompt writes: its owner has attended"));
      }
    } else if (sequence.owner_incarnation != access.owner_incarnation) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence handle ", handles[i], " belongs to incarnation ",
                       sequence.owner_incarnation, ", not ", access.owner_incarnation));
    }
    if (positions[i] < 0 || positions[i] >= sequence.layout.capacity_tokens) {
      return absl::OutOfRangeError(absl::StrCat("position ", positions[i], " of sequence handle ",
                                                handles[i], " is outside its capacity of ",
                                                sequence.layout.capacity_tokens, " tokens"));
    }
    const int32_t read_only = sequence.layout.prefix_blocks * sequence.layout.block_size;
    if (positions[i] < read_only) {
      return absl::OutOfRangeError(absl::StrCat(
          "position ", positions[i], " of sequence handle ", handles[i],
          " is in its in-place prefix (tokens [0, ", read_only, ")), which takes no writes"));
    }
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    Sequence& sequence = *sequences_[handles[i]];
    ++sequence.pins;
    sequence.attended = sequence.attended || access.attends;
    sequence.tokens = std::max(sequence.tokens, positions[i] + 1);
    sequence.last_used = now;
    out[i] = PinnedSequence{.handle = sequence.handle,
                            .layout = &sequence.layout,
                            .data = sequence.span.data,
                            .prefix = sequence.prefix.blocks.data()};
  }
  return absl::OkStatus();
}

void SequenceStore::Unpin(absl::Span<const uint64_t> handles) {
  absl::MutexLock lock(&mu_);
  for (uint64_t handle : handles) {
    auto it = sequences_.find(handle);
    if (it == sequences_.end()) continue;
    Sequence& sequence = *it->second;
    if (--sequence.pins > 0 || !sequence.freed) continue;
    EraseLocked(it);
  }
}

int SequenceStore::Sweep() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  int freed = 0;
  std::vector<std::string> ended;
  for (const auto& [owner_id, session] : sessions_) {
    if (session.ends_at <= now) ended.push_back(owner_id);
  }
  for (const std::string& owner_id : ended) {
    const int count = EndSessionLocked(owner_id);
    TRIDENT_LOG(WARNING) << "owner " << owner_id << " did not reconnect within its grace: " << count
                         << " sequences freed";
    freed += count;
  }
  std::vector<uint64_t> idle;
  for (const auto& [handle, sequence] : sequences_) {
    if (!sequence->freed && sequence->pins == 0 &&
        sequence->last_used + sequence->idle_timeout <= now) {
      idle.push_back(handle);
    }
  }
  for (uint64_t handle : idle) {
    TRIDENT_LOG(WARNING) << "sequence handle " << handle << " ('" << sequences_[handle]->sequence_id
                         << "' of " << sequences_[handle]->owner_id
                         << ") idle past its timeout: freed";
    FreeLocked(handle, FreeCause::kIdle);
  }
  return freed + static_cast<int>(idle.size());
}

SequenceStoreStats SequenceStore::Stats() const {
  absl::MutexLock lock(&mu_);
  SequenceStoreStats stats;
  stats.sessions = static_cast<int32_t>(sessions_.size());
  for (const auto& [handle, sequence] : sequences_) {
    if (sequence->freed) continue;
    ++stats.sequences;
    stats.held_tokens += sequence->tokens;
    if (sequence->layout.prefix_blocks > 0) {
      ++stats.in_place_sequences;
      stats.in_place_tokens +=
          int64_t{sequence->layout.prefix_blocks} * sequence->layout.block_size;
    }
  }
  stats.held_bytes = held_bytes_;
  stats.capacity_bytes = static_cast<int64_t>(pool_->capacity_bytes());
  stats.released = released_;
  stats.freed_session_ended = freed_session_ended_;
  stats.freed_idle = freed_idle_;
  return stats;
}

std::vector<uint64_t> SequenceStore::HandlesOf(const std::string& owner_id) const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> handles;
  auto it = sessions_.find(owner_id);
  if (it == sessions_.end()) return handles;
  for (const auto& [id, handle] : it->second.handles_by_sequence_id) handles.push_back(handle);
  std::sort(handles.begin(), handles.end());
  return handles;
}

}  // namespace trident::attention
