// Playing the router's part for one request in integration tests: reserve
// KV on a decode worker, prefill into the reservation on a prefill worker,
// decode on it. The caller chooses the workers (the router's admission does
// not), so a test can aim a request at a given decode worker.

#ifndef TRIDENT_TESTS_TESTING_DISAGGREGATED_CALL_H_
#define TRIDENT_TESTS_TESTING_DISAGGREGATED_CALL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tests/testing/service_process.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::testing {

struct DisaggregatedResult {
  // The first token (from the prefill worker), then the decode worker's.
  std::vector<int32_t> tokens;
  grpc::Status reserve_status;
  grpc::Status prefill_status;
  grpc::Status decode_status;
  // The lane the KV went over (KvTransferDone.lane).
  std::string lane;
  // Where the decode worker placed the sequence (KvDestination and
  // SequenceJoined): on a CPU attention service, and which.
  bool placed_on_cpu = false;
  std::string attention_service_id;
  // KvDestination.num_cached_blocks: leading blocks the destination held
  // (its prefix cache, or its service's block store read in place).
  int32_t cached_blocks = 0;
  // From the Prefill call to its first token, and to the decode stream's
  // end.
  absl::Duration time_to_first_token = absl::InfiniteDuration();
  absl::Duration end_to_end = absl::InfiniteDuration();

  bool ok() const { return reserve_status.ok() && prefill_status.ok() && decode_status.ok(); }
};

// The two calls' contexts, for a caller that cancels them from another
// thread. Deadlines default to 60 s.
struct DisaggregatedContexts {
  DisaggregatedContexts() {
    prefill.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    decode.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  }
  void Cancel() {
    prefill.TryCancel();
    decode.TryCancel();
  }
  // ReserveKvRequest.allow_cpu_attention of the call.
  bool allow_cpu_attention = false;
  // Name the prompt's token ids in ReserveKvRequest (its prefix is matched).
  bool reserve_with_prompt = false;
  grpc::ClientContext prefill;
  grpc::ClientContext decode;
};

// Greedy generation of `max_tokens` tokens (EOS ignored) for `prompt`,
// prefilled on `prefill` and decoded on `decode`. Blocks until both calls
// end; `first_token` (optional) is notified when the first token arrives.
inline DisaggregatedResult GenerateDisaggregated(
    const ServiceProcess& prefill, const ServiceProcess& decode, const std::string& id,
    const std::vector<int32_t>& prompt, int32_t max_tokens, DisaggregatedContexts* contexts,
    absl::Notification* first_token = nullptr) {
  namespace v1 = ::trident::v1;
  DisaggregatedResult result;
  auto decode_stub = v1::Decode::NewStub(decode.channel);
  auto prefill_stub = v1::Prefill::NewStub(prefill.channel);
  v1::ReserveKvRequest reserve;
  reserve.set_request_id(id);
  reserve.set_num_tokens(static_cast<int32_t>(prompt.size()));
  reserve.set_max_total_tokens(static_cast<int32_t>(prompt.size()) + max_tokens);
  reserve.set_allow_cpu_attention(contexts->allow_cpu_attention);
  if (contexts->reserve_with_prompt) {
    for (int32_t t : prompt) reserve.add_prompt_token_ids(t);
  }
  v1::ReserveKvResponse reserved;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    result.reserve_status = decode_stub->ReserveKv(&context, reserve, &reserved);
    if (!result.reserve_status.ok()) return result;
  }
  v1::KvDestination destination = reserved.destination();
  result.placed_on_cpu = destination.cpu_resident();
  result.cached_blocks = destination.num_cached_blocks();
  destination.set_decode_address(decode.address);
  v1::DecodeRequest d;
  d.set_request_id(id);
  d.set_reservation_id(destination.reservation_id());
  d.set_decode_incarnation(destination.decode_incarnation());
  v1::PrefillRequest p;
  p.set_request_id(id);
  for (int32_t t : prompt) {
    d.add_prompt_token_ids(t);
    p.add_prompt_token_ids(t);
  }
  d.mutable_sampling()->set_temperature(0);
  d.mutable_sampling()->set_max_tokens(max_tokens);
  d.mutable_stop()->set_ignore_eos(true);
  *p.mutable_sampling() = d.sampling();
  *p.mutable_stop() = d.stop();
  *p.mutable_destination() = destination;

  const absl::Time start = absl::Now();
  auto decode_reader = decode_stub->Decode(&contexts->decode, d);
  auto prefill_reader = prefill_stub->Prefill(&contexts->prefill, p);
  v1::PrefillResponse pr;
  while (prefill_reader->Read(&pr)) {
    if (pr.has_first_token()) {
      result.time_to_first_token = absl::Now() - start;
      if (first_token != nullptr) first_token->Notify();
    }
    for (int32_t t : pr.first_token().token_ids()) result.tokens.push_back(t);
    if (pr.has_transfer_done()) result.lane = pr.transfer_done().lane();
  }
  result.prefill_status = prefill_reader->Finish();
  // A failed prefill leaves the decode call waiting for a hand-off that the
  // decode worker will refuse; do not wait for its deadline.
  if (!result.prefill_status.ok()) contexts->decode.TryCancel();
  v1::DecodeResponse dr;
  while (decode_reader->Read(&dr)) {
    if (dr.has_joined()) result.attention_service_id = dr.joined().attention_service_id();
    for (int32_t t : dr.chunk().token_ids()) result.tokens.push_back(t);
  }
  result.decode_status = decode_reader->Finish();
  result.end_to_end = absl::Now() - start;
  return result;
}

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_DISAGGREGATED_CALL_H_
