#ifndef TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_
#define TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_

// The controller's gRPC service (trident.v1.Controller): membership
// (register, heartbeat, deregister) and the topology routers watch.
//
// This build keeps no membership yet: every RPC answers UNIMPLEMENTED and
// names what it needs.

#include "trident/v1/controller.grpc.pb.h"

namespace trident::controller {

// Thread-safe.
class ControllerService final : public trident::v1::Controller::CallbackService {
 public:
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const trident::v1::RegisterRequest* request,
                                     trident::v1::RegisterResponse* response) override;
  grpc::ServerBidiReactor<trident::v1::HeartbeatRequest, trident::v1::HeartbeatResponse>*
  Heartbeat(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* context,
                                       const trident::v1::DeregisterRequest* request,
                                       trident::v1::DeregisterResponse* response) override;
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* context,
                                        const trident::v1::GetTopologyRequest* request,
                                        trident::v1::Topology* response) override;
  grpc::ServerWriteReactor<trident::v1::Topology>* WatchTopology(
      grpc::CallbackServerContext* context,
      const trident::v1::WatchTopologyRequest* request) override;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_
