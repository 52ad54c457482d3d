#include "common/grpc/server.h"

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"

namespace trident {

// Creates one interceptor per call; the interceptor's lifetime is the call's.
class GrpcServer::CallCounterFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounterFactory(std::shared_ptr<CallCount> calls) : calls_(std::move(calls)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new Counter(calls_);
  }

 private:
  class Counter final : public grpc::experimental::Interceptor {
   public:
    explicit Counter(std::shared_ptr<CallCount> calls) : calls_(std::move(calls)) {
      absl::MutexLock lock(&calls_->mu);
      ++calls_->in_flight;
    }
    ~Counter() override {
      absl::MutexLock lock(&calls_->mu);
      --calls_->in_flight;
    }
    void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
      methods->Proceed();
    }

   private:
    std::shared_ptr<CallCount> calls_;
  };

  std::shared_ptr<CallCount> calls_;
};

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
  // Clients ping to notice a stopped peer: controller members and topology
  // watchers every 10 s, the router's channels to workers every 2 s
  // (--keepalive_ms, at least 1 s). gRPC's default refuses pings more often
  // than every 5 minutes on a connection without data and drops it.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1'000);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  auto calls = std::make_shared<CallCount>();
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<CallCounterFactory>(calls));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
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
      new GrpcServer(std::move(health), calls, std::move(server), bound_port, names));
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
  // gRPC's own graceful shutdown also waits for every client to acknowledge
  // its GOAWAY, which an idle client that polls nothing never does: the
  // drain would last until the deadline. So the calls are waited for here,
  // and the server is then shut down at once.
  {
    absl::MutexLock lock(&calls_->mu);
    calls_->mu.AwaitWithDeadline(
        absl::Condition(+[](int64_t* n) { return *n == 0; }, &calls_->in_flight), deadline);
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_->Wait();
}

}  // namespace trident
