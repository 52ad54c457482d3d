#include "services/controller/controller_service.h"

#include "absl/strings/str_cat.h"
#include "common/grpc/reactors.h"

namespace trident::controller {
namespace {

using ::trident::v1::HeartbeatRequest;
using ::trident::v1::HeartbeatResponse;
using ::trident::v1::Topology;

absl::Status NotServedYet(absl::string_view method) {
  return absl::UnimplementedError(absl::StrCat(
      "trident.v1.Controller/", method,
      " is not served by this controller build: it needs the membership registry and the "
      "role planner"));
}

}  // namespace

grpc::ServerUnaryReactor* ControllerService::Register(grpc::CallbackServerContext* context,
                                                      const trident::v1::RegisterRequest* request,
                                                      trident::v1::RegisterResponse* response) {
  return FinishUnary(context, NotServedYet("Register"));
}

grpc::ServerBidiReactor<HeartbeatRequest, HeartbeatResponse>* ControllerService::Heartbeat(
    grpc::CallbackServerContext* context) {
  return new FinishedBidiReactor<HeartbeatRequest, HeartbeatResponse>(NotServedYet("Heartbeat"));
}

grpc::ServerUnaryReactor* ControllerService::Deregister(
    grpc::CallbackServerContext* context, const trident::v1::DeregisterRequest* request,
    trident::v1::DeregisterResponse* response) {
  return FinishUnary(context, NotServedYet("Deregister"));
}

grpc::ServerUnaryReactor* ControllerService::GetTopology(
    grpc::CallbackServerContext* context, const trident::v1::GetTopologyRequest* request,
    Topology* response) {
  return FinishUnary(context, NotServedYet("GetTopology"));
}

grpc::ServerWriteReactor<Topology>* ControllerService::WatchTopology(
    grpc::CallbackServerContext* context, const trident::v1::WatchTopologyRequest* request) {
  return new FinishedWriteReactor<Topology>(NotServedYet("WatchTopology"));
}

}  // namespace trident::controller
