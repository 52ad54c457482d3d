#include "services/controller/balancer/role_setter.h"

#include <utility>

#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "common/time/proto_time.h"

namespace trident::controller {

namespace v1 = ::trident::v1;

struct GrpcRoleSetter::Call {
  grpc::ClientContext context;
  v1::SetRoleRequest request;
  v1::SetRoleResponse response;
  Done done;
};

GrpcRoleSetter::~GrpcRoleSetter() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* in_flight) { return *in_flight == 0; }, &in_flight_));
}

v1::WorkerControl::Stub* GrpcRoleSetter::StubFor(const std::string& address) {
  std::unique_ptr<v1::WorkerControl::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::WorkerControl::NewStub(CreateClusterChannel(address));
  }
  return stub.get();
}

void GrpcRoleSetter::SetRole(const std::string& address, const v1::SetRoleRequest& request,
                             Done done) {
  auto call = std::make_shared<Call>();
  call->request = request;
  call->done = std::move(done);
  const absl::Duration drain = request.has_drain_timeout()
                                   ? DurationFromProto(request.drain_timeout())
                                   : absl::Seconds(30);
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + drain + margin_));
  v1::WorkerControl::Stub* stub;
  {
    absl::MutexLock lock(&mu_);
    stub = StubFor(address);
    ++in_flight_;
  }
  stub->async()->SetRole(&call->context, &call->request, &call->response,
                         [this, call](grpc::Status status) {
                           if (status.ok()) {
                             call->done(std::move(call->response));
                           } else {
                             call->done(FromGrpcStatus(status));
                           }
                           absl::MutexLock lock(&mu_);
                           --in_flight_;
                         });
}

}  // namespace trident::controller
