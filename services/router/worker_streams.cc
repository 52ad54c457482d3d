#include "services/router/worker_streams.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "common/time/proto_time.h"

namespace trident::router {
namespace {

namespace v1 = ::trident::v1;

// The engine request's sampling and stop conditions as the workers' protos.
// Its stop tokens already include the model's EOS ids unless ignore_eos, so
// the workers are told to ignore EOS themselves.
void FillSampling(const engine::EngineRequest& r, v1::SamplingParams* s, v1::StopConditions* stop,
                  v1::OutputOptions* options) {
  s->set_max_tokens(r.max_tokens);
  s->set_temperature(r.sampling.temperature);
  s->set_top_p(r.sampling.top_p);
  s->set_top_k(r.sampling.top_k);
  s->set_min_p(r.sampling.min_p);
  s->set_seed(r.sampling.seed);
  s->set_repetition_penalty(r.sampling.repetition_penalty);
  s->set_presence_penalty(r.sampling.presence_penalty);
  s->set_frequency_penalty(r.sampling.frequency_penalty);
  for (int32_t t : r.stop_token_ids) stop->add_stop_token_ids(t);
  stop->set_ignore_eos(true);
  options->set_logprobs(r.sampling.logprobs || r.sampling.top_logprobs > 0);
  options->set_logprobs_top_n(r.sampling.top_logprobs);
}

int ToMilliseconds(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
}

}  // namespace

std::unique_ptr<WorkerStubs> NewWorkerStubs(const std::string& address,
                                            const RemoteTokenSourceOptions& options) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ToMilliseconds(options.keepalive_interval));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ToMilliseconds(options.keepalive_timeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A stalled stream sends no data; keep pinging it anyway.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  auto channel = CreateClusterChannel(address, args);
  auto stubs = std::make_unique<WorkerStubs>();
  stubs->prefill = v1::Prefill::NewStub(channel);
  stubs->decode = v1::Decode::NewStub(channel);
  return stubs;
}

absl::Status WorkerStatus(absl::string_view call, absl::string_view address,
                          const grpc::Status& status) {
  return FromGrpcStatus(status, absl::StrCat(call, " on ", address));
}

std::string AttemptRequestId(const std::string& request_id, int attempt) {
  return attempt <= 1 ? request_id : absl::StrCat(request_id, "~m", attempt - 1);
}

AttemptRequests BuildAttemptRequests(const engine::EngineRequest& request, int attempt,
                                     const std::vector<int32_t>& resumed,
                                     const v1::KvDestination& destination,
                                     absl::Duration elapsed) {
  AttemptRequests out;
  v1::DecodeRequest& decode = out.decode;
  v1::PrefillRequest& prefill = out.prefill;
  const std::string id = AttemptRequestId(request.id, attempt);
  decode.set_request_id(id);
  decode.set_reservation_id(destination.reservation_id());
  decode.set_decode_incarnation(destination.decode_incarnation());
  prefill.set_request_id(id);
  for (int32_t t : request.prompt) decode.add_prompt_token_ids(t);
  for (int32_t t : resumed) decode.add_prompt_token_ids(t);
  *prefill.mutable_prompt_token_ids() = decode.prompt_token_ids();
  decode.set_resumed_outputs(static_cast<int32_t>(resumed.size()));
  prefill.set_resumed_outputs(static_cast<int32_t>(resumed.size()));
  FillSampling(request, decode.mutable_sampling(), decode.mutable_stop(), decode.mutable_options());
  *prefill.mutable_sampling() = decode.sampling();
  *prefill.mutable_stop() = decode.stop();
  *prefill.mutable_options() = decode.options();
  prefill.set_qos_class(request.qos_class);
  decode.set_qos_class(request.qos_class);
  prefill.set_cache_salt(request.cache_salt);
  decode.set_cache_salt(request.cache_salt);
  SetProtoDuration(elapsed, prefill.mutable_elapsed());
  *prefill.mutable_destination() = destination;
  return out;
}

void ReleaseReservation(v1::Decode::Stub* stub, const v1::KvDestination& destination,
                        const std::string& why) {
  struct Call {
    grpc::ClientContext context;
    v1::ReleaseKvRequest request;
    v1::ReleaseKvResponse response;
  };
  auto* call = new Call;
  call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  call->request.set_decode_incarnation(destination.decode_incarnation());
  call->request.set_reservation_id(destination.reservation_id());
  call->request.set_reason(why);
  stub->async()->ReleaseKv(&call->context, &call->request, &call->response,
                           [call](grpc::Status) { delete call; });
}

}  // namespace trident::router
