#include "services/attention/attention_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc/reactors.h"
#include "common/kv/kv_events_proto.h"
#include "common/kv/kv_layout.h"
#include "common/status/status_macros.h"
#include "common/time/proto_time.h"

namespace trident::attention {

absl::StatusOr<SequenceSpec> SpecFromProto(const trident::v1::AdmitSequenceRequest& request) {
  TRIDENT_ASSIGN_OR_RETURN(numeric::DType dtype, kv::FromProtoDType(request.dtype()));
  SequenceSpec spec{.owner_id = request.owner_id(),
                    .owner_incarnation = request.owner_incarnation(),
                    .sequence_id = request.sequence_id(),
                    .num_layers = request.num_layers(),
                    .num_q_heads = request.num_attention_heads(),
                    .num_kv_heads = request.num_kv_heads(),
                    .head_dim = request.head_dim(),
                    .dtype = dtype,
                    .capacity_tokens = request.capacity_tokens(),
                    .block_size = request.block_size_tokens()};
  switch (request.block_layout()) {
    case trident::v1::KV_BLOCK_LAYOUT_UNSPECIFIED:
      spec.packing = KvPacking::kAuto;
      break;
    case trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM:
      spec.packing = KvPacking::kRows;
      break;
    case trident::v1::KV_BLOCK_LAYOUT_HEAD_VNNI_PAIRS:
      spec.packing = KvPacking::kPairs;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("block_layout ", trident::v1::KvBlockLayout_Name(request.block_layout()),
                       " is not served; ask for KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM, "
                       "KV_BLOCK_LAYOUT_HEAD_VNNI_PAIRS or leave it unspecified"));
  }
  if (request.has_idle_timeout()) {
    spec.idle_timeout = DurationFromProto(request.idle_timeout());
    if (spec.idle_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("idle_timeout must be positive when set");
    }
  }
  return spec;
}

absl::StatusOr<InPlacePrefix> AttentionService::BorrowPrefix(
    const trident::v1::AdmitSequenceRequest& request, SequenceSpec* spec) const {
  if (request.prefix_key_hi().empty() && request.prefix_key_lo().empty()) return InPlacePrefix{};
  TRIDENT_ASSIGN_OR_RETURN(BlockFormat format, BlockFormatFromProto(request.prefix_format()));
  TRIDENT_ASSIGN_OR_RETURN(std::vector<kv::BlockKey> keys,
                           BlockKeysFromProto(request.prefix_key_hi(), request.prefix_key_lo()));
  if (format.num_layers != spec->num_layers || format.num_kv_heads != spec->num_kv_heads ||
      format.head_dim != spec->head_dim || format.dtype != spec->dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix_format is ", format.Describe(), "; the sequence has ", spec->num_layers,
        " layers, ", spec->num_kv_heads, " kv heads of ", spec->head_dim, ", ",
        numeric::DTypeName(spec->dtype)));
  }
  if (parts_.blocks == nullptr || parts_.blocks->options().capacity_bytes == 0) {
    return InPlacePrefix{};
  }
  TRIDENT_RETURN_IF_ERROR(parts_.store->CheckOwner(spec->owner_id, spec->owner_incarnation));
  // The sequence's last position takes a write: its prefix stays below it.
  const int64_t usable = (int64_t{spec->capacity_tokens} - 1) / format.block_size;
  if (usable < 1) return InPlacePrefix{};
  if (static_cast<int64_t>(keys.size()) > usable) keys.resize(usable);
  TRIDENT_ASSIGN_OR_RETURN(BlockStore::Borrowed borrowed, parts_.blocks->Borrow(format, keys));
  if (borrowed.ticket == 0) return InPlacePrefix{};
  spec->packing = KvPacking::kRows;
  spec->block_size = format.block_size;
  return InPlacePrefix{.blocks = std::move(borrowed.blocks),
                       .release = [blocks = parts_.blocks, ticket = borrowed.ticket] {
                         blocks->Return(ticket);
                       }};
}

