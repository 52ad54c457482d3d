#include "common/transport/kv/kv_writer.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"

namespace trident::transport {
namespace {

using trident::v1::KvDestination;
using trident::v1::KvLayout;

template <typename T>
absl::Status CheckLayoutField(absl::string_view field, const T& got, const T& want) {
  if (got == want) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("destination.layout.", field, " is ", got,
                                                    "; this model's KV cache has ", want));
}

// Index of the region holding `layer`. REQUIRES: a validated destination.
int RegionOf(const KvDestination& destination, int32_t layer) {
  for (int r = 0; r < destination.regions_size(); ++r) {
    const auto& region = destination.regions(r);
    if (layer >= region.first_layer() && layer - region.first_layer() < region.num_layers()) {
      return r;
    }
  }
  return -1;
}

}  // namespace

absl::Status ValidateKvDestination(const kv::KvCacheSpec& local_spec,
                                   const KvDestination& destination) {
  const KvLayout& got = destination.layout();
  const KvLayout want = kv::ToProto(local_spec);
  TRIDENT_RETURN_IF_ERROR(CheckLayoutField("num_layers", got.num_layers(), want.num_layers()));
  TRIDENT_RETURN_IF_ERROR(
      CheckLayoutField("num_kv_heads", got.num_kv_heads(), want.num_kv_heads()));
  TRIDENT_RETURN_IF_ERROR(CheckLayoutField("head_dim", got.head_dim(), want.head_dim()));
  TRIDENT_RETURN_IF_ERROR(CheckLayoutField("dtype", trident::v1::DType_Name(got.dtype()),
                                           trident::v1::DType_Name(want.dtype())));
  TRIDENT_RETURN_IF_ERROR(
      CheckLayoutField("block_size_tokens", got.block_size_tokens(), want.block_size_tokens()));
  TRIDENT_RETURN_IF_ERROR(CheckLayoutField("block_layout",
                                           trident::v1::KvBlockLayout_Name(got.block_layout()),
                                           trident::v1::KvBlockLayout_Name(want.block_layout())));
  TRIDENT_RETURN_IF_ERROR(
      CheckLayoutField("block_stride_bytes", got.block_stride_bytes(), want.block_stride_bytes()));
  TRIDENT_RETURN_IF_ERROR(
      CheckLayoutField("value_offset_bytes", got.value_offset_bytes(), want.value_offset_bytes()));
  const uint64_t block_stride = got.block_stride_bytes();
  const uint64_t layer_stride = got.layer_stride_bytes();
  if (layer_stride < block_stride) {
    return InvalidArgumentForField(
        "destination.layout.layer_stride_bytes",
        absl::StrCat("is ", layer_stride, "; must hold at least one block of ", block_stride,
                     " bytes"));
  }
  const uint64_t blocks_per_layer = layer_stride / block_stride;

  if (destination.num_tokens() < 1) {
    return InvalidArgumentForField("destination.num_tokens",
                                   absl::StrCat("is ", destination.num_tokens(), "; must be >= 1"));
  }
  const int64_t block_size = local_spec.block_size;
  const int64_t cached_blocks = destination.num_cached_blocks();
  if (cached_blocks < 0 || cached_blocks > destination.num_tokens() / block_size) {
    return InvalidArgumentForField(
        "destination.num_cached_blocks",
        absl::StrCat("is ", cached_blocks, "; must be in [0, ", destination.num_tokens() / block_size,
                     "] for ", destination.num_tokens(), " tokens"));
  }
  const int64_t needed_blocks =
      (destination.num_tokens() + block_size - 1) / block_size - cached_blocks;
  if (destination.block_ids_size() != needed_blocks) {
    return InvalidArgumentForField(
        "destination.block_ids",
        absl::StrCat("has ", destination.block_ids_size(), " entries; ", destination.num_tokens(),
                     " tokens in blocks of ", block_size, " need ", needed_blocks));
  }
  int64_t max_block = 0;
  for (int i = 0; i < destination.block_ids_size(); ++i) {
    const int64_t id = destination.block_ids(i);
    if (id < 0 || static_cast<uint64_t>(id) >= blocks_per_layer) {
      return InvalidArgumentForField(absl::StrCat("destination.block_ids[", i, "]"),
                                     absl::StrCat("is ", id, "; the layout holds blocks [0, ",
                                                  blocks_per_layer, ") per layer"));
    }
    max_block = std::max(max_block, id);
  }

  const int32_t num_layers = local_spec.num_layers;
  std::vector<int> owner(num_layers, -1);
  for (int r = 0; r < destination.regions_size(); ++r) {
    const auto& region = destination.regions(r);
    const std::string field = absl::StrCat("destination.regions[", r, "]");
    if (region.first_layer() < 0 || region.first_layer() >= num_layers) {
      return InvalidArgumentForField(
          field + ".first_layer",
          absl::StrCat("is ", region.first_layer(), "; the model has ", num_layers, " layers"));
    }
    if (region.num_layers() < 1 || region.num_layers() > num_layers - region.first_layer()) {
      return InvalidArgumentForField(
          field + ".num_layers",
          absl::StrCat("is ", region.num_layers(), " from layer ", region.first_layer(),
                       "; the model has ", num_layers, " layers"));
    }
    if (region.rkey().empty()) return InvalidArgumentForField(field + ".rkey", "is empty");
    // Everything written through the region lies in [0, extent).
    const unsigned __int128 extent =
        static_cast<unsigned __int128>(region.num_layers() - 1) * layer_stride +
        static_cast<unsigned __int128>(max_block + 1) * block_stride;
    if (extent > region.length_bytes()) {
      return InvalidArgumentForField(
          field + ".length_bytes",
          absl::StrCat("is ", region.length_bytes(), "; block ", max_block, " of its last layer ",
                       "ends at byte ", static_cast<uint64_t>(extent)));
    }
    if (region.base_address() == 0 ||
        region.base_address() > std::numeric_limits<uint64_t>::max() - region.length_bytes()) {
      return InvalidArgumentForField(
          field + ".base_address",
          absl::StrCat("is ", region.base_address(), " with length ", region.length_bytes()));
    }
    for (int32_t l = region.first_layer(); l < region.first_layer() + region.num_layers(); ++l) {
      if (owner[l] != -1) {
        return InvalidArgumentForField(
            field, absl::StrCat("holds layer ", l, ", which regions[", owner[l], "] holds too"));
      }
      owner[l] = r;
    }
  }
  for (int32_t l = 0; l < num_layers; ++l) {
    if (owner[l] == -1) {
      return InvalidArgumentForField("destination.regions",
                                     absl::StrCat("no region holds layer ", l));
    }
  }
  return absl::OkStatus();
}

