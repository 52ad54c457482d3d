#include "services/worker/prefill_service.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fault/fault_points.h"
#include "common/frontend/request_proto.h"
#include "common/grpc/status.h"
#include "common/grpc/stream_channel.h"
#include "common/grpc/tls.h"
#include "common/logging/log.h"
#include "common/sampling/sampling_params.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"
#include "common/time/proto_time.h"
#include "grpcpp/grpcpp.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

}  // namespace

struct PrefillService::Call {
  std::shared_ptr<StreamChannel<v1::PrefillResponse>> channel;
  std::string request_id;
  int32_t prompt_tokens = 0;
  bool has_destination = false;
  v1::KvDestination destination;
  // The reservation's lease in the service's LeaseKeeper; 0: none.
  uint64_t lease_key = 0;
  absl::Time submitted;
  absl::Time first_token_time;
  std::atomic<bool> cancelled{false};
  std::atomic<bool> in_engine{true};
  // The first token as streamed (with logprobs when asked).
  v1::TokenChunk first_token;
  // Admitted by the worker's role; ends with the call.
  WorkerRole::Work work;

  // The KV transfer; on the destination's queue only, except the counters
  // below.
  std::unique_ptr<transport::KvTransfer> transfer;
  absl::Status open_error;  // Why the transfer could not start.
  int32_t layers_posted = 0;
  absl::Time transfer_start;
  // Layers posted and not yet completed, and the first failure.
  absl::Mutex sends_mu;
  int pending_sends ABSL_GUARDED_BY(sends_mu) = 0;
  absl::Status send_error ABSL_GUARDED_BY(sends_mu);
};

PrefillService::PrefillService(engine::Engine* engine, const v1::ModelInfoResponse& model_info,
                               transport::KvSender* sender, const Clock* clock,
                               PrefillServiceOptions options)
    : engine_(engine),
      source_(options.token_source != nullptr ? options.token_source : engine),
      model_info_(model_info),
      sender_(sender),
      clock_(clock),
      options_(std::move(options)),
      own_role_(options_.worker_role == nullptr ? std::make_unique<WorkerRole>(options_.role, clock)
                                                : nullptr),
      role_(options_.worker_role != nullptr ? options_.worker_role : own_role_.get()),
      leases_(clock, [this](const v1::KvDestination& destination, absl::Duration lease) {
        return Renew(destination, lease);
      }) {
  if (options_.lease_renew_period > absl::ZeroDuration()) {
    renew_thread_ = std::thread([this] {
      while (true) {
        {
          absl::MutexLock lock(&mu_);
          auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
          if (mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.lease_renew_period)) {
            return;
          }
        }
        leases_.RenewDue();
      }
    });
  }
}

PrefillService::~PrefillService() {
  std::vector<DestinationQueue*> queues;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [address, queue] : queues_) queues.push_back(queue.get());
  }
  // Each queue finishes its jobs first; no queue is added once stopping.
  for (DestinationQueue* queue : queues) queue->thread.join();
  if (renew_thread_.joinable()) renew_thread_.join();
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return commits_in_flight_ == 0; };
  mu_.Await(absl::Condition(&settled));
}

void PrefillService::Enqueue(const Call& call, std::function<void()> job) {
  const std::string key = call.has_destination ? call.destination.decode_address() : "";
  absl::MutexLock lock(&mu_);
  std::unique_ptr<DestinationQueue>& queue = queues_[key];
  if (queue == nullptr) {
    queue = std::make_unique<DestinationQueue>();
    DestinationQueue* q = queue.get();
    q->thread = std::thread([this, q] { RunQueue(q); });
  }
  queue->jobs.push_back(std::move(job));
}

void PrefillService::RunQueue(DestinationQueue* queue) {
  while (true) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, queue]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue->jobs.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue->jobs.empty()) return;  // Stopping, and nothing left.
      job = std::move(queue->jobs.front());
      queue->jobs.pop_front();
    }
    job();
  }
}

std::shared_ptr<v1::Decode::Stub> PrefillService::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::Decode::NewStub(CreateClusterChannel(address));
  }
  return stub;
}

