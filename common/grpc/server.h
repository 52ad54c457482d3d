#ifndef TRIDENT_COMMON_GRPC_SERVER_H_
#define TRIDENT_COMMON_GRPC_SERVER_H_

// A gRPC server with what every Trident service needs: `grpc.health.v1`
// (common/grpc/health_service.h; overall "" and one entry per registered
// service), server reflection
// (`grpc.reflection.v1alpha`), a port chosen by the system when asked for
// port 0, explicit limits (message and metadata size, streams per
// connection, handshake, idle and keepalive policy), TLS when given
// credentials, and a graceful drain. A request that fails to parse is
// answered INVALID_ARGUMENT naming its method (gRPC itself answers
// UNIMPLEMENTED with no message); services that parse their own raw
// requests (common/grpc/wire_check.h) name the field at fault.

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc/health_service.h"
#include "grpcpp/grpcpp.h"

namespace trident {

struct GrpcServerOptions {
  // Address to bind, e.g. "0.0.0.0", "127.0.0.1" or "[::]".
  std::string host = "0.0.0.0";
  // Port to bind; 0 lets the system pick a free one (see GrpcServer::port()).
  int port = 0;
  // Largest message accepted or sent.
  int max_message_bytes = 64 << 20;
  // Largest request metadata (headers) accepted; larger calls are refused.
  int max_metadata_bytes = 16 << 10;
  // Streams (calls) at once on one client connection; further calls wait in
  // the client until one ends. One router-to-worker channel carries all of
  // a worker's requests, so this must exceed any worker's batch.
  int max_concurrent_streams = 4096;
  // A connection whose TLS and HTTP/2 handshake takes longer is closed.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // A connection with no call for this long is closed (clients reconnect
  // when they next call).
  absl::Duration max_connection_idle = absl::Minutes(15);
  // The server pings a client connection after this long without data and
  // closes it if the ping goes unanswered for `keepalive_timeout`: a client
  // that vanished (a host power loss, a partition) does not hold its calls
  // forever.
  absl::Duration keepalive_time = absl::Minutes(1);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // Transport security; null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> credentials;
};

// A service to register and the full name health and reflection report for
// it, e.g. {&generation_service, "trident.v1.Generation"}.
struct RegisteredService {
  grpc::Service* service;
  std::string name;
};

// Thread-safe. Drain() may be called from any thread, more than once.
class GrpcServer {
 public:
  // Starts serving `services`, which must outlive the server. Every service
  // reports SERVING once this returns. Returns kUnavailable if the address
  // cannot be bound, kInvalidArgument for a malformed host or port.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                           std::vector<RegisteredService> services);

  ~GrpcServer();

  // The bound port (the system's choice when the options asked for 0).
  int port() const { return port_; }

  // Marks every registered service (and "") SERVING or NOT_SERVING.
  void SetServing(bool serving);

  // Drains: reports NOT_SERVING (so load balancers and health watchers move
  // away) and ends health Watch streams, lets calls in flight finish until
  // `deadline`, then shuts the server down, cancelling any call still
  // running, and returns once every call has ended. Once no call is left,
  // connections close within kDrainFlush (or by `deadline`, if sooner),
  // without waiting longer for idle clients.
  void Drain(absl::Time deadline);

  // How long connections may take to close once a drain has no call left:
  // time for the calls' last frames to reach their clients.
  static constexpr absl::Duration kDrainFlush = absl::Milliseconds(250);

  grpc::Server* server() { return server_.get(); }

 private:
  // Counts calls in flight (one interceptor lives as long as its call).
  struct CallCount {
    absl::Mutex mu;
    int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  };
  class CallCounterFactory;
  class ParseFailureFactory;

  GrpcServer(std::unique_ptr<HealthService> health, std::shared_ptr<CallCount> calls,
             std::unique_ptr<grpc::Server> server, int port, std::vector<std::string> names)
      : health_(std::move(health)),
        calls_(std::move(calls)),
        server_(std::move(server)),
        port_(port),
        service_names_(std::move(names)) {}

  // Declared first so that it outlives the server that calls it.
  std::unique_ptr<HealthService> health_;
  std::shared_ptr<CallCount> calls_;
  std::unique_ptr<grpc::Server> server_;
  const int port_;
  const std::vector<std::string> service_names_;
};

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_SERVER_H_