KvWriteMode WriteModeForLane(absl::string_view lane) {
  for (absl::string_view emulated : {"tcp", "posix", "sysv", "self", ""}) {
    if (lane == emulated) return KvWriteMode::kMessage;
  }
  return KvWriteMode::kPut;
}

bool RendezvousForLane(absl::string_view lane) {
  for (absl::string_view shared_memory : {"posix", "sysv", "cma", "xpmem", "knem"}) {
    if (lane == shared_memory) return true;
  }
  return false;
}

KvWriteMode WriteModeFor(const KvDestination& destination, absl::string_view lane) {
  for (const auto& region : destination.regions()) {
    if (region.rkey() == kMessagesOnlyRkey) return KvWriteMode::kMessage;
  }
  return WriteModeForLane(lane);
}

namespace {

constexpr uint32_t kKvMessageMagic = 0x3156'4b54;  // "TKV1"
constexpr size_t kKvMessageHeaderBytes = 24;

void PutLittleEndian(uint64_t value, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t GetLittleEndian(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  }
  return value;
}

}  // namespace

std::string KvMessageHeader::Encode() const {
  std::string out(kKvMessageHeaderBytes, '\0');
  PutLittleEndian(kKvMessageMagic, 4, out.data());
  PutLittleEndian(0, 4, out.data() + 4);
  PutLittleEndian(reservation_id, 8, out.data() + 8);
  PutLittleEndian(remote_address, 8, out.data() + 16);
  return out;
}