absl::StatusOr<absl::Duration> PrefillService::Renew(const v1::KvDestination& destination,
                                                     absl::Duration lease) {
  auto stub = StubFor(destination.decode_address());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.commit_timeout));
  v1::RenewKvRequest request;
  request.set_decode_incarnation(destination.decode_incarnation());
  request.set_reservation_id(destination.reservation_id());
  SetProtoDuration(lease, request.mutable_lease());
  v1::RenewKvResponse response;
  const grpc::Status status = stub->RenewKv(&context, request, &response);
  if (!status.ok()) {
    return FromGrpcStatus(status, absl::StrCat("RenewKv to ", destination.decode_address()));
  }
  return DurationFromProto(response.lease_remaining());
}

v1::CommitKvRequest PrefillService::CommitRequest(const Call& call,
                                                  v1::CommitOutcome outcome) const {
  v1::CommitKvRequest commit;
  commit.set_decode_incarnation(call.destination.decode_incarnation());
  commit.set_reservation_id(call.destination.reservation_id());
  commit.set_request_id(call.request_id);
  commit.set_outcome(outcome);
  return commit;
}

void PrefillService::Commit(const std::shared_ptr<Call>& call, v1::CommitKvRequest request,
                            std::function<void(absl::Status)> done) {
  leases_.Remove(call->lease_key);
  struct Pending {
    std::shared_ptr<v1::Decode::Stub> stub;
    grpc::ClientContext context;
    v1::CommitKvRequest request;
    v1::CommitKvResponse response;
  };
  auto pending = std::make_shared<Pending>();
  pending->stub = StubFor(call->destination.decode_address());
  pending->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.commit_timeout));
  pending->request = std::move(request);
  {
    absl::MutexLock lock(&mu_);
    ++commits_in_flight_;
  }
  pending->stub->async()->CommitKv(
      &pending->context, &pending->request, &pending->response,
      [this, pending, call, done = std::move(done)](grpc::Status status) mutable {
        absl::Status result;
        if (!status.ok()) {
          result = FromGrpcStatus(
              status, absl::StrCat("CommitKv to ", call->destination.decode_worker_id(), " at ",
                                   call->destination.decode_address()));
        }
        done(result);
        // The call's context goes here, inside the callback, not with the
        // callback object: gRPC destroys that as it tears the call down, and
        // a context destroyed then unrefs the call a second time.
        pending.reset();
        absl::MutexLock lock(&mu_);
        --commits_in_flight_;
      });
}

bool PrefillService::StallsTransferTo(const Call& call, int32_t layer) const {
  return layer == options_.testonly_stall_after_layers &&
         (options_.testonly_stall_to_decode_worker.empty() ||
          options_.testonly_stall_to_decode_worker == call.destination.decode_worker_id());
}

void PrefillService::SendLayer(const std::shared_ptr<Call>& call, int32_t layer,
                               const std::vector<int32_t>& blocks) {
  if (!call->open_error.ok() || call->cancelled.load()) return;
  if (layer != call->layers_posted) return;  // Out of order: Transfer posts the rest.
  // The prompt's blocks past those the destination holds already (a
  // CPU-placed prompt's writer takes them all and skips the tokens its
  // service reads in place).
  const size_t held = call->destination.cpu_resident()
                          ? 0
                          : static_cast<size_t>(call->destination.num_cached_blocks());
  const absl::Span<const int32_t> tail =
      absl::MakeConstSpan(blocks).subspan(std::min(blocks.size(), held));
  if (tail.empty()) {
    // A full hit at the decode worker: nothing of this layer (nor of any
    // other) to write, and no transfer is opened for it.
    ++call->layers_posted;
    return;
  }
  if (call->transfer == nullptr) {
    if (clock_->Now() >= leases_.LeaseEnd(call->lease_key)) {
      call->open_error = absl::DeadlineExceededError(absl::StrCat(
          "the KV reservation's lease ended before request ", call->request_id, "'s transfer"));
      return;
    }
    call->transfer_start = clock_->Now();
    absl::StatusOr<std::unique_ptr<transport::KvTransfer>> opened =
        sender_->Open(call->destination);
    if (!opened.ok()) {
      call->open_error = opened.status();
      return;
    }
    call->transfer = *std::move(opened);
  }
  if (StallsTransferTo(*call, layer)) {
    TRIDENT_LOG(WARNING) << "request " << call->request_id << ": KV transfer stalled after "
                         << layer << " layers (--testonly_stall_kv_transfer_after_layers)";
    // Test-only: poll for the cancellation that is never signalled otherwise.
    while (!call->cancelled.load()) absl::SleepFor(absl::Milliseconds(10));
    return;
  }
  {
    absl::MutexLock lock(&call->sends_mu);
    ++call->pending_sends;
  }
  ++call->layers_posted;
  call->transfer->SendLayer(layer, tail, [call](absl::Status s) {
    absl::MutexLock lock(&call->sends_mu);
    if (!s.ok() && call->send_error.ok()) call->send_error = std::move(s);
    --call->pending_sends;
  });
}

