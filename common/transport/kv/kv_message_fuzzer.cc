// Feeds arbitrary bytes to what a KV receiver and writer check before they
// touch memory (common/transport/kv/kv_writer.h):
//
//   * KvMessageHeader::Decode: decodes exactly the well-formed headers, and a
//     decoded header encodes back to the same bytes.
//   * CheckKvWriteRange against one of a few fixed cache specs and a block
//     list from the input: its verdict must equal one computed here
//     independently (whole blocks of one layer inside the cache, each in
//     the list).
//   * ValidateKvDestination on a trident.v1.KvDestination from the input:
//     an accepted destination must have what the function's comment
//     promises (every block of every layer inside its region, ...), and the
//     puts PlanLayerPuts and SplitKvPuts derive from it must stay inside the
//     regions and the local cache and be accepted by the receiver's
//     CheckKvWriteRange.
//
// Input: spec index, header chunk, an address pair to round-trip, the write
// range, the block list, the message size, then the destination proto.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/kv/kv_layout.h"
#include "common/numeric/dtype.h"
#include "common/status/error_details.h"
#include "common/testing/fuzz_input.h"
#include "common/transport/kv/kv_writer.h"
#include "google/protobuf/stubs/logging.h"
#include "trident/v1/worker.pb.h"

namespace {

using trident::kv::KvCacheSpec;
using trident::numeric::DType;
using trident::transport::KvMessageHeader;
using trident::transport::KvPut;
using Wide = unsigned __int128;

// protobuf logs every string field of invalid UTF-8 it refuses, which the
// fuzzer makes many of.
[[maybe_unused]] const bool kProtobufQuiet = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

// Valid specs (kv::Validate accepts each), the last one with no blocks.
const KvCacheSpec kSpecs[] = {
    {.num_layers = 2,
     .num_kv_heads = 2,
     .head_dim = 4,
     .block_size = 4,
     .dtype = DType::kBF16,
     .num_blocks = 8},
    {.num_layers = 3,
     .num_kv_heads = 1,
     .head_dim = 8,
     .block_size = 16,
     .dtype = DType::kF32,
     .num_blocks = 5},
    {.num_layers = 1,
     .num_kv_heads = 1,
     .head_dim = 1,
     .block_size = 1,
     .dtype = DType::kF16,
     .num_blocks = 1},
    {.num_layers = 4,
     .num_kv_heads = 8,
     .head_dim = 128,
     .block_size = 16,
     .dtype = DType::kBF16,
     .num_blocks = 64},
    {.num_layers = 2,
     .num_kv_heads = 1,
     .head_dim = 2,
     .block_size = 2,
     .dtype = DType::kBF16,
     .num_blocks = 0},
};
constexpr size_t kNumSpecs = sizeof(kSpecs) / sizeof(kSpecs[0]);

void CheckHeader(absl::string_view bytes, uint64_t reservation, uint64_t address) {
  absl::StatusOr<KvMessageHeader> decoded = KvMessageHeader::Decode(bytes);
  if (decoded.ok()) {
    if (decoded->Encode() != bytes) abort();
  } else if (decoded.status().code() != absl::StatusCode::kInvalidArgument) {
    abort();
  }
  const KvMessageHeader header{.reservation_id = reservation, .remote_address = address};
  const std::string encoded = header.Encode();
  if (encoded.size() != 24) abort();
  absl::StatusOr<KvMessageHeader> again = KvMessageHeader::Decode(encoded);
  if (!again.ok() || again->reservation_id != reservation || again->remote_address != address) {
    abort();
  }
  // Any other length is refused.
  if (KvMessageHeader::Decode(absl::string_view(encoded).substr(1)).ok()) abort();
}

// CheckKvWriteRange's contract, computed independently.
bool WriteRangeOk(const KvCacheSpec& spec, uint64_t offset, uint64_t length,
                  const std::vector<int32_t>& blocks) {
  const Wide block = spec.block_stride_bytes();
  const Wide layer = block * static_cast<uint64_t>(spec.num_blocks);
  if (length == 0 || length % block != 0 || offset % block != 0) return false;
  const Wide end = Wide{offset} + length;
  if (end > layer * static_cast<uint64_t>(spec.num_layers)) return false;  // Outside the cache.
  if (offset / layer != (end - 1) / layer) return false;                   // Two layers.
  for (Wide at = offset; at < end; at += block) {
    const auto id = static_cast<int32_t>((at % layer) / block);
    if (!absl::c_linear_search(blocks, id)) return false;
  }
  return true;
}

void CheckWriteRange(const KvCacheSpec& spec, uint64_t offset, uint64_t length,
                     const std::vector<int32_t>& blocks) {
  const absl::Status status = trident::transport::CheckKvWriteRange(spec, offset, length, blocks);
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) abort();
  if (status.ok() != WriteRangeOk(spec, offset, length, blocks)) abort();
}

