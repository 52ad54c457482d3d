#include "services/worker/offload/service_kv_copier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/numeric/dtype.h"
#include "common/status/status_macros.h"

namespace trident::worker {

namespace attention = transport::attention;

absl::StatusOr<std::unique_ptr<ServiceKvCopier>> ServiceKvCopier::Create(
    const backend::ModelBackend& backend) {
  TRIDENT_ASSIGN_OR_RETURN(backend::KvMemory memory, backend.kv_memory());
  std::unique_ptr<backend::KvCopier> copier;
  if (memory.device) {
    // Each layer's blocks are staged through host memory.
    TRIDENT_ASSIGN_OR_RETURN(copier, backend.CreateKvCopier());
  }
  return std::unique_ptr<ServiceKvCopier>(new ServiceKvCopier(memory, std::move(copier)));
}

ServiceKvCopier::ServiceKvCopier(backend::KvMemory memory,
                                 std::unique_ptr<backend::KvCopier> copier)
    : memory_(memory),
      copier_(std::move(copier)),
      wire_dtype_(memory.spec.dtype == numeric::DType::kBF16 ? attention::WireDType::kBF16
                                                             : attention::WireDType::kF32) {}

absl::Status ServiceKvCopier::StageLayer(absl::Span<const int32_t> blocks, int32_t first,
                                         int32_t last, int32_t layer, Scratch& scratch) const {
  const kv::KvCacheSpec& spec = memory_.spec;
  const int32_t first_block = first / spec.block_size;
  const int32_t count = (last + spec.block_size - 1) / spec.block_size - first_block;
  scratch.block_data.resize(count);
  if (copier_ == nullptr) {
    for (int32_t i = 0; i < count; ++i) {
      scratch.block_data[i] = static_cast<const char*>(memory_.base) +
                              spec.KeyOffsetBytes(layer, blocks[first_block + i]);
    }
    return absl::OkStatus();
  }
  // A block's K and V of one layer are contiguous: one range per block.
  scratch.ranges.clear();
  for (int32_t i = 0; i < count; ++i) {
    scratch.ranges.push_back(
        {spec.KeyOffsetBytes(layer, blocks[first_block + i]), spec.block_stride_bytes()});
  }
  const size_t needed = static_cast<size_t>(count) * spec.block_stride_bytes();
  if (scratch.staging == nullptr || scratch.staging->size_bytes() < needed) {
    scratch.staging.reset();
    TRIDENT_ASSIGN_OR_RETURN(scratch.staging, copier_->AllocateHost(needed));
  }
  TRIDENT_RETURN_IF_ERROR(copier_->CopyToHost(scratch.ranges, scratch.staging->data()));
  for (int32_t i = 0; i < count; ++i) {
    scratch.block_data[i] =
        scratch.staging->data() + static_cast<size_t>(i) * spec.block_stride_bytes();
  }
  return absl::OkStatus();
}

bool ServiceKvCopier::GatherRows(int32_t first, int32_t start, int32_t n, Scratch& scratch) const {
  const kv::KvCacheSpec& spec = memory_.spec;
  const int64_t row = int64_t{spec.num_kv_heads} * spec.head_dim;
  const size_t element = spec.element_size_bytes();
  // bf16 in the pool and on the wire: copied as they are.
  const bool raw =
      spec.dtype == numeric::DType::kBF16 && wire_dtype_ == attention::WireDType::kBF16;
  if (raw) {
    scratch.k_bits.resize(n * row);
    scratch.v_bits.resize(n * row);
  } else {
    scratch.k_rows.resize(n * row);
    scratch.v_rows.resize(n * row);
  }
  scratch.positions.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = start + i;
    scratch.positions[i] = p;
    const char* block = scratch.block_data[p / spec.block_size - first / spec.block_size];
    const int32_t slot = p % spec.block_size;
    for (int32_t h = 0; h < spec.num_kv_heads; ++h) {
      const uint64_t within = (uint64_t(h) * spec.block_size + slot) * spec.head_dim * element;
      const int64_t at = i * row + h * spec.head_dim;
      const char* k = block + within;
      const char* v = block + spec.value_offset_bytes() + within;
      if (raw) {
        std::memcpy(&scratch.k_bits[at], k, spec.head_dim * element);
        std::memcpy(&scratch.v_bits[at], v, spec.head_dim * element);
      } else {
        numeric::ToFloat(spec.dtype, k, &scratch.k_rows[at], spec.head_dim);
        numeric::ToFloat(spec.dtype, v, &scratch.v_rows[at], spec.head_dim);
      }
    }
  }
  return raw;
}

absl::Status ServiceKvCopier::Copy(const KvCopyRange& range, attention::RemoteAttention& channel,
                                   absl::Duration timeout, Scratch& scratch) const {
  const kv::KvCacheSpec& spec = memory_.spec;
  const int64_t row = int64_t{spec.num_kv_heads} * spec.head_dim;
  const int32_t first = range.first, last = range.last;
  const int32_t layer_end = range.layer_end == 0 ? spec.num_layers : range.layer_end;
  if (first >= last) return absl::OkStatus();
  if (first < 0 || range.layer_begin < 0 || layer_end > spec.num_layers ||
      static_cast<int64_t>(range.blocks.size()) * spec.block_size < last) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot copy positions [", first, ", ", last, ") of layers [", range.layer_begin, ", ",
        layer_end, ") from ", range.blocks.size(), " blocks of ", spec.block_size, " tokens"));
  }
  std::vector<attention::RemoteAttention::Ticket> tickets;
  absl::Status first_error;
  for (int32_t layer = range.layer_begin; layer < layer_end && first_error.ok(); ++layer) {
    first_error = StageLayer(range.blocks, first, last, layer, scratch);
    for (int32_t start = first; start < last && first_error.ok(); start += kChunkTokens) {
      const int32_t n = std::min(kChunkTokens, last - start);
      const bool raw = GatherRows(first, start, n, scratch);
      scratch.handles.assign(n, range.handle);
      attention::KvAppendCall call{.layer = layer,
                                   .num_kv_heads = spec.num_kv_heads,
                                   .head_dim = spec.head_dim,
                                   .dtype = wire_dtype_,
                                   .handles = scratch.handles,
                                   .positions = scratch.positions,
                                   .k_stride = row,
                                   .v_stride = row,
                                   .write_key = range.write_key};
      if (raw) {
        call.k_bf16 = scratch.k_bits.data();
        call.v_bf16 = scratch.v_bits.data();
      } else {
        call.k = scratch.k_rows.data();
        call.v = scratch.v_rows.data();
      }
      absl::StatusOr<attention::RemoteAttention::Ticket> ticket = channel.StartAppend(call);
      if (ticket.ok()) {
        tickets.push_back(*ticket);
      } else {
        first_error = ticket.status();
      }
    }
  }
  for (auto ticket : tickets) {
    absl::Status waited = channel.Wait(ticket, timeout);
    if (first_error.ok()) first_error = waited;
  }
  return first_error;
}

}  // namespace trident::worker
