#include "services/attention/attention_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc/reactors.h"

namespace trident::attention {
namespace {

absl::Status NotServedYet(absl::string_view method, absl::string_view missing) {
  return absl::UnimplementedError(absl::StrCat(
      "trident.v1.Attention/", method, " is not served by this attention build: it needs ",
      missing));
}

constexpr absl::string_view kNeedsKvStore =
    "the NUMA-local KV store, the CPU attention kernels and the UCX transport";

}  // namespace

grpc::ServerUnaryReactor* AttentionService::Connect(grpc::CallbackServerContext* context,
                                                    const trident::v1::ConnectRequest* request,
                                                    trident::v1::ConnectResponse* response) {
  return FinishUnary(context, NotServedYet("Connect", "the UCX transport"));
}

grpc::ServerUnaryReactor* AttentionService::AdmitSequence(
    grpc::CallbackServerContext* context, const trident::v1::AdmitSequenceRequest* request,
    trident::v1::AdmitSequenceResponse* response) {
  return FinishUnary(context, NotServedYet("AdmitSequence", kNeedsKvStore));
}

grpc::ServerUnaryReactor* AttentionService::ReleaseSequence(
    grpc::CallbackServerContext* context, const trident::v1::ReleaseSequenceRequest* request,
    trident::v1::ReleaseSequenceResponse* response) {
  return FinishUnary(context, NotServedYet("ReleaseSequence", kNeedsKvStore));
}

grpc::ServerUnaryReactor* AttentionService::GetStats(
    grpc::CallbackServerContext* context, const trident::v1::GetAttentionStatsRequest* request,
    trident::v1::AttentionStats* response) {
  return FinishUnary(context, NotServedYet("GetStats", kNeedsKvStore));
}

}  // namespace trident::attention
