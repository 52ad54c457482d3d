#include "common/grpc/server.h"

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace trident {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, std::vector<RegisteredService> services) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be in [0, 65535], got ", options.port));
  }
  if (options.host.empty()) return absl::InvalidArgumentError("host must not be empty");
  // Both are process-wide switches that must be set before the first server
  // is built; setting them again is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  int bound_port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound_port);
  // Without this, gRPC binds with SO_REUSEPORT and a second process on the
  // same port silently takes half the traffic instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  std::vector<std::string> names;
  for (const RegisteredService& entry : services) {
    builder.RegisterService(entry.service);
    names.push_back(entry.name);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", address, ": the address is in use or invalid"));
  }
  std::unique_ptr<GrpcServer> result(new GrpcServer(std::move(server), bound_port, names));
  result->SetServing(true);
  return result;
}

GrpcServer::~GrpcServer() { Drain(absl::Now()); }

void GrpcServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  TRIDENT_CHECK(health != nullptr) << "the default health service is enabled in Start()";
  health->SetServingStatus(serving);
  for (const std::string& name : service_names_) health->SetServingStatus(name, serving);
}

void GrpcServer::Drain(absl::Time deadline) {
  // Shutdown() is safe to call again: a second call returns once the first
  // one's calls are done.
  SetServing(false);
  // Ends health Watch streams (after their NOT_SERVING update), so that
  // watchers do not hold the drain open until the deadline.
  server_->GetHealthCheckService()->Shutdown();
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
}

}  // namespace trident