grpc::ServerUnaryReactor* AttentionService::Connect(grpc::CallbackServerContext* context,
                                                    const trident::v1::ConnectRequest* request,
                                                    trident::v1::ConnectResponse* response) {
  const trident::v1::TransportEndpoint& client = request->client();
  absl::StatusOr<int> freed = parts_.store->Connect(client.owner_id(), client.incarnation());
  if (!freed.ok()) return FinishUnary(context, freed.status());
  if (client.ucx_worker_address().empty()) {
    return FinishUnary(context,
                       absl::InvalidArgumentError("client.ucx_worker_address must be set"));
  }
  absl::Status routed = parts_.data_plane->AddPeer(client);
  if (!routed.ok()) {
    return FinishUnary(context, absl::UnavailableError(
                                    absl::StrCat("cannot reach owner ", client.owner_id(),
                                                 " over UCX for its replies: ", routed.message())));
  }
  *response->mutable_server() = parts_.endpoint;
  response->set_numa_node(parts_.numa_node);
  response->set_isa(parts_.isa);
  SetProtoDuration(parts_.store->options().reconnect_grace, response->mutable_reconnect_grace());
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::AdmitSequence(
    grpc::CallbackServerContext* context, const trident::v1::AdmitSequenceRequest* request,
    trident::v1::AdmitSequenceResponse* response) {
  absl::StatusOr<SequenceSpec> spec = SpecFromProto(*request);
  if (!spec.ok()) return FinishUnary(context, spec.status());
  absl::StatusOr<InPlacePrefix> prefix = BorrowPrefix(*request, &*spec);
  if (!prefix.ok()) return FinishUnary(context, prefix.status());
  absl::StatusOr<AdmittedSequence> admitted = parts_.store->Admit(*spec, *std::move(prefix));
  if (!admitted.ok()) return FinishUnary(context, admitted.status());
  response->set_in_place_tokens(admitted->layout.prefix_blocks * admitted->layout.block_size);
  const SequenceLayout& layout = admitted->layout;
  response->set_handle(admitted->handle);
  response->set_write_key(admitted->write_key);
  *response->mutable_endpoint() = parts_.endpoint;
  trident::v1::KvLayout* kv = response->mutable_layout();
  kv->set_num_layers(layout.num_layers);
  kv->set_num_kv_heads(layout.num_kv_heads);
  kv->set_head_dim(layout.head_dim);
  kv->set_dtype(kv::ToProtoDType(layout.dtype));
  kv->set_block_size_tokens(layout.block_size);
  kv->set_block_layout(layout.packing == KvPacking::kPairs
                           ? trident::v1::KV_BLOCK_LAYOUT_HEAD_VNNI_PAIRS
                           : trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM);
  kv->set_layer_stride_bytes(layout.layer_stride_bytes);
  kv->set_block_stride_bytes(layout.block_stride_bytes);
  kv->set_value_offset_bytes(layout.value_offset_bytes);
  if (parts_.kv_region != nullptr) {
    trident::v1::KvRegion* region = response->add_regions();
    region->set_base_address(reinterpret_cast<uint64_t>(admitted->data));
    region->set_length_bytes(admitted->reserved_bytes);
    region->set_rkey(parts_.kv_region->packed_rkey());
    region->set_memory_type(trident::v1::MEMORY_TYPE_HOST);
  }
  response->set_capacity_tokens(layout.capacity_tokens);
  response->set_reserved_bytes(static_cast<int64_t>(admitted->reserved_bytes));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::ReleaseSequence(
    grpc::CallbackServerContext* context, const trident::v1::ReleaseSequenceRequest* request,
    trident::v1::ReleaseSequenceResponse* response) {
  absl::StatusOr<int64_t> freed =
      parts_.store->Release(request->owner_id(), request->owner_incarnation(), request->handle());
  if (!freed.ok()) return FinishUnary(context, freed.status());
  response->set_released(*freed > 0);
  response->set_freed_bytes(*freed);
  return FinishUnary(context, absl::OkStatus());
}

trident::v1::AttentionStats AttentionService::Stats() const {
  trident::v1::AttentionStats stats;
  stats.set_service_id(parts_.endpoint.owner_id());
  stats.set_incarnation(parts_.endpoint.incarnation());
  stats.set_numa_node(parts_.numa_node);
  stats.set_isa(parts_.isa);
  for (const std::string& feature : parts_.cpu_features) stats.add_cpu_features(feature);
  stats.set_threads(parts_.threads);
  const SequenceStoreStats store = parts_.store->Stats();
  stats.set_held_bytes(store.held_bytes);
  stats.set_capacity_bytes(store.capacity_bytes);
  stats.set_sequences(store.sequences);
  stats.set_held_tokens(store.held_tokens);
  stats.set_sessions(store.sessions);
  stats.set_in_place_sequences(store.in_place_sequences);
  stats.set_in_place_tokens(store.in_place_tokens);
  if (parts_.blocks != nullptr) {
    const BlockStoreStats blocks = parts_.blocks->Stats();
    trident::v1::BlockStoreStats* out = stats.mutable_block_store();
    out->set_blocks(blocks.blocks);
    out->set_reserved_blocks(blocks.reserved_blocks);
    out->set_bytes(blocks.bytes);
    out->set_capacity_bytes(blocks.capacity_bytes);
    out->set_blocks_written_total(blocks.blocks_written_total);
    out->set_evictions_total(blocks.evictions_total);
    out->set_blocks_refused_total(blocks.blocks_refused_total);
    out->set_lookups_total(blocks.lookups_total);
    out->set_blocks_matched_total(blocks.blocks_matched_total);
    out->set_blocks_read_total(blocks.blocks_read_total);
    out->set_pinned_blocks(blocks.pinned_blocks);
    out->set_borrows(blocks.borrows);
    out->set_borrowed_blocks(blocks.borrowed_blocks);
    if (absl::Status books = parts_.blocks->CheckInvariants(); !books.ok()) {
      out->set_invariant_violation(std::string(books.message()));
    }
  }
  if (parts_.data_plane_stats) {
    const DataPlaneStats data_plane = parts_.data_plane_stats();
    stats.set_attention_requests_total(data_plane.requests);
    if (data_plane.requests > 0) {
      SetProtoDuration(data_plane.mean_request_time, stats.mutable_attention_request_time());
    }
  }
  return stats;
}

grpc::ServerUnaryReactor* AttentionService::GetStats(
    grpc::CallbackServerContext* context, const trident::v1::GetAttentionStatsRequest* request,
    trident::v1::AttentionStats* response) {
  *response = Stats();
  return FinishUnary(context, absl::OkStatus());
}

absl::StatusOr<BlockFormat> BlockFormatFromProto(const trident::v1::BlockFormat& format) {
  const trident::v1::KvLayout& layout = format.layout();
  if (layout.block_layout() != trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM) {
    return absl::InvalidArgumentError(
        "format.layout.block_layout: stored blocks are KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM");
  }
  absl::StatusOr<numeric::DType> dtype = kv::FromProtoDType(layout.dtype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("format.layout.dtype: ", dtype.status().message()));
  }
  BlockFormat result{.model_identity = format.model_identity(),
                     .num_layers = layout.num_layers(),
                     .num_kv_heads = layout.num_kv_heads(),
                     .head_dim = layout.head_dim(),
                     .block_size = layout.block_size_tokens(),
                     .dtype = *dtype};
  TRIDENT_RETURN_IF_ERROR(ValidateBlockFormat(result));
  return result;
}

absl::StatusOr<std::vector<kv::BlockKey>> BlockKeysFromProto(
    const google::protobuf::RepeatedField<uint64_t>& hi,
    const google::protobuf::RepeatedField<uint64_t>& lo) {
  if (hi.size() != lo.size()) {
    return absl::InvalidArgumentError(absl::StrCat("key_hi has ", hi.size(), " keys, key_lo ",
                                                   lo.size()));
  }
  std::vector<kv::BlockKey> keys(hi.size());
  for (int i = 0; i < hi.size(); ++i) keys[i] = kv::BlockKey{.hi = hi[i], .lo = lo[i]};
  return keys;
}

namespace {

// The owner's session, the format and the keys of a block request.
template <typename Request>
absl::Status ParseBlockRequest(const SequenceStore& store, const BlockStore* blocks,
                               const Request& request, BlockFormat* format,
                               std::vector<kv::BlockKey>* keys) {
  if (blocks == nullptr) return absl::UnimplementedError("this service has no block store");
  TRIDENT_RETURN_IF_ERROR(store.CheckOwner(request.owner_id(), request.owner_incarnation()));
  TRIDENT_ASSIGN_OR_RETURN(*format, BlockFormatFromProto(request.format()));
  TRIDENT_ASSIGN_OR_RETURN(*keys, BlockKeysFromProto(request.key_hi(), request.key_lo()));
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* AttentionService::ReserveBlocks(
    grpc::CallbackServerContext* context, const trident::v1::ReserveBlocksRequest* request,
    trident::v1::ReserveBlocksResponse* response) {
  BlockFormat format;
  std::vector<kv::BlockKey> keys;
  absl::Status parsed = ParseBlockRequest(*parts_.store, parts_.blocks, *request, &format, &keys);
  if (!parsed.ok()) return FinishUnary(context, parsed);
  absl::StatusOr<BlockStore::Reservation> reserved = parts_.blocks->Reserve(
      BlockOwner{.owner_id = request->owner_id(), .incarnation = request->owner_incarnation()},
      format, keys);
  if (!reserved.ok()) return FinishUnary(context, reserved.status());
  response->set_ticket(reserved->ticket);
  for (int32_t index : reserved->write) response->add_write(index);
  response->set_block_bytes(static_cast<int64_t>(reserved->block_bytes));
  response->set_refused_from(reserved->refused_from);
  SetProtoDuration(parts_.blocks->options().put_lease, response->mutable_lease());
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::LookupBlocks(
    grpc::CallbackServerContext* context, const trident::v1::LookupBlocksRequest* request,
    trident::v1::LookupBlocksResponse* response) {
  BlockFormat format;
  std::vector<kv::BlockKey> keys;
  absl::Status parsed = ParseBlockRequest(*parts_.store, parts_.blocks, *request, &format, &keys);
  if (!parsed.ok()) return FinishUnary(context, parsed);
  absl::StatusOr<BlockStore::Match> match = parts_.blocks->Lookup(
      BlockOwner{.owner_id = request->owner_id(), .incarnation = request->owner_incarnation()},
      format, keys);
  if (!match.ok()) return FinishUnary(context, match.status());
  response->set_matched(match->matched);
  response->set_ticket(match->ticket);
  response->set_block_bytes(static_cast<int64_t>(match->block_bytes));
  SetProtoDuration(parts_.blocks->options().read_lease, response->mutable_lease());
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::ReleaseBlocks(
    grpc::CallbackServerContext* context, const trident::v1::ReleaseBlocksRequest* request,
    trident::v1::ReleaseBlocksResponse* response) {
  if (parts_.blocks == nullptr) {
    return FinishUnary(context, absl::UnimplementedError("this service has no block store"));
  }
  response->set_released(parts_.blocks->Release(
      BlockOwner{.owner_id = request->owner_id(), .incarnation = request->owner_incarnation()},
      request->ticket()));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::GetKvEvents(
    grpc::CallbackServerContext* context, const trident::v1::GetKvEventsRequest* request,
    trident::v1::GetKvEventsResponse* response) {
  if (parts_.blocks == nullptr) {
    return FinishUnary(context, absl::UnimplementedError("this service has no block store"));
  }
  uint64_t cursor = request->cursor();
  const kv::KvEventBatch batch = parts_.blocks->EventsSince(&cursor);
  const std::optional<BlockFormat> format = parts_.blocks->format();
  kv::KvEventsToProto(batch, format.has_value() ? format->model_identity : "",
                      format.has_value() ? format->block_size : 0, "dram",
                      response->mutable_events());
  response->set_cursor(cursor);
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace trident::attention