absl::StatusOr<KvMessageHeader> KvMessageHeader::Decode(absl::string_view bytes) {
  if (bytes.size() != kKvMessageHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat("KV message header of ", bytes.size(),
                                                   " bytes; expected ", kKvMessageHeaderBytes));
  }
  if (GetLittleEndian(bytes.data(), 4) != kKvMessageMagic) {
    return absl::InvalidArgumentError("KV message header with a wrong magic number");
  }
  // Encode writes zeros there; anything else is a header this version does
  // not know, which must not be read as one it does.
  if (GetLittleEndian(bytes.data() + 4, 4) != 0) {
    return absl::InvalidArgumentError("KV message header with nonzero reserved bytes");
  }
  KvMessageHeader header;
  header.reservation_id = GetLittleEndian(bytes.data() + 8, 8);
  header.remote_address = GetLittleEndian(bytes.data() + 16, 8);
  return header;
}

absl::Status CheckKvWriteRange(const kv::KvCacheSpec& spec, uint64_t offset, uint64_t length,
                               absl::Span<const int32_t> blocks) {
  const uint64_t block_stride = spec.block_stride_bytes();
  const uint64_t layer_stride = spec.layer_stride_bytes();
  if (layer_stride == 0) {  // A cache of no blocks (or no bytes) holds no write.
    return absl::InvalidArgumentError(absl::StrCat("a KV write of ", length, " bytes at offset ",
                                                   offset, " into a KV cache of no blocks"));
  }
  if (length == 0 || length % block_stride != 0 || offset % block_stride != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a KV write of ", length, " bytes at offset ",
                                                   offset, " is not whole blocks of ", block_stride,
                                                   " bytes"));
  }
  const uint64_t layer = offset / layer_stride;
  const uint64_t first = (offset % layer_stride) / block_stride;
  const uint64_t count = length / block_stride;
  if (layer >= static_cast<uint64_t>(spec.num_layers) ||
      first + count > static_cast<uint64_t>(spec.num_blocks)) {
    return absl::InvalidArgumentError(absl::StrCat("a KV write of ", length, " bytes at offset ",
                                                   offset, " leaves its layer or the cache"));
  }
  for (uint64_t b = first; b < first + count; ++b) {
    if (std::find(blocks.begin(), blocks.end(), static_cast<int32_t>(b)) == blocks.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a KV write into block ", b, ", which the reservation does not hold"));
    }
  }
  return absl::OkStatus();
}

std::vector<KvPut> PlanLayerPuts(const kv::KvCacheSpec& local_spec,
                                 const KvDestination& destination, int32_t layer,
                                 absl::Span<const int32_t> local_block_ids) {
  const int r = RegionOf(destination, layer);
  const auto& region = destination.regions(r);
  const uint64_t block_stride = destination.layout().block_stride_bytes();
  const uint64_t remote_layer_base =
      region.base_address() + static_cast<uint64_t>(layer - region.first_layer()) *
                                  destination.layout().layer_stride_bytes();
  std::vector<KvPut> puts;
  const int n = static_cast<int>(local_block_ids.size());
  for (int i = 0; i < n;) {
    int j = i + 1;
    while (j < n && destination.block_ids(j) == destination.block_ids(j - 1) + 1 &&
           local_block_ids[j] == local_block_ids[j - 1] + 1) {
      ++j;
    }
    puts.push_back(
        {.local_offset_bytes = local_spec.KeyOffsetBytes(layer, local_block_ids[i]),
         .remote_address =
             remote_layer_base + static_cast<uint64_t>(destination.block_ids(i)) * block_stride,
         .length_bytes = static_cast<uint64_t>(j - i) * block_stride,
         .region = r});
    i = j;
  }
  return puts;
}

