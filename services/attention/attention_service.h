#ifndef TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVICE_H_
#define TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVICE_H_

// The CPU attention service's control RPCs (trident.v1.Attention): session
// set-up (with the UCX route for the data plane's replies), admission and
// release of offloaded sequences, stats. Per-layer q/k/v and outputs travel
// over UCX (common/transport/attention), not gRPC; so does a prefill
// worker's prompt KV, written into the regions AdmitSequence returns.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/transport/attention/ucx_attention_server.h"
#include "common/transport/ucx_worker.h"
#include "services/attention/kv_store/block_store.h"
#include "services/attention/kv_store/sequence_store.h"
#include "trident/v1/attention.grpc.pb.h"

namespace trident::attention {

// What the service reports about its data plane.
struct DataPlaneStats {
  int64_t requests = 0;
  // Mean time to serve one request (exponentially weighted); zero before
  // the first.
  absl::Duration mean_request_time;
};

// What the service is built on; every pointer must outlive it.
struct AttentionServiceParts {
  SequenceStore* store = nullptr;
  // The KV block store (the DRAM tier); null: its RPCs are UNIMPLEMENTED.
  BlockStore* blocks = nullptr;
  // Connect routes each owner's replies through it.
  transport::attention::UcxAttentionServer* data_plane = nullptr;
  // The service's UCX endpoint (owner id, incarnation, lane addresses, lane,
  // memory type).
  trident::v1::TransportEndpoint endpoint;
  // The registered memory every sequence's KV lies in, for one-sided
  // writes; null: AdmitSequence returns no regions (data-plane appends only).
  const transport::MemoryRegion* kv_region = nullptr;
  int32_t numa_node = 0;
  trident::v1::Isa isa = trident::v1::ISA_UNSPECIFIED;
  std::vector<std::string> cpu_features;
  int32_t threads = 0;
  std::function<DataPlaneStats()> data_plane_stats;
};

// Thread-safe.
class AttentionService final : public trident::v1::Attention::CallbackService {
 public:
  explicit AttentionService(AttentionServiceParts parts) : parts_(std::move(parts)) {}

  grpc::ServerUnaryReactor* Connect(grpc::CallbackServerContext* context,
                                    const trident::v1::ConnectRequest* request,
                                    trident::v1::ConnectResponse* response) override;
  grpc::ServerUnaryReactor* AdmitSequence(grpc::CallbackServerContext* context,
                                          const trident::v1::AdmitSequenceRequest* request,
                                          trident::v1::AdmitSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseSequence(
      grpc::CallbackServerContext* context, const trident::v1::ReleaseSequenceRequest* request,
      trident::v1::ReleaseSequenceResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const trident::v1::GetAttentionStatsRequest* request,
                                     trident::v1::AttentionStats* response) override;

  grpc::ServerUnaryReactor* ReserveBlocks(grpc::CallbackServerContext* context,
                                          const trident::v1::ReserveBlocksRequest* request,
                                          trident::v1::ReserveBlocksResponse* response) override;
  grpc::ServerUnaryReactor* LookupBlocks(grpc::CallbackServerContext* context,
                                         const trident::v1::LookupBlocksRequest* request,
                                         trident::v1::LookupBlocksResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseBlocks(grpc::CallbackServerContext* context,
                                          const trident::v1::ReleaseBlocksRequest* request,
                                          trident::v1::ReleaseBlocksResponse* response) override;
  grpc::ServerUnaryReactor* GetKvEvents(grpc::CallbackServerContext* context,
                                        const trident::v1::GetKvEventsRequest* request,
                                        trident::v1::GetKvEventsResponse* response) override;

  // GetStats's answer.
  trident::v1::AttentionStats Stats() const;

 private:
  // The request's prefix, borrowed from the block store as far as it holds
  // the chain (none without a store or a match); adapts `spec` to the
  // store's layout when it matched. INVALID_ARGUMENT for a malformed prefix
  // or one whose shape is not the sequence's.
  absl::StatusOr<InPlacePrefix> BorrowPrefix(const trident::v1::AdmitSequenceRequest& request,
                                             SequenceSpec* spec) const;

  const AttentionServiceParts parts_;
};

// AdmitSequenceRequest -> SequenceSpec; INVALID_ARGUMENT for a dtype other
// than f32, f16 or bf16.
absl::StatusOr<SequenceSpec> SpecFromProto(const trident::v1::AdmitSequenceRequest& request);

// A block request's format and keys, validated: INVALID_ARGUMENT naming the
// field (a layout other than HEAD_TOKEN_DIM, key_hi and key_lo of
// different lengths).
absl::StatusOr<BlockFormat> BlockFormatFromProto(const trident::v1::BlockFormat& format);
absl::StatusOr<std::vector<kv::BlockKey>> BlockKeysFromProto(
    const google::protobuf::RepeatedField<uint64_t>& hi,
    const google::protobuf::RepeatedField<uint64_t>& lo);

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVICE_H_
