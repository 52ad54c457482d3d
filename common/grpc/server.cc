#include "common/grpc/server.h"

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"

namespace trident {

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, std::vector<RegisteredService> services) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port must be in [0, 65535], got ", options.port));
  }
  if (options.host.empty()) return absl::InvalidArgumentError("host must not be empty");
  // Process-wide switches, set before the first server is built: Trident's
  // own health service replaces gRPC's built-in one, and every server offers
  // reflection.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto health = std::make_unique<HealthService>();

  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(options.host, ":", options.port);
  int bound_port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound_port);
  // Without this, gRPC binds with SO_REUSEPORT and a second process on the
  // same port silently takes half the traffic instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(health.get());
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
  std::unique_ptr<GrpcServer> result(
      new GrpcServer(std::move(health), std::move(server), bound_port, names));
  result->SetServing(true);
  return result;
}

GrpcServer::~GrpcServer() { Drain(absl::Now()); }

void GrpcServer::SetServing(bool serving) {
  const HealthService::ServingStatus status =
      serving ? grpc::health::v1::HealthCheckResponse::SERVING
              : grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  health_->SetStatus("", status);
  for (const std::string& name : service_names_) health_->SetStatus(name, status);
}

void GrpcServer::Drain(absl::Time deadline) {
  // Tells watchers NOT_SERVING and ends their streams, so that they do not
  // hold the drain open until the deadline. Both shutdowns are safe to call
  // again: a second server Shutdown() returns once the first one's calls end.
  health_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
}

}  // namespace trident