absl::Status PrefillService::DrainSends(Call& call) {
  absl::MutexLock lock(&call.sends_mu);
  auto drained = [&call]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(call.sends_mu) {
    return call.pending_sends == 0;
  };
  // Bounded: sends to a peer that died can stay pending inside the
  // transport (seen over shared memory), and this destination's queue
  // serves its other calls.
  if (!call.sends_mu.AwaitWithTimeout(absl::Condition(&drained), options_.drain_timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        call.pending_sends, " KV sends to decode worker ", call.destination.decode_worker_id(),
        " still pending after ", absl::FormatDuration(options_.drain_timeout)));
  }
  return call.send_error;
}

void PrefillService::FailTransfer(const std::shared_ptr<Call>& call, const absl::Status& why) {
  v1::CommitKvRequest aborted = CommitRequest(*call, v1::COMMIT_OUTCOME_ABORTED);
  aborted.set_error_message(std::string(why.message()));
  const std::string id = call->request_id;
  Commit(call, std::move(aborted), [id](absl::Status s) {
    if (!s.ok()) TRIDENT_LOG(WARNING) << "request " << id << ": " << s;
  });
  engine_->ReleasePrefilled(call->request_id);
  call->channel->Close(absl::AbortedError(
      absl::StrCat("the KV transfer of request ", call->request_id, " failed: ", why.message())));
}