absl::Status CheckLayerBlocks(const kv::KvCacheSpec& local_spec, const KvDestination& destination,
                              int32_t layer, absl::Span<const int32_t> local_block_ids) {
  if (layer < 0 || layer >= local_spec.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " is not in [0, ", local_spec.num_layers, ")"));
  }
  if (static_cast<int64_t>(local_block_ids.size()) != destination.block_ids_size()) {
    return absl::InvalidArgumentError(absl::StrCat(local_block_ids.size(), " local blocks for ",
                                                   destination.block_ids_size(),
                                                   " destination blocks"));
  }
  for (size_t i = 0; i < local_block_ids.size(); ++i) {
    if (local_block_ids[i] < 0 || local_block_ids[i] >= local_spec.num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("local block ", local_block_ids[i], " (entry ",
                                                     i, ") is not in the local cache's [0, ",
                                                     local_spec.num_blocks, ")"));
    }
  }
  return absl::OkStatus();
}

uint64_t KvMessageBytes(uint64_t block_stride_bytes, uint64_t max_message_bytes) {
  return std::max<uint64_t>(1, max_message_bytes / block_stride_bytes) * block_stride_bytes;
}

std::vector<KvPut> SplitKvPuts(absl::Span<const KvPut> puts, uint64_t message_bytes) {
  std::vector<KvPut> split;
  for (const KvPut& put : puts) {
    for (uint64_t done_bytes = 0; done_bytes < put.length_bytes;) {
      const uint64_t n = std::min(message_bytes, put.length_bytes - done_bytes);
      split.push_back({.local_offset_bytes = put.local_offset_bytes + done_bytes,
                       .remote_address = put.remote_address + done_bytes,
                       .length_bytes = n,
                       .region = put.region});
      done_bytes += n;
    }
  }
  return split;
}

absl::StatusOr<std::unique_ptr<KvWriter>> KvWriter::Create(
    const kv::KvCacheSpec& local_spec, const void* local_base, std::shared_ptr<Endpoint> endpoint,
    const KvDestination& destination, KvWriteMode mode, uint64_t max_message_bytes,
    std::vector<std::shared_ptr<Endpoint>> more_endpoints) {
  TRIDENT_RETURN_IF_ERROR(kv::Validate(local_spec));
  if (local_base == nullptr || endpoint == nullptr) {
    return absl::InvalidArgumentError("KvWriter needs a local KV cache and an endpoint");
  }
  for (const auto& more : more_endpoints) {
    if (more == nullptr) return absl::InvalidArgumentError("KvWriter: a null lane endpoint");
  }
  TRIDENT_RETURN_IF_ERROR(ValidateKvDestination(local_spec, destination));
  std::vector<std::shared_ptr<RemoteKey>> rkeys;
  for (int r = 0; mode == KvWriteMode::kPut && r < destination.regions_size(); ++r) {
    if (destination.regions(r).rkey() == kMessagesOnlyRkey) {
      return absl::FailedPreconditionError(
          absl::StrCat("destination.regions[", r,
                       "] takes KV messages only (its owner stages device memory through host "
                       "buffers); write it in message mode"));
    }
    absl::StatusOr<std::shared_ptr<RemoteKey>> rkey =
        endpoint->UnpackRkey(destination.regions(r).rkey());
    if (!rkey.ok()) {
      if (absl::IsInvalidArgument(rkey.status())) {
        return InvalidArgumentForField(absl::StrCat("destination.regions[", r, "].rkey"),
                                       rkey.status().message());
      }
      return rkey.status();
    }
    rkeys.push_back(*std::move(rkey));
  }
  const uint64_t message_bytes =
      KvMessageBytes(destination.layout().block_stride_bytes(), max_message_bytes);
  return std::unique_ptr<KvWriter>(new KvWriter(local_spec, local_base, std::move(endpoint),
                                                destination, std::move(rkeys), mode, message_bytes,
                                                std::move(more_endpoints)));
}

