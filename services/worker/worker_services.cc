#include "services/worker/worker_services.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/reactors.h"
#include "common/status/error_details.h"
#include "common/time/proto_time.h"

namespace trident::worker {
namespace {

using ::trident::v1::DecodeResponse;
using ::trident::v1::PrefillResponse;
using ::trident::v1::WorkerLoad;

absl::Status NotServedYet(absl::string_view service, absl::string_view method,
                          absl::string_view missing) {
  return absl::UnimplementedError(absl::StrCat("trident.v1.", service, "/", method,
                                               " is not served by this worker build: it needs ",
                                               missing));
}

constexpr absl::string_view kNeedsEngine = "the model runtime (engine, paged KV cache)";
constexpr absl::string_view kNeedsTransport =
    "the model runtime's paged KV cache and the UCX KV transport";

}  // namespace

std::string Device::ToString() const {
  return kind == Kind::kCpu ? "cpu" : absl::StrCat("cuda:", ordinal);
}

absl::StatusOr<Device> ParseDevice(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "cpu") return Device{};
  int ordinal = -1;
  if (absl::StartsWith(lower, "cuda:") && absl::SimpleAtoi(lower.substr(5), &ordinal) &&
      ordinal >= 0) {
    return Device{.kind = Device::Kind::kCuda, .ordinal = ordinal};
  }
  return InvalidArgumentForField(
      "--device", absl::StrCat("expected 'cpu' or 'cuda:N' with N >= 0, got '", text, "'"));
}

absl::StatusOr<trident::v1::Role> ParseRole(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "prefill") return trident::v1::ROLE_PREFILL;
  if (lower == "decode") return trident::v1::ROLE_DECODE;
  if (lower == "both") return trident::v1::ROLE_BOTH;
  return InvalidArgumentForField(
      "--role", absl::StrCat("expected 'prefill', 'decode' or 'both', got '", text, "'"));
}

grpc::ServerWriteReactor<PrefillResponse>* UnservedPrefillService::Prefill(
    grpc::CallbackServerContext* context, const trident::v1::PrefillRequest* request) {
  return new FinishedWriteReactor<PrefillResponse>(
      NotServedYet("Prefill", "Prefill", kNeedsTransport));
}

grpc::ServerUnaryReactor* UnservedDecodeService::ReserveKv(
    grpc::CallbackServerContext* context, const trident::v1::ReserveKvRequest* request,
    trident::v1::ReserveKvResponse* response) {
  return FinishUnary(context, NotServedYet("Decode", "ReserveKv", kNeedsTransport));
}

grpc::ServerUnaryReactor* UnservedDecodeService::RenewKv(grpc::CallbackServerContext* context,
                                                         const trident::v1::RenewKvRequest* request,
                                                         trident::v1::RenewKvResponse* response) {
  return FinishUnary(context, NotServedYet("Decode", "RenewKv", kNeedsTransport));
}

grpc::ServerUnaryReactor* UnservedDecodeService::CommitKv(
    grpc::CallbackServerContext* context, const trident::v1::CommitKvRequest* request,
    trident::v1::CommitKvResponse* response) {
  return FinishUnary(context, NotServedYet("Decode", "CommitKv", kNeedsTransport));
}

grpc::ServerUnaryReactor* UnservedDecodeService::ReleaseKv(
    grpc::CallbackServerContext* context, const trident::v1::ReleaseKvRequest* request,
    trident::v1::ReleaseKvResponse* response) {
  return FinishUnary(context, NotServedYet("Decode", "ReleaseKv", kNeedsTransport));
}

grpc::ServerWriteReactor<DecodeResponse>* UnservedDecodeService::Decode(
    grpc::CallbackServerContext* context, const trident::v1::DecodeRequest* request) {
  return new FinishedWriteReactor<DecodeResponse>(NotServedYet("Decode", "Decode", kNeedsEngine));
}

grpc::ServerWriteReactor<WorkerLoad>* WorkerControlService::GetLoad(
    grpc::CallbackServerContext* context, const trident::v1::GetLoadRequest* request) {
  if (loads_ == nullptr) {
    return new FinishedWriteReactor<WorkerLoad>(
        NotServedYet("WorkerControl", "GetLoad", kNeedsEngine));
  }
  return loads_->Open(context, request);
}

WorkerLoad WorkerLoadFromStats(const WorkerIdentity& identity, const engine::EngineStats& stats,
                               int32_t kv_blocks_reserved, int32_t kv_waiting_sequences,
                               absl::Time now) {
  WorkerLoad load;
  load.set_worker_id(identity.worker_id);
  load.set_incarnation(identity.incarnation);
  SetProtoTimestamp(now, load.mutable_sample_time());
  load.set_role(identity.role);
  if (identity.pending_role != trident::v1::ROLE_UNSPECIFIED) {
    load.set_state(trident::v1::SERVING_STATE_DRAINING);
    load.set_pending_role(identity.pending_role);
  } else {
    load.set_state(trident::v1::SERVING_STATE_SERVING);
  }
  load.set_running_sequences(stats.running);
  load.set_waiting_sequences(stats.waiting);
  load.set_kv_waiting_sequences(kv_waiting_sequences);
  load.set_queued_prefill_tokens(stats.queued_prefill_tokens);
  load.set_kv_blocks_free(stats.blocks_free);
  load.set_kv_blocks_used(stats.blocks_total - stats.blocks_free);
  load.set_kv_blocks_reserved(kv_blocks_reserved);
  load.set_kv_blocks_total(stats.blocks_total);
  load.set_prefill_tokens_per_second(stats.prefill_tokens_per_second);
  if (stats.decode_step_seconds > 0) {
    SetProtoDuration(absl::Seconds(stats.decode_step_seconds), load.mutable_decode_step_time());
  }
  load.set_batch_context_tokens(stats.batch_context_tokens);
  load.set_cpu_attention_sequences(stats.remote_running);
  return load;
}