void PrefillService::Transfer(std::shared_ptr<Call> call, std::vector<int32_t> blocks) {
  // A failure ends the call once the layers already posted are done (unless
  // that wait itself failed): then the reservation is abandoned and the
  // prompt's blocks freed here.
  auto fail = [&](const absl::Status& why, bool drained) {
    if (!drained) DrainSends(*call).IgnoreError();
    FailTransfer(call, why);
  };
  const absl::Status cancelled = absl::CancelledError("the router cancelled the call");
  if (call->cancelled.load()) return fail(cancelled, false);
  // Layers the backend did not report as they completed go now.
  for (int32_t layer = call->layers_posted; layer < sender_->num_layers(); ++layer) {
    SendLayer(call, layer, blocks);
    if (!call->open_error.ok() || call->cancelled.load()) break;
  }
  if (!call->open_error.ok()) return fail(call->open_error, false);
  if (call->cancelled.load()) return fail(cancelled, false);
  // Every posted write must finish before the blocks can be freed or the
  // reservation handed over.
  const absl::Status sent = DrainSends(*call);
  if (!sent.ok()) return fail(sent, true);
  // No transfer after a full hit at the decode worker: nothing was sent.
  const transport::KvTransfer* transfer = call->transfer.get();
  const absl::Time start = transfer != nullptr ? call->transfer_start : clock_->Now();
  const int64_t sent_bytes = transfer != nullptr ? transfer->bytes_sent() : 0;
  v1::PrefillResponse progress;
  progress.mutable_progress()->set_layers_sent(sender_->num_layers());
  progress.mutable_progress()->set_sent_bytes(sent_bytes);
  call->channel->Push(std::move(progress));

  v1::CommitKvRequest commit = CommitRequest(*call, v1::COMMIT_OUTCOME_COMPLETE);
  SetProtoDuration(call->first_token_time - call->submitted, commit.mutable_prefill_time());
  commit.set_num_tokens(call->prompt_tokens);
  commit.set_message_bytes(transfer != nullptr ? transfer->message_bytes() : 0);
  *commit.mutable_first_token() = call->first_token;
  SetProtoDuration(clock_->Now() - start, commit.mutable_transfer_time());
  const google::protobuf::Duration prefill_time = commit.prefill_time();
  engine::Engine* engine = engine_;
  const Clock* clock = clock_;
  Commit(call, std::move(commit),
         [call, engine, clock, start, transfer, prefill_time](absl::Status committed) {
           // After CommitKv (accepted or not) this side never touches the
           // blocks again.
           engine->ReleasePrefilled(call->request_id);
           if (!committed.ok()) {
             call->channel->Close(absl::AbortedError(committed.message()));
             return;
           }
           v1::PrefillResponse done;
           v1::KvTransferDone* d = done.mutable_transfer_done();
           d->set_outcome(v1::COMMIT_OUTCOME_COMPLETE);
           if (transfer != nullptr) {
             d->set_sent_bytes(transfer->bytes_sent());
             d->set_messages(transfer->messages());
             d->set_lane(transfer->lane());
           }
           SetProtoDuration(clock->Now() - start, d->mutable_transfer_time());
           *d->mutable_prefill_time() = prefill_time;
           call->channel->Push(std::move(done));
           call->channel->Close(absl::OkStatus());
         });
}

grpc::ServerWriteReactor<v1::PrefillResponse>* PrefillService::Prefill(
    grpc::CallbackServerContext* context, const v1::PrefillRequest* request) {
  auto call = std::make_shared<Call>();
  call->request_id = request->request_id();
  engine::TokenSource* engine = source_;
  auto* reactor = new ChannelReactor<v1::PrefillResponse>(
      /*on_cancel=*/
      [call, engine] {
        call->cancelled.store(true);
        if (call->in_engine.load()) engine->Abort(call->request_id);
      },
      /*on_done=*/nullptr);
  call->channel = reactor->channel();

  absl::StatusOr<engine::EngineRequest> prepared = PrepareRequest(call, *request);
  if (!prepared.ok()) {
    call->in_engine.store(false);
    call->channel->Close(prepared.status());
    return reactor;
  }
  call->prompt_tokens = static_cast<int32_t>(prepared->prompt.size());
  call->has_destination = request->has_destination();
  if (call->has_destination) {
    call->destination = request->destination();
    WatchDestination(call, &*prepared);
  }
  call->submitted = clock_->Now();
  const bool logprobs = prepared->sampling.logprobs || prepared->sampling.top_logprobs > 0;

  v1::PrefillResponse started;
  started.mutable_started();
  call->channel->Push(std::move(started));
  absl::Status submitted = fault::FaultPoint("prefill.compute");
  if (submitted.ok()) {
    submitted =
        source_->Submit(*std::move(prepared), [this, call, logprobs](const engine::TokenEvent& ev) {
          OnPrefillEvent(call, logprobs, ev);
        });
  }
  if (!submitted.ok()) {
    call->in_engine.store(false);
    leases_.Remove(call->lease_key);
    call->channel->Close(submitted);
  }
  return reactor;
}

