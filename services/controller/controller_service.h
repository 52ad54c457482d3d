#ifndef TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_
#define TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_

// The controller's gRPC service (trident.v1.Controller) over its
// membership: Register, Heartbeat streams (each message applied to the
// membership; an error ends the stream with its status, e.g. NOT_FOUND
// after a controller restart, so the member registers again), Deregister,
// GetTopology, WatchTopology (the current topology, then every change; a
// slow reader gets the newest topology, not a queue) and GetStatus (the
// role balancer's decisions).

#include "services/controller/balancer/role_balancer.h"
#include "services/controller/membership/membership.h"
#include "trident/v1/controller.grpc.pb.h"

namespace trident::controller {

// Thread-safe.
class ControllerService final : public trident::v1::Controller::CallbackService {
 public:
  // `membership` must outlive the service; `balancer` too, or is null (then
  // GetStatus reports no decisions).
  ControllerService(Membership* membership, const RoleBalancer* balancer)
      : membership_(membership), balancer_(balancer) {}

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
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const trident::v1::GetControllerStatusRequest* request,
                                      trident::v1::ControllerStatus* response) override;

 private:
  Membership* const membership_;
  const RoleBalancer* const balancer_;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVICE_H_
