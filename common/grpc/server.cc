#include "common/grpc/server.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/support/server_interceptor.h"

namespace trident {
namespace {

int MillisArg(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT32_MAX));
}

}  // namespace

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

// gRPC answers a request it cannot parse with UNIMPLEMENTED and no message,
// the code of an unknown method. This interceptor notices the failed parse
// (the received message is null) and turns that answer into
// INVALID_ARGUMENT naming the method.
class GrpcServer::ParseFailureFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new Rewriter(info->method());
  }

 private:
  class Rewriter final : public grpc::experimental::Interceptor {
   public:
    explicit Rewriter(const char* method) : method_(method == nullptr ? "" : method) {}

    void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
      using grpc::experimental::InterceptionHookPoints;
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
          methods->GetRecvMessage() == nullptr) {
        unparsed_ = true;
      }
      if (unparsed_ &&
          methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
        const grpc::Status sent = methods->GetSendStatus();
        if (sent.error_code() == grpc::StatusCode::UNIMPLEMENTED && sent.error_message().empty()) {
          methods->ModifySendStatus(grpc::Status(
              grpc::StatusCode::INVALID_ARGUMENT,
              absl::StrCat("the request to ", method_,
                           " could not be parsed as its message type: malformed protobuf, or a "
                           "string field that is not valid UTF-8")));
        }
      }
      methods->Proceed();
    }

   private:
    const std::string method_;
    bool unparsed_ = false;
  };
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
  builder.AddListeningPort(
      address,
      options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials(),
      &bound_port);
  // Without this, gRPC binds with SO_REUSEPORT and a second process on the
  // same port silently takes half the traffic instead of failing to start.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Clients ping to notice a stopped peer: controller members and topology
  // watchers every 10 s, the router's channels to workers every 2 s
  // (--keepalive_ms, at least 1 s), with or without calls in flight. gRPC's
  // defaults refuse pings more often than every 5 minutes on a connection
  // without data, and every 2 hours on one without calls, and drop the
  // connection ("too_many_pings") after the third such ping: the fault
  // matrix saw every worker drop the router's channel while a decode worker
  // stalled, and the router then had no worker to move its requests to. The
  // floor is half the shortest client interval, as timers on a loaded host
  // can bring two pings closer than they were sent.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, options.max_metadata_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             MillisArg(options.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             MillisArg(options.max_connection_idle));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, MillisArg(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, MillisArg(options.keepalive_timeout));
  auto calls = std::make_shared<CallCount>();
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<CallCounterFactory>(calls));
  interceptors.push_back(std::make_unique<ParseFailureFactory>());
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
  health_->AwaitWatchersDone(deadline);
  // gRPC's own graceful shutdown also waits for every client to acknowledge
  // its GOAWAY, which an idle client that polls nothing never does: the
  // drain would last until the deadline. So the calls are waited for here,
  // and the server is then shut down at once.
  {
    absl::MutexLock lock(&calls_->mu);
    calls_->mu.AwaitWithDeadline(absl::Condition(
                                     +[](int64_t* n) { return *n == 0; }, &calls_->in_flight),
                                 deadline);
  }
  // The calls' last frames (a stream's final message and status) have been
  // handed to the transport, not necessarily put on the wire. Connections
  // closed at once can be reset with them unsent (a socket closed with
  // unread bytes from the client is reset), and a watcher then sees its
  // stream break instead of NOT_SERVING. So the connections get a short
  // graceful close, within the drain's deadline.
  server_->Shutdown(absl::ToChronoTime(std::min(deadline, absl::Now() + kDrainFlush)));
  server_->Wait();
}

}  // namespace trident