absl::StatusOr<engine::EngineRequest> PrefillService::PrepareRequest(
    const std::shared_ptr<Call>& call, const v1::PrefillRequest& request) {
  // A role change that gives up waiting for this call ends it as a
  // cancellation does, telling the router why.
  std::weak_ptr<Call> weak = call;
  engine::TokenSource* engine = source_;
  TRIDENT_ASSIGN_OR_RETURN(call->work, role_->Admit(Capability::kPrefill, request.request_id(),
                                                    [weak, engine](const absl::Status& why) {
                                                      std::shared_ptr<Call> c = weak.lock();
                                                      if (c == nullptr) return;
                                                      c->channel->Close(why);
                                                      c->cancelled.store(true);
                                                      if (c->in_engine.load()) {
                                                        engine->Abort(c->request_id);
                                                      }
                                                    }));
  TRIDENT_ASSIGN_OR_RETURN(
      engine::EngineRequest er,
      frontend::EngineRequestFromProto(request.request_id(), request.prompt_token_ids(),
                                       request.sampling(), request.stop(), request.options(),
                                       model_info_, request.resumed_outputs()));
  er.prefill_only = true;
  er.cache_salt = request.cache_salt();
  if (!request.has_destination()) return er;
  const v1::KvDestination& d = request.destination();
  if (sender_ == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no KV transport: it cannot write KV to a decode worker");
  }
  if (d.reservation_id() == 0 || d.decode_address().empty()) {
    return InvalidArgumentForField("destination", "needs a reservation_id and a decode_address");
  }
  if (d.num_tokens() != static_cast<int32_t>(er.prompt.size())) {
    return InvalidArgumentForField(
        "destination.num_tokens",
        absl::StrCat("is ", d.num_tokens(), " but the prompt has ", er.prompt.size(), " tokens"));
  }
  // Blocks of this worker's size, or of the attention service's layout for
  // a CPU-placed prompt (written there in rows, whatever its blocks).
  const int32_t block_size = d.cpu_resident() ? std::max(1, d.layout().block_size_tokens())
                                              : engine_->backend().kv_capacity().block_size;
  // Leading blocks the decode worker's prefix cache holds are not written.
  if (d.num_cached_blocks() < 0 ||
      d.num_cached_blocks() > static_cast<int64_t>(er.prompt.size()) / block_size) {
    return InvalidArgumentForField(
        "destination.num_cached_blocks",
        absl::StrCat("is ", d.num_cached_blocks(), " for a prompt of ", er.prompt.size(),
                     " tokens in blocks of ", block_size));
  }
  const int64_t want = (static_cast<int64_t>(er.prompt.size()) + block_size - 1) / block_size -
                       d.num_cached_blocks();
  if (d.block_ids_size() != want) {
    return InvalidArgumentForField(
        "destination.block_ids",
        absl::StrCat("has ", d.block_ids_size(), " blocks; the prompt needs ", want));
  }
  return er;
}

void PrefillService::WatchDestination(const std::shared_ptr<Call>& call,
                                      engine::EngineRequest* request) {
  // Kept alive while the prompt waits, computes and transfers; if it is
  // gone, the call stops now rather than after its compute.
  std::weak_ptr<Call> weak = call;
  engine::TokenSource* engine = source_;
  call->lease_key = leases_.Add(call->destination, [weak, engine](const absl::Status& why) {
    std::shared_ptr<Call> c = weak.lock();
    if (c == nullptr) return;
    TRIDENT_LOG(WARNING) << "request " << c->request_id << ": " << why;
    c->channel->Close(why);
    c->cancelled.store(true);
    if (c->in_engine.load()) engine->Abort(c->request_id);
  });
  // Each layer goes as soon as the backend reports it computed, while the
  // later layers compute (layer-wise overlap); Transfer sends the rest.
  request->on_layer_done = [this, call](int32_t layer, const std::vector<int32_t>& blocks) {
    Enqueue(*call, [this, call, layer, blocks] { SendLayer(call, layer, blocks); });
  };
  // Connect to the decode worker (the first time) while the prompt
  // computes, rather than when its first layer is ready. A failure shows
  // again in Open.
  Enqueue(*call, [this, call] {
    if (call->cancelled.load()) return;
    if (absl::Status s = sender_->Connect(call->destination); !s.ok()) {
      TRIDENT_LOG(WARNING) << "request " << call->request_id << ": " << s;
    }
  });
}

