#ifndef TRIDENT_SERVICES_WORKER_WORKER_SERVICES_H_
#define TRIDENT_SERVICES_WORKER_WORKER_SERVICES_H_

// The worker's gRPC services: Prefill (router → prefill worker), Decode
// (KV reservations and the decode stream) and WorkerControl (load reports,
// role changes, allocator counts). The worker also serves the public
// Generation API directly when colocated (role `both`).
//
// Without a model (no --model), Prefill and Decode answer UNIMPLEMENTED and
// name what they need.

#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "services/worker/load_streams.h"
#include "services/worker/worker_role.h"
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

// trident.v1.WorkerControl. SetRole validates and starts the change at
// once (WorkerRole::BeginChange: new work of the capabilities being lost is
// refused from then on) and finishes the call from a thread of its own once
// the drain is over and the new role in effect. Cancelling the call (its
// deadline, the client leaving, the server shutting down) cuts the drain
// short: the work left is aborted and the switch completes.
// Thread-safe.
class WorkerControlService final : public trident::v1::WorkerControl::CallbackService {
 public:
  // `engine`, `loads` (either may be null when no model is loaded) and
  // `role` (null: SetRole answers UNIMPLEMENTED) must outlive the service.
  explicit WorkerControlService(engine::Engine* engine = nullptr, LoadStreams* loads = nullptr,
                                WorkerRole* role = nullptr)
      : engine_(engine), loads_(loads), role_(role) {}
  // Cuts a role change in progress short and waits for it to finish.
  ~WorkerControlService() override;

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
  WorkerRole* role_;
  absl::Mutex mu_;
  // The thread finishing the latest role change, and that change.
  std::thread change_thread_ ABSL_GUARDED_BY(mu_);
  uint64_t change_id_ ABSL_GUARDED_BY(mu_) = 0;
};

// A role change from a SetRole request: INVALID_ARGUMENT naming
// `drain_timeout` when it is not a valid duration (the range is
// WorkerRole::BeginChange's to check).
absl::StatusOr<RoleChange> RoleChangeFromProto(const trident::v1::SetRoleRequest& request);

// Fills a SetRoleResponse.
void RoleChangeResultToProto(const RoleChangeResult& result,
                             trident::v1::SetRoleResponse* response);

// Identity and state a load sample reports beside the engine's figures.
struct WorkerIdentity {
  std::string worker_id;
  uint64_t incarnation = 0;
  trident::v1::Role role = trident::v1::ROLE_BOTH;
  // While draining for a role change, the role being switched to (the
  // sample's state is then DRAINING); else ROLE_UNSPECIFIED.
  trident::v1::Role pending_role = trident::v1::ROLE_UNSPECIFIED;
};

// A WorkerLoad from the engine's stats (and reservation counts, 0 without
// a decode role), stamped `now`.
trident::v1::WorkerLoad WorkerLoadFromStats(const WorkerIdentity& identity,
                                            const engine::EngineStats& stats,
                                            int32_t kv_blocks_reserved,
                                            int32_t kv_waiting_sequences, absl::Time now);

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_WORKER_SERVICES_H_