// What ValidateKvDestination's comment promises of an accepted destination.
void CheckValidDestination(const KvCacheSpec& spec, const trident::v1::KvDestination& d) {
  const trident::v1::KvLayout want = trident::kv::ToProto(spec);
  const trident::v1::KvLayout& got = d.layout();
  if (got.num_layers() != want.num_layers() || got.num_kv_heads() != want.num_kv_heads() ||
      got.head_dim() != want.head_dim() || got.dtype() != want.dtype() ||
      got.block_size_tokens() != want.block_size_tokens() ||
      got.block_layout() != want.block_layout() ||
      got.block_stride_bytes() != want.block_stride_bytes() ||
      got.value_offset_bytes() != want.value_offset_bytes()) {
    abort();
  }
  const uint64_t block = got.block_stride_bytes();
  const uint64_t layer = got.layer_stride_bytes();
  if (layer < block) abort();
  if (d.num_tokens() < 1) abort();
  const int64_t b = spec.block_size;
  const int64_t cached = d.num_cached_blocks();
  if (cached < 0 || cached * b > d.num_tokens()) abort();
  if (d.block_ids_size() != (d.num_tokens() + b - 1) / b - cached) abort();
  for (int32_t id : d.block_ids()) {
    if (id < 0 || static_cast<uint64_t>(id) >= layer / block) abort();
  }
  std::vector<int> holders(spec.num_layers, 0);
  for (const trident::v1::KvRegion& region : d.regions()) {
    if (region.rkey().empty() || region.base_address() == 0) abort();
    if (region.first_layer() < 0 || region.num_layers() < 1 ||
        int64_t{region.first_layer()} + region.num_layers() > spec.num_layers) {
      abort();
    }
    const Wide region_end = Wide{region.base_address()} + region.length_bytes();
    if (region_end > UINT64_MAX) abort();
    for (int32_t l = 0; l < region.num_layers(); ++l) {
      ++holders[region.first_layer() + l];
      for (int32_t id : d.block_ids()) {
        const Wide at = Wide{region.base_address()} + Wide{layer} * static_cast<uint64_t>(l) +
                        Wide{block} * static_cast<uint64_t>(id);
        if (at + block > region_end) abort();
      }
    }
  }
  for (int n : holders) {
    if (n != 1) abort();
  }
}

// The puts of every layer, and the messages cut from them, against the
// regions, the local cache and the receiver's check.
void CheckPuts(const KvCacheSpec& spec, const trident::v1::KvDestination& d,
               const std::vector<int32_t>& local, uint64_t max_message_bytes) {
  const uint64_t block = spec.block_stride_bytes();
  const uint64_t message_bytes = trident::transport::KvMessageBytes(block, max_message_bytes);
  if (message_bytes == 0 || message_bytes % block != 0) abort();
  // The receiver's view when one region is its whole pool (as a decode
  // worker registers it): its spec from the layout.
  absl::StatusOr<KvCacheSpec> receiver = trident::kv::FromProto(d.layout());
  const bool whole_pool = receiver.ok() && d.regions_size() == 1 && d.regions(0).first_layer() == 0;
  const std::vector<int32_t> reserved(d.block_ids().begin(), d.block_ids().end());

  for (int32_t layer = -1; layer <= spec.num_layers; ++layer) {
    const absl::Status args = trident::transport::CheckLayerBlocks(spec, d, layer, local);
    const bool args_ok =
        layer >= 0 && layer < spec.num_layers &&
        static_cast<int>(local.size()) == d.block_ids_size() &&
        absl::c_all_of(local, [&](int32_t id) { return id >= 0 && id < spec.num_blocks; });
    if (args.ok() != args_ok) abort();
    if (!args.ok()) {
      if (args.code() != absl::StatusCode::kInvalidArgument) abort();
      continue;
    }
    const std::vector<KvPut> puts = trident::transport::PlanLayerPuts(spec, d, layer, local);
    // Walk the blocks through the puts in order.
    size_t p = 0;
    uint64_t into = 0;
    for (size_t i = 0; i < local.size(); ++i) {
      if (p >= puts.size()) abort();
      const KvPut& put = puts[p];
      if (put.region < 0 || put.region >= d.regions_size()) abort();
      const trident::v1::KvRegion& region = d.regions(put.region);
      if (layer < region.first_layer() || layer - region.first_layer() >= region.num_layers()) {
        abort();
      }
      const uint64_t remote =
          region.base_address() +
          static_cast<uint64_t>(layer - region.first_layer()) * d.layout().layer_stride_bytes() +
          static_cast<uint64_t>(d.block_ids(i)) * block;
      if (put.remote_address + into != remote) abort();
      if (put.local_offset_bytes + into != spec.KeyOffsetBytes(layer, local[i])) abort();
      if (spec.KeyOffsetBytes(layer, local[i]) + block > spec.TotalBytes()) abort();
      into += block;
      if (into > put.length_bytes) abort();
      if (into == put.length_bytes) {
        ++p;
        into = 0;
      }
    }
    if (p != puts.size() || into != 0) abort();
    // Runs are maximal: two puts in a row are not contiguous on both sides.
    for (size_t k = 1; k < puts.size(); ++k) {
      if (puts[k].remote_address == puts[k - 1].remote_address + puts[k - 1].length_bytes &&
          puts[k].local_offset_bytes == puts[k - 1].local_offset_bytes + puts[k - 1].length_bytes &&
          puts[k].region == puts[k - 1].region) {
        abort();
      }
    }

    const std::vector<KvPut> messages = trident::transport::SplitKvPuts(puts, message_bytes);
    uint64_t total = 0;
    for (const KvPut& m : messages) {
      if (m.length_bytes == 0 || m.length_bytes > message_bytes || m.length_bytes % block != 0) {
        abort();
      }
      total += m.length_bytes;
      if (whole_pool) {
        const uint64_t offset = m.remote_address - d.regions(0).base_address();
        if (!trident::transport::CheckKvWriteRange(*receiver, offset, m.length_bytes, reserved)
                 .ok()) {
          abort();
        }
      }
    }
    if (total != local.size() * block) abort();
  }
}

