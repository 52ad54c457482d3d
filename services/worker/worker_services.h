#ifndef TRIDENT_SERVICES_WORKER_WORKER_SERVICES_H_
#define TRIDENT_SERVICES_WORKER_WORKER_SERVICES_H_

// The worker's gRPC services: Prefill (router → prefill worker), Decode
// (KV reservations and the decode stream) and WorkerControl (load reports,
// role changes, allocator counts). The worker also serves the public
// Generation API directly when colocated (role `both`).
//
// This build has no model runtime yet, so every RPC answers UNIMPLEMENTED
// and names what it needs.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "services/worker/load_streams.h"
#include "trident/v1/cluster.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::worker {

// Where a worker runs its model: the CPU backend or one CUDA device.
struct Device {
  enum class Kind { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int ordinal = 0;  // CUDA device index; 0 for the CPU.

  std::string ToString() const;
};

// Parses "cpu" or "cuda:N" (N >= 0). kInvalidArgument names the flag.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

// Parses "prefill", "decode" or "both". kInvalidArgument names the flag.
absl::StatusOr<trident::v1::Role> ParseRole(absl::string_view text);

// Thread-safe.
class UnservedPrefillService final : public trident::v1::Prefill::CallbackService {
 public:
  grpc::ServerWriteReactor<trident::v1::PrefillResponse>* Prefill(
      grpc::CallbackServerContext* context, const trident::v1::PrefillRequest* request) override;
};

// trident.v1.Decode on a worker without a model: every call UNIMPLEMENTED.
// (With a model the worker serves decode_service.h's DecodeService.)
// Thread-safe.
class UnservedDecodeService final : public trident::v1::Decode::CallbackService {
 public:
  grpc::ServerUnaryReactor* ReserveKv(grpc::CallbackServerContext* context,
                                      const trident::v1::ReserveKvRequest* request,
                                      trident::v1::ReserveKvResponse* response) override;
  grpc::ServerUnaryReactor* RenewKv(grpc::CallbackServerContext* context,
                                    const trident::v1::RenewKvRequest* request,
                                    trident::v1::RenewKvResponse* response) override;
  grpc::ServerUnaryReactor* CommitKv(grpc::CallbackServerContext* context,
                                     const trident::v1::CommitKvRequest* request,
                                     trident::v1::CommitKvResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseKv(grpc::CallbackServerContext* context,
                                      const trident::v1::ReleaseKvRequest* request,
                                      trident::v1::ReleaseKvResponse* response) override;
  grpc::ServerWriteReactor<trident::v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext* context, const trident::v1::DecodeRequest* request) override;
};

// Thread-safe.
class WorkerControlService final : public trident::v1::WorkerControl::CallbackService {
 public:
  // `engine` and `loads` (either may be null when no model is loaded) must
  // outlive the service.
  explicit WorkerControlService(engine::Engine* engine = nullptr, LoadStreams* loads = nullptr)
      : engine_(engine), loads_(loads) {}

  grpc::ServerWriteReactor<trident::v1::WorkerLoad>* GetLoad(
      grpc::CallbackServerContext* context, const trident::v1::GetLoadRequest* request) override;
  grpc::ServerUnaryReactor* SetRole(grpc::CallbackServerContext* context,
                                    const trident::v1::SetRoleRequest* request,
                                    trident::v1::SetRoleResponse* response) override;
  grpc::ServerUnaryReactor* GetKvStats(grpc::CallbackServerContext* context,
                                       const trident::v1::GetKvStatsRequest* request,
                                       trident::v1::KvStats* response) override;

 private:
  engine::Engine* engine_;
  LoadStreams* loads_;
};

// Identity and state a load sample reports beside the engine's figures.
struct WorkerIdentity {
  std::string worker_id;
  uint64_t incarnation = 0;
  trident::v1::Role role = trident::v1::ROLE_BOTH;
};

// A WorkerLoad from the engine's stats (and reservation counts, 0 without
// a decode role), stamped `now`.
trident::v1::WorkerLoad WorkerLoadFromStats(const WorkerIdentity& identity,
                                            const engine::EngineStats& stats,
                                            int32_t kv_blocks_reserved,
                                            int32_t kv_waiting_sequences, absl::Time now);

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_WORKER_SERVICES_H_
