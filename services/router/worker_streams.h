// The router's calls to its workers, one request's worth: channels with
// keepalive, the Prefill and Decode streams as callback reactors reporting
// to a StreamEvents listener, the requests they send, and the workers'
// statuses as the client gets them.

#ifndef TRIDENT_SERVICES_ROUTER_WORKER_STREAMS_H_
#define TRIDENT_SERVICES_ROUTER_WORKER_STREAMS_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/engine/request.h"
#include "grpcpp/grpcpp.h"
#include "services/router/routing_options.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::router {

// Stubs for one worker address, on one channel.
struct WorkerStubs {
  std::unique_ptr<trident::v1::Prefill::Stub> prefill;
  std::unique_ptr<trident::v1::Decode::Stub> decode;
};

// A channel to a worker with the options' keepalive (pings even without
// calls, and without data in between), so that a stopped worker's calls
// fail UNAVAILABLE within keepalive_interval + keepalive_timeout.
std::unique_ptr<WorkerStubs> NewWorkerStubs(const std::string& address,
                                            const RemoteTokenSourceOptions& options);

// A worker's status as the client gets it: code and details (RetryInfo,
// BadRequest) kept, the message prefixed with the call and the worker.
absl::Status WorkerStatus(absl::string_view call, absl::string_view address,
                          const grpc::Status& status);

// The id a worker knows attempt `attempt` (1, 2, ...) of `request_id` by:
// the id itself, then "<id>~m<attempt - 1>", so that a migration's new
// attempt never clashes with a previous one a worker still winds down.
std::string AttemptRequestId(const std::string& request_id, int attempt);

// The calls of attempt `attempt` at `request`: its prompt followed by
// `resumed` (tokens streamed before a migration, sent as resumed_outputs),
// its sampling and stop conditions, into `destination`.
struct AttemptRequests {
  trident::v1::PrefillRequest prefill;
  trident::v1::DecodeRequest decode;
};
AttemptRequests BuildAttemptRequests(const engine::EngineRequest& request, int attempt,
                                     const std::vector<int32_t>& resumed,
                                     const trident::v1::KvDestination& destination,
                                     absl::Duration elapsed);

// Fire-and-forget Decode.ReleaseKv for a reservation nobody will use.
void ReleaseReservation(trident::v1::Decode::Stub* stub,
                        const trident::v1::KvDestination& destination, const std::string& why);

// What the streams of one attempt tell their owner, from gRPC's threads.
class StreamEvents {
 public:
  enum class Call { kPrefill, kDecode };
  virtual void OnPrefillMessage(const trident::v1::PrefillResponse& message) = 0;
  virtual void OnDecodeMessage(trident::v1::DecodeResponse message) = 0;
  // The call ended (its last callback).
  virtual void OnCallDone(Call call, const grpc::Status& status) = 0;

 protected:
  ~StreamEvents() = default;
};

// A server stream read to its end, each message handed to the listener.
template <typename Request, typename Response, StreamEvents::Call kCall>
class WorkerStream final : public grpc::ClientReadReactor<Response> {
 public:
  WorkerStream(StreamEvents* events, Request request, absl::Duration timeout)
      : events_(events), request_(std::move(request)) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          absl::ToChronoMilliseconds(timeout));
  }
  template <typename Stub>
  void Start(Stub* stub) {
    if constexpr (kCall == StreamEvents::Call::kPrefill) {
      stub->async()->Prefill(&context_, &request_, this);
    } else {
      stub->async()->Decode(&context_, &request_, this);
    }
    this->StartRead(&response_);
    this->StartCall();
  }
  void Cancel() { context_.TryCancel(); }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if constexpr (kCall == StreamEvents::Call::kPrefill) {
      events_->OnPrefillMessage(response_);
    } else {
      events_->OnDecodeMessage(std::move(response_));
    }
    response_ = Response();
    this->StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override { events_->OnCallDone(kCall, status); }

 private:
  StreamEvents* const events_;
  grpc::ClientContext context_;
  const Request request_;
  Response response_;
};

using PrefillStream = WorkerStream<trident::v1::PrefillRequest, trident::v1::PrefillResponse,
                                   StreamEvents::Call::kPrefill>;
using DecodeStream = WorkerStream<trident::v1::DecodeRequest, trident::v1::DecodeResponse,
                                  StreamEvents::Call::kDecode>;

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_WORKER_STREAMS_H_