void PrefillService::OnPrefillEvent(const std::shared_ptr<Call>& call, bool logprobs,
                                    const engine::TokenEvent& ev) {
  // The first event is the last: the prompt is computed (kPrefilled), the
  // first token ended the request, or it failed.
  call->in_engine.store(false);
  const bool has_token = ev.finish != engine::FinishReason::kAborted &&
                         ev.finish != engine::FinishReason::kError && ev.token >= 0;
  if (has_token) {
    call->first_token_time = clock_->Now();
    v1::TokenChunk& chunk = call->first_token;
    chunk.set_request_id(call->request_id);
    chunk.add_token_ids(ev.token);
    if (logprobs) frontend::AppendLogprobs(ev, &chunk);
    v1::PrefillResponse first;
    *first.mutable_first_token() = chunk;
    first.set_cached_tokens(ev.cached_tokens);
    first.set_dram_cached_tokens(ev.dram_cached_tokens);
    call->channel->Push(std::move(first));
  }
  if (ev.finish == engine::FinishReason::kPrefilled && call->has_destination) {
    // Between the first token and the KV transfer (crash: mid-transfer).
    if (absl::Status fault = fault::FaultPoint("prefill.transfer"); !fault.ok()) {
      return FailTransfer(call, fault);
    }
  }
  switch (ev.finish) {
    case engine::FinishReason::kPrefilled: {
      if (!call->has_destination) {
        // Computed and discarded (warm-up, benchmarks).
        engine_->ReleasePrefilled(call->request_id);
        call->channel->Close(absl::OkStatus());
        return;
      }
      std::vector<int32_t> blocks = ev.prefilled_blocks;
      Enqueue(*call, [this, call, blocks = std::move(blocks)]() mutable {
        Transfer(call, std::move(blocks));
      });
      return;
    }
    case engine::FinishReason::kStop:
    case engine::FinishReason::kLength: {
      const v1::FinishReason reason = ev.finish == engine::FinishReason::kStop
                                          ? v1::FINISH_REASON_STOP
                                          : v1::FINISH_REASON_LENGTH;
      Enqueue(*call, [this, call, reason] { FinishAtFirstToken(call, reason); });
      return;
    }
    default: {
      const absl::Status why = call->cancelled.load()
                                   ? absl::CancelledError("the router cancelled the call")
                                   : absl::InternalError("the engine failed the prefill");
      Enqueue(*call, [this, call, why] { AbortAfterEngineFailure(call, why); });
      return;
    }
  }
}

void PrefillService::FinishAtFirstToken(const std::shared_ptr<Call>& call,
                                        v1::FinishReason reason) {
  auto complete = [call, reason] {
    v1::PrefillResponse message;
    v1::GenerateComplete* c = message.mutable_complete();
    c->set_request_id(call->request_id);
    c->set_finish_reason(reason);
    c->mutable_usage()->set_prompt_tokens(call->prompt_tokens);
    c->mutable_usage()->set_completion_tokens(1);
    call->channel->Push(std::move(message));
    call->channel->Close(absl::OkStatus());
  };
  if (!call->has_destination) return complete();
  // Layers already on their way finish before the hand-off.
  DrainSends(*call).IgnoreError();
  v1::CommitKvRequest commit = CommitRequest(*call, v1::COMMIT_OUTCOME_FINISHED);
  *commit.mutable_first_token() = call->first_token;
  commit.set_finish_reason(reason);
  Commit(call, std::move(commit), [call, complete](absl::Status s) {
    if (!s.ok()) {
      call->channel->Close(absl::AbortedError(s.message()));
      return;
    }
    v1::PrefillResponse done;
    done.mutable_transfer_done()->set_outcome(v1::COMMIT_OUTCOME_FINISHED);
    call->channel->Push(std::move(done));
    complete();
  });
}

void PrefillService::AbortAfterEngineFailure(const std::shared_ptr<Call>& call,
                                             const absl::Status& why) {
  if (call->has_destination) {
    DrainSends(*call).IgnoreError();
    v1::CommitKvRequest commit = CommitRequest(*call, v1::COMMIT_OUTCOME_ABORTED);
    commit.set_error_message(std::string(why.message()));
    Commit(call, std::move(commit), [](absl::Status) {});
  }
  call->channel->Close(why);
}

}  // namespace trident::worker