absl::StatusOr<RoleChange> RoleChangeFromProto(const trident::v1::SetRoleRequest& request) {
  RoleChange change;
  change.role = request.role();
  change.directive_id = request.directive_id();
  change.reason = request.reason();
  if (request.has_drain_timeout()) {
    const google::protobuf::Duration& d = request.drain_timeout();
    // google.protobuf.Duration: |nanos| < 1e9, with the sign of seconds.
    const bool valid = d.nanos() > -1'000'000'000 && d.nanos() < 1'000'000'000 &&
                       (d.seconds() == 0 || d.nanos() == 0 || (d.seconds() > 0) == (d.nanos() > 0));
    if (!valid) {
      return InvalidArgumentForField(
          "drain_timeout",
          absl::StrCat("is not a valid duration (", d.seconds(), " s, ", d.nanos(), " ns)"));
    }
    change.drain_timeout = DurationFromProto(d);
  }
  return change;
}

void RoleChangeResultToProto(const RoleChangeResult& result,
                             trident::v1::SetRoleResponse* response) {
  response->set_previous_role(result.previous_role);
  response->set_role(result.role);
  SetProtoDuration(result.drain_time, response->mutable_drain_time());
  response->set_drained_sequences(result.drained_sequences);
  response->set_aborted_sequences(result.aborted_sequences);
}

namespace {

// The reactor of a SetRole call that drains: finished by the change's
// thread; cancelling it cuts the drain short.
class SetRoleReactor final : public grpc::ServerUnaryReactor {
 public:
  SetRoleReactor(WorkerRole* role, uint64_t change_id) : role_(role), change_id_(change_id) {}
  void OnCancel() override { role_->CutDrainShort(change_id_); }
  void OnDone() override { delete this; }

 private:
  WorkerRole* const role_;
  const uint64_t change_id_;
};

}  // namespace

WorkerControlService::~WorkerControlService() {
  absl::MutexLock lock(&mu_);
  if (role_ != nullptr) role_->CutDrainShort(change_id_);
  if (change_thread_.joinable()) change_thread_.join();
}

grpc::ServerUnaryReactor* WorkerControlService::SetRole(grpc::CallbackServerContext* context,
                                                        const trident::v1::SetRoleRequest* request,
                                                        trident::v1::SetRoleResponse* response) {
  if (role_ == nullptr) {
    return FinishUnary(context, NotServedYet("WorkerControl", "SetRole", "a role holder"));
  }
  absl::StatusOr<RoleChange> change = RoleChangeFromProto(*request);
  if (!change.ok()) return FinishUnary(context, change.status());
  absl::StatusOr<WorkerRole::Started> started = role_->BeginChange(*change);
  if (!started.ok()) return FinishUnary(context, started.status());
  if (started->change_id == 0) {
    RoleChangeResultToProto(started->result, response);
    return FinishUnary(context, absl::OkStatus());
  }
  auto* reactor = new SetRoleReactor(role_, started->change_id);
  absl::MutexLock lock(&mu_);
  // The previous change is over (else BeginChange would have refused this
  // one): its thread is at most returning.
  if (change_thread_.joinable()) change_thread_.join();
  change_id_ = started->change_id;
  change_thread_ = std::thread([role = role_, id = started->change_id, reactor, response] {
    RoleChangeResultToProto(role->FinishChange(id), response);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerControlService::GetKvStats(
    grpc::CallbackServerContext* context, const trident::v1::GetKvStatsRequest* request,
    trident::v1::KvStats* response) {
  if (engine_ == nullptr) {
    return FinishUnary(context, absl::FailedPreconditionError(
                                    "WorkerControl.GetKvStats: this worker has no model loaded "
                                    "(start it with --model)"));
  }
  const engine::EngineStats stats = engine_->stats();
  response->set_block_size_tokens(engine_->backend().kv_capacity().block_size);
  response->set_blocks_total(stats.blocks_total);
  response->set_blocks_free(stats.blocks_free);
  response->set_blocks_in_sequences(stats.blocks_total - stats.blocks_free);
  response->set_sequences(stats.running + stats.waiting);
  response->set_blocks_cached(stats.blocks_cached);
  response->set_prefix_cache_queries_total(stats.prefix_cache_queries_total);
  response->set_prefix_cache_hits_total(stats.prefix_cache_hits_total);
  response->set_kv_transfer_cached_blocks_total(stats.kv_reserved_cached_blocks_total);
  response->set_kv_invariant_failures_total(stats.kv_invariant_failures_total);
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace trident::worker