void CheckDestination(const KvCacheSpec& spec, const trident::v1::KvDestination& d,
                      const std::vector<int32_t>& local, uint64_t max_message_bytes) {
  const absl::Status status = trident::transport::ValidateKvDestination(spec, d);
  if (status.code() == absl::StatusCode::kFailedPrecondition) {
    if (!absl::StartsWith(status.message(), "destination.layout.")) abort();
    return;
  }
  if (!status.ok()) {
    if (status.code() != absl::StatusCode::kInvalidArgument) abort();
    const std::optional<std::string> field = trident::GetBadRequestField(status);
    if (!field.has_value() || !absl::StartsWith(*field, "destination.")) abort();
    return;
  }
  CheckValidDestination(spec, d);
  CheckPuts(spec, d, local, max_message_bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trident::testing::FuzzInput in(data, size);
  const KvCacheSpec& spec = kSpecs[in.Take<uint8_t>() % kNumSpecs];
  if (!trident::kv::Validate(spec).ok()) abort();

  const absl::string_view header = in.TakeChunk();
  const uint64_t reservation = in.Take<uint64_t>();
  const uint64_t address = in.Take<uint64_t>();
  CheckHeader(header, reservation, address);

  // The write range: raw, or near whole blocks.
  uint64_t offset;
  uint64_t length;
  if (in.Take<uint8_t>() % 2 == 1) {
    offset = in.Take<uint64_t>();
    length = in.Take<uint64_t>();
  } else {
    const uint64_t layer = in.Take<uint8_t>() % 8;
    const uint64_t first = in.Take<uint8_t>();
    const uint64_t count = in.Take<uint8_t>();
    const int64_t offset_jitter = in.Take<int8_t>() / 32;
    const int64_t length_jitter = in.Take<int8_t>() / 32;
    offset = layer * spec.layer_stride_bytes() + first * spec.block_stride_bytes() +
             static_cast<uint64_t>(offset_jitter);
    length = count * spec.block_stride_bytes() + static_cast<uint64_t>(length_jitter);
  }
  std::vector<int32_t> blocks(in.Take<uint8_t>() % 32);
  for (int32_t& b : blocks) b = in.Take<int16_t>();
  CheckWriteRange(spec, offset, length, blocks);

  const uint64_t max_message_bytes = in.Take<uint32_t>();
  const absl::string_view proto = in.TakeRest();
  trident::v1::KvDestination destination;
  if (!destination.ParseFromArray(proto.data(), static_cast<int>(proto.size()))) return 0;
  // The local blocks of the transfer: the list again, or 0, 1, 2, ...
  std::vector<int32_t> local(destination.block_ids_size());
  for (size_t i = 0; i < local.size(); ++i) {
    local[i] = blocks.empty() ? static_cast<int32_t>(i) : blocks[i % blocks.size()];
  }
  CheckDestination(spec, destination, local, max_message_bytes);
  return 0;
}