KvWriter::KvWriter(const kv::KvCacheSpec& local_spec, const void* local_base,
                   std::shared_ptr<Endpoint> endpoint, KvDestination destination,
                   std::vector<std::shared_ptr<RemoteKey>> rkeys, KvWriteMode mode,
                   uint64_t max_message_bytes,
                   std::vector<std::shared_ptr<Endpoint>> more_endpoints)
    : local_spec_(local_spec),
      local_base_(static_cast<const char*>(local_base)),
      endpoint_(std::move(endpoint)),
      destination_(std::move(destination)),
      rkeys_(std::move(rkeys)),
      mode_(mode),
      rendezvous_(RendezvousForLane(endpoint_->lane())),
      max_message_bytes_(max_message_bytes),
      message_endpoints_([&] {
        std::vector<std::shared_ptr<Endpoint>> all = {endpoint_};
        all.insert(all.end(), more_endpoints.begin(), more_endpoints.end());
        return all;
      }()) {}

void KvWriter::WriteLayer(int32_t layer, absl::Span<const int32_t> local_block_ids,
                          DoneCallback done) {
  if (absl::Status invalid = CheckLayerBlocks(local_spec_, destination_, layer, local_block_ids);
      !invalid.ok()) {
    done(std::move(invalid));
    return;
  }

  std::vector<KvPut> puts = PlanLayerPuts(local_spec_, destination_, layer, local_block_ids);
  if (mode_ == KvWriteMode::kMessage) puts = SplitKvPuts(puts, max_message_bytes_);
  // Counts the puts (or messages) and the flush that follows puts; the last
  // to complete reports the layer.
  struct Layer {
    absl::Mutex mu;
    int remaining ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
    uint64_t bytes = 0;
    DoneCallback done;
    std::shared_ptr<Stats> stats;
  };
  auto state = std::make_shared<Layer>();
  {
    absl::MutexLock lock(&state->mu);
    state->remaining = static_cast<int>(puts.size()) + (mode_ == KvWriteMode::kPut ? 1 : 0);
  }
  state->done = std::move(done);
  state->stats = stats_;
  for (const KvPut& put : puts) state->bytes += put.length_bytes;
  auto complete = [state](absl::Status status) {
    absl::Status result;
    {
      absl::MutexLock lock(&state->mu);
      if (!status.ok() && state->status.ok()) state->status = std::move(status);
      if (--state->remaining > 0) return;
      result = state->status;
    }
    if (result.ok()) {
      state->stats->bytes_completed += state->bytes;
      ++state->stats->layers_completed;
    }
    DoneCallback callback = std::move(state->done);
    callback(std::move(result));
  };
  stats_->messages_posted += static_cast<int64_t>(puts.size());
  stats_->bytes_posted += static_cast<int64_t>(state->bytes);
  if (mode_ == KvWriteMode::kMessage) {
    for (const KvPut& put : puts) {
      const KvMessageHeader header{.reservation_id = destination_.reservation_id(),
                                   .remote_address = put.remote_address};
      Endpoint& lane = *message_endpoints_[next_lane_++ % message_endpoints_.size()];
      lane.Send(kKvMessageId, header.Encode(), local_base_ + put.local_offset_bytes,
                put.length_bytes, complete, rendezvous_);
    }
    return;
  }
  for (const KvPut& put : puts) {
    endpoint_->Put(local_base_ + put.local_offset_bytes, put.length_bytes, put.remote_address,
                   rkeys_[put.region], complete);
  }
  // The flush completes once every put above is visible at the peer.
  endpoint_->Flush(complete);
}

}  // namespace trident::transport
