// RemoteTokenSource against in-process fake workers (real gRPC servers on
// port 0 serving Decode and Prefill from a script), with admission on a
// fake clock: token order and placement, worker statuses passed through
// with their details, waiting for KV room (served when room frees, on
// another decode worker, or refused at the wait's limit, or aborted), and
// the process's thread count with hundreds of streams in flight.

#include "services/router/remote_token_source.h"

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/reactors.h"
#include "common/grpc/stream_channel.h"
#include "common/status/error_details.h"
#include "common/telemetry/collected_series.h"
#include "common/testing/status_matchers.h"
#include "common/time/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::router {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr int32_t kFirstToken = 7;

// A decode worker's KV reservations and Decode streams. Decode streams
// either answer at once (tokens 8, 9 and a completion) or, while held,
// wait for ReleaseHeld; a reservation is freed when its stream ends.
class FakeDecode final : public v1::Decode::CallbackService {
 public:
  explicit FakeDecode(int capacity) : capacity_(capacity) {}

  void set_capacity(int capacity) {
    absl::MutexLock lock(&mu_);
    capacity_ = capacity;
  }
  void set_hold(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_ = hold;
  }
  // Each Decode stream sends `tokens` tokens, then ends with `failure`
  // (no completion); with `stall`, it sends them and then nothing until
  // the client cancels it.
  void FailAfter(int tokens, absl::Status failure, bool stall = false) {
    absl::MutexLock lock(&mu_);
    fail_after_ = tokens;
    failure_ = std::move(failure);
    stall_ = stall;
  }
  // Ends the stalled streams with `status`.
  void CloseStalled(const absl::Status& status) {
    std::vector<std::shared_ptr<StreamChannel<v1::DecodeResponse>>> stalled;
    {
      absl::MutexLock lock(&mu_);
      stalled.swap(stalled_);
    }
    for (auto& channel : stalled) channel->Close(status);
  }
  std::vector<v1::DecodeRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // Answers every held stream.
  void ReleaseHeld() {
    std::vector<std::shared_ptr<StreamChannel<v1::DecodeResponse>>> held;
    std::vector<v1::DecodeRequest> requests;
    {
      absl::MutexLock lock(&mu_);
      held.swap(held_);
      requests.swap(held_requests_);
      hold_ = false;
    }
    for (size_t i = 0; i < held.size(); ++i) {
      Answer(*held[i], requests[i].resumed_outputs(), requests[i].sampling().max_tokens());
    }
  }
  // Waits until no reservation is left (a cancelled stream's end reaches
  // the server a little after the client's).
  void AwaitNoneReserved() const {
    absl::MutexLock lock(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reserved_.empty(); };
    mu_.Await(absl::Condition(&none));
  }
  void AwaitHeld(int n) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(held_.size()) >= n;
    };
    mu_.Await(absl::Condition(&enough));
  }

  grpc::ServerUnaryReactor* ReserveKv(grpc::CallbackServerContext* context,
                                      const v1::ReserveKvRequest* request,
                                      v1::ReserveKvResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (static_cast<int>(reserved_.size()) >= capacity_) {
      return FinishUnary(context, absl::ResourceExhaustedError("KV cache full"));
    }
    const uint64_t id = next_id_++;
    reserved_.insert(id);
    response->mutable_destination()->set_reservation_id(id);
    response->mutable_destination()->set_decode_incarnation(1);
    return FinishUnary(context, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* ReleaseKv(grpc::CallbackServerContext* context,
                                      const v1::ReleaseKvRequest* request,
                                      v1::ReleaseKvResponse* response) override {
    absl::MutexLock lock(&mu_);
    reserved_.erase(request->reservation_id());
    return FinishUnary(context, absl::OkStatus());
  }

  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(grpc::CallbackServerContext* context,
                                                       const v1::DecodeRequest* request) override {
    const uint64_t id = request->reservation_id();
    auto* reactor = new ChannelReactor<v1::DecodeResponse>(nullptr, [this, id] {
      absl::MutexLock lock(&mu_);
      reserved_.erase(id);
    });
    // Without a reservation (colocated) the stream brings output `resumed`
    // too, which a prefill worker would have.
    const int resumed = request->resumed_outputs() - (request->reservation_id() == 0 ? 1 : 0);
    const int max_tokens = request->sampling().max_tokens();
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
      if (fail_after_ >= 0) {
        // Output i is token kFirstToken + i; output `resumed` came from
        // the prefill.
        auto& channel = *reactor->channel();
        for (int i = resumed + 1; i < std::min(max_tokens, resumed + 1 + fail_after_); ++i) {
          v1::DecodeResponse chunk;
          chunk.mutable_chunk()->add_token_ids(kFirstToken + i);
          channel.Push(chunk);
        }
        if (stall_) {
          stalled_.push_back(reactor->channel());
        } else {
          channel.Close(failure_);
        }
        return reactor;
      }
      if (hold_) {
        held_.push_back(reactor->channel());
        held_requests_.push_back(*request);
        return reactor;
      }
    }
    Answer(*reactor->channel(), resumed, max_tokens);
    return reactor;
  }

 private:
  // Outputs resumed + 1 to max_tokens - 1 (token kFirstToken + index),
  // then the completion.
  static void Answer(StreamChannel<v1::DecodeResponse>& channel, int resumed, int max_tokens) {
    v1::DecodeResponse chunk;
    for (int i = resumed + 1; i < max_tokens; ++i)
      chunk.mutable_chunk()->add_token_ids(kFirstToken + i);
    channel.Push(chunk);
    v1::DecodeResponse complete;
    complete.mutable_complete()->set_finish_reason(v1::FINISH_REASON_LENGTH);
    channel.Push(complete);
    channel.Close(absl::OkStatus());
  }

  mutable absl::Mutex mu_;
  int capacity_ ABSL_GUARDED_BY(mu_);
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_set<uint64_t> reserved_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<StreamChannel<v1::DecodeResponse>>> held_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::DecodeRequest> held_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::DecodeRequest> requests_ ABSL_GUARDED_BY(mu_);
  int fail_after_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool stall_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<StreamChannel<v1::DecodeResponse>>> stalled_ ABSL_GUARDED_BY(mu_);
};

// A prefill worker: started, the first token, transfer_done, OK; or the
// scripted failure at once.
class FakePrefill final : public v1::Prefill::CallbackService {
 public:
  // Fails the next `times` calls (every call by default) with `failure`.
  void set_failure(absl::Status failure, int times = -1) {
    absl::MutexLock lock(&mu_);
    failure_ = std::move(failure);
    failures_left_ = times;
  }

  // Prefill calls so far.
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  grpc::ServerWriteReactor<v1::PrefillResponse>* Prefill(
      grpc::CallbackServerContext* context, const v1::PrefillRequest* request) override {
    auto* reactor = new ChannelReactor<v1::PrefillResponse>(nullptr, nullptr);
    auto channel = reactor->channel();
    absl::Status failure;
    {
      absl::MutexLock lock(&mu_);
      ++calls_;
      if (failures_left_ != 0) {
        failure = failure_;
        if (failures_left_ > 0) --failures_left_;
      }
    }
    if (!failure.ok()) {
      channel->Close(failure);
      return reactor;
    }
    v1::PrefillResponse started;
    SetProtoDuration(absl::Milliseconds(3), started.mutable_started()->mutable_queued());
    channel->Push(started);
    v1::PrefillResponse first;
    first.mutable_first_token()->add_token_ids(kFirstToken + request->resumed_outputs());
    channel->Push(first);
    v1::PrefillResponse done;
    done.mutable_transfer_done()->set_outcome(v1::COMMIT_OUTCOME_COMPLETE);
    SetProtoDuration(absl::Milliseconds(5), done.mutable_transfer_done()->mutable_prefill_time());
    SetProtoDuration(absl::Milliseconds(2), done.mutable_transfer_done()->mutable_transfer_time());
    channel->Push(done);
    channel->Close(absl::OkStatus());
    return reactor;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int failures_left_ ABSL_GUARDED_BY(mu_) = -1;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// One worker in role both: both services on one in-process server.
struct FakeWorker {
  explicit FakeWorker(int capacity) : decode(capacity) {
    grpc::ServerBuilder builder;
    // The router's keepalive pings.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&decode);
    builder.RegisterService(&prefill);
    server = builder.BuildAndStart();
  }
  ~FakeWorker() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }

  FakeDecode decode;
  FakePrefill prefill;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

// A request's events, awaited without sleeping.
class Events {
 public:
  engine::TokenCallback Callback() {
    return [this](const engine::TokenEvent& ev) {
      absl::MutexLock lock(&mu_);
      events_.push_back(ev);
    };
  }
  // Waits for the final event and returns every event.
  std::vector<engine::TokenEvent> AwaitEnd() {
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !events_.empty() && events_.back().finish != engine::FinishReason::kNone;
    };
    mu_.Await(absl::Condition(&ended));
    return events_;
  }
  // Waits until `n` tokens arrived.
  void AwaitTokens(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      int tokens = 0;
      for (const engine::TokenEvent& ev : events_) tokens += ev.token >= 0 ? 1 : 0;
      return tokens >= n;
    };
    mu_.Await(absl::Condition(&enough));
  }
  bool ended() {
    absl::MutexLock lock(&mu_);
    return !events_.empty() && events_.back().finish != engine::FinishReason::kNone;
  }

 private:
  absl::Mutex mu_;
  std::vector<engine::TokenEvent> events_ ABSL_GUARDED_BY(mu_);
};

std::vector<int32_t> Tokens(const std::vector<engine::TokenEvent>& events) {
  std::vector<int32_t> tokens;
  for (const engine::TokenEvent& ev : events) {
    if (ev.token >= 0) tokens.push_back(ev.token);
  }
  return tokens;
}

int ProcessThreads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (absl::StartsWith(line, "Threads:")) return std::stoi(line.substr(8));
  }
  return -1;
}

class RemoteTokenSourceTest : public ::testing::Test {
 protected:
  RemoteTokenSourceTest() : clock_(absl::FromUnixSeconds(1'700'000'000)) {}

  // Admission (off: the least-loaded pair) and the source, no timer thread.
  void Start(RemoteTokenSourceOptions options = {}) {
    admission::AdmissionOptions admission_options;
    admission_options.enabled = false;
    admission_ = std::make_unique<admission::AdmissionController>(
        admission_options, admission::QosConfig::SingleDefaultClass(), &clock_);
    options.clock = &clock_;
    options.timer_thread = false;
    source_ = std::make_unique<RemoteTokenSource>(admission_.get(), options);
  }

  // Reports `worker`'s load (role both) and tells the source its address.
  void AddWorker(const std::string& id, const FakeWorker& worker, int running = 0,
                 bool colocated_only = false) {
    admission::WorkerLoadReport load;
    load.worker_id = id;
    load.colocated_only = colocated_only;
    load.incarnation = 1;
    load.running_sequences = running;
    load.kv_blocks_free = 1000;
    load.kv_blocks_total = 1000;
    ASSERT_THAT(admission_->UpdateLoad(load), IsOk());
    source_->SetWorkerAddress(id, worker.address());
  }

  static engine::EngineRequest Request(const std::string& id, int32_t max_tokens = 3) {
    engine::EngineRequest r;
    r.id = id;
    r.prompt = {1, 2, 3};
    r.max_tokens = max_tokens;
    return r;
  }

  // `first` (w1) and a less attractive `spare` (w2, 5 sequences running):
  // admission chooses w1 first; a migration goes to w2.
  void AddFirstAndSpare(const FakeWorker& first, const FakeWorker& spare) {
    AddWorker("w1", first);
    AddWorker("w2", spare, /*running=*/5);
  }

  FakeClock clock_;
  std::unique_ptr<admission::AdmissionController> admission_;
  std::unique_ptr<RemoteTokenSource> source_;
};

TEST_F(RemoteTokenSourceTest, RelaysThePrefillsFirstTokenThenTheDecodeStreamWithPlacement) {
  Start();
  FakeWorker worker(/*capacity=*/4);
  AddWorker("w1", worker);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  EXPECT_EQ(Tokens(got), (std::vector<int32_t>{kFirstToken, 8, 9}));
  for (size_t i = 0; i + 1 < got.size(); ++i) EXPECT_EQ(got[i].output_index, i);
  const engine::TokenEvent& end = got.back();
  EXPECT_EQ(end.finish, engine::FinishReason::kLength);
  ASSERT_TRUE(end.placement.has_value());
  EXPECT_EQ(end.placement->prefill_worker_id, "w1");
  EXPECT_EQ(end.placement->decode_worker_id, "w1");
  EXPECT_EQ(end.placement->prefill, absl::Milliseconds(5));
  EXPECT_EQ(end.placement->kv_transfer, absl::Milliseconds(2));
  ASSERT_TRUE(end.placement->queued.has_value());
  EXPECT_GE(*end.placement->queued, absl::Milliseconds(3));
}

// A worker without a KV transport serves the whole request in one Decode
// call without a reservation (its Prefill service is never called), and a
// migration resumes on another such worker the same way.
TEST_F(RemoteTokenSourceTest, AColocatedOnlyWorkerServesTheRequestInOneDecodeCall) {
  Start();
  FakeWorker first(/*capacity=*/4);
  FakeWorker spare(/*capacity=*/4);
  for (FakeWorker* w : {&first, &spare}) w->prefill.set_failure(absl::InternalError("not used"));
  first.decode.FailAfter(2, absl::UnavailableError("worker died"));
  AddWorker("w1", first, /*running=*/0, /*colocated_only=*/true);
  AddWorker("w2", spare, /*running=*/5, /*colocated_only=*/true);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1", /*max_tokens=*/5), events.Callback()), IsOk());

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  EXPECT_EQ(Tokens(got), (std::vector<int32_t>{kFirstToken, 8, 9, 10, 11}));
  for (size_t i = 0; i + 1 < got.size(); ++i) EXPECT_EQ(got[i].output_index, i);
  EXPECT_EQ(got.back().finish, engine::FinishReason::kLength);
  const std::vector<v1::DecodeRequest> tried = first.decode.requests();
  ASSERT_EQ(tried.size(), 1u);
  EXPECT_EQ(tried[0].reservation_id(), 0u);
  EXPECT_EQ(tried[0].resumed_outputs(), 0);
  const std::vector<v1::DecodeRequest> resumed = spare.decode.requests();
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].reservation_id(), 0u);
  EXPECT_EQ(resumed[0].resumed_outputs(), 2);
  EXPECT_THAT(resumed[0].prompt_token_ids(), ::testing::ElementsAre(1, 2, 3, kFirstToken, 8));
  ASSERT_TRUE(got.back().placement.has_value());
  EXPECT_EQ(got.back().placement->prefill_worker_id, "w2");
  EXPECT_EQ(got.back().placement->decode_worker_id, "w2");
}

TEST_F(RemoteTokenSourceTest, AWorkersResourceExhaustedReachesTheClientWithItsRetryInfo) {
  Start();
  FakeWorker worker(/*capacity=*/4);
  worker.prefill.set_failure(ResourceExhaustedWithRetry("prefill queue full", absl::Seconds(3)));
  AddWorker("w1", worker);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());

  const engine::TokenEvent end = events.AwaitEnd().back();
  EXPECT_EQ(end.finish, engine::FinishReason::kError);
  EXPECT_THAT(end.error, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(GetRetryDelay(end.error), absl::Seconds(3));
  EXPECT_TRUE(absl::StrContains(
      end.error.message(), absl::StrCat("Prefill on ", worker.address(), ": prefill queue full")))
      << end.error;
  // The decode call was cancelled: its reservation is free again.
  worker.decode.AwaitNoneReserved();
}

TEST_F(RemoteTokenSourceTest, AWorkersInvalidArgumentReachesTheClientWithItsField) {
  Start();
  FakeWorker worker(/*capacity=*/4);
  worker.prefill.set_failure(InvalidArgumentForField("sampling.top_k", "must not be negative"));
  AddWorker("w1", worker);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());

  const engine::TokenEvent end = events.AwaitEnd().back();
  EXPECT_THAT(end.error, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(GetBadRequestField(end.error), "sampling.top_k");
}

// Output i of every fake worker is kFirstToken + i, so a stream resumed at
// any point continues where it stopped.
std::vector<int32_t> ExpectedTokens(int max_tokens) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < max_tokens; ++i) tokens.push_back(kFirstToken + i);
  return tokens;
}

void ExpectPrefixOf(const std::vector<int32_t>& got, const std::vector<int32_t>& all) {
  ASSERT_LE(got.size(), all.size());
  EXPECT_EQ(got, std::vector<int32_t>(all.begin(), all.begin() + got.size()));
}

// Every token once, in order, and one final event after them.
void ExpectOneContiguousStream(const std::vector<engine::TokenEvent>& got) {
  ASSERT_FALSE(got.empty());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].output_index, static_cast<int32_t>(i)) << i;
    EXPECT_EQ(got[i].finish != engine::FinishReason::kNone, i + 1 == got.size()) << i;
  }
}

// The whole unbroken stream of `max_tokens` tokens, ended by length.
void ExpectCompletedInFull(const std::vector<engine::TokenEvent>& got, int max_tokens) {
  EXPECT_EQ(Tokens(got), ExpectedTokens(max_tokens));
  ExpectOneContiguousStream(got);
  EXPECT_EQ(got.back().finish, engine::FinishReason::kLength);
}

TEST_F(RemoteTokenSourceTest, ADecodeWorkerFailingMidStreamIsReplacedAndTheStreamGoesOn) {
  Start();
  FakeWorker first(/*capacity=*/4);
  FakeWorker second(/*capacity=*/4);
  first.decode.FailAfter(2, absl::OkStatus(), /*stall=*/true);
  AddFirstAndSpare(first, second);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1", 6), events.Callback()), IsOk());
  events.AwaitTokens(3);
  first.decode.CloseStalled(absl::UnavailableError("Socket closed"));

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  ExpectCompletedInFull(got, 6);
  ASSERT_TRUE(got.back().placement.has_value());
  EXPECT_EQ(got.back().placement->decode_worker_id, "w2");
  // w2 resumed after the 3 tokens streamed (the first from the prefill).
  const std::vector<v1::DecodeRequest> resumed = second.decode.requests();
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0].resumed_outputs(), 3);
  EXPECT_THAT(resumed[0].prompt_token_ids(),
              ::testing::ElementsAre(1, 2, 3, kFirstToken, kFirstToken + 1, kFirstToken + 2));
  EXPECT_EQ(resumed[0].sampling().max_tokens(), 6);
  first.decode.AwaitNoneReserved();
  second.decode.AwaitNoneReserved();
  source_->AwaitIdleForTesting();
  EXPECT_EQ(admission_->num_in_flight(), 0);
}

TEST_F(RemoteTokenSourceTest, APrefillWorkerFailingBeforeTheFirstTokenIsReplaced) {
  Start();
  FakeWorker first(/*capacity=*/4);
  FakeWorker second(/*capacity=*/4);
  first.prefill.set_failure(absl::UnavailableError("connection refused"));
  AddFirstAndSpare(first, second);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  ExpectCompletedInFull(got, 3);
  EXPECT_EQ(got.back().placement->prefill_worker_id, "w2");
  // The first try's reservation was given back when its stream was
  // cancelled.
  first.decode.AwaitNoneReserved();
}

// A prefill worker that answers ABORTED (its transfer to a dead peer
// failed) is alive: the retry may go to it again, here the only one.
TEST_F(RemoteTokenSourceTest, AWorkerThatAnsweredAbortedMayTakeTheRetry) {
  Start();
  FakeWorker only(/*capacity=*/4);
  only.prefill.set_failure(absl::AbortedError("CommitKv to d2: connection reset"), /*times=*/1);
  AddWorker("w1", only);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  ExpectCompletedInFull(got, 3);
  // Both attempts' prompts went to the one worker. (Its decode side may see
  // one call or two: the first attempt's decode call races the prefill's
  // failure.)
  EXPECT_EQ(only.prefill.calls(), 2);
  EXPECT_GE(only.decode.requests().size(), 1u);
}

TEST_F(RemoteTokenSourceTest, AStalledDecodeStreamIsEndedByTheWatchdogAndMigrated) {
  RemoteTokenSourceOptions options;
  options.stall_timeout = absl::Seconds(10);
  Start(options);
  FakeWorker first(/*capacity=*/4);
  FakeWorker second(/*capacity=*/4);
  first.decode.FailAfter(1, absl::OkStatus(), /*stall=*/true);
  AddFirstAndSpare(first, second);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1", 5), events.Callback()), IsOk());
  events.AwaitTokens(2);
  source_->RunTimersForTesting();  // not yet stalled
  clock_.Advance(absl::Seconds(9));
  source_->RunTimersForTesting();
  EXPECT_FALSE(events.ended());
  EXPECT_TRUE(second.decode.requests().empty());
  clock_.Advance(absl::Seconds(2));
  // The workers' load reports keep coming (admission drops stale ones).
  AddFirstAndSpare(first, second);
  source_->RunTimersForTesting();

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  EXPECT_EQ(Tokens(got), ExpectedTokens(5));
  ExpectOneContiguousStream(got);
  EXPECT_EQ(got.back().placement->decode_worker_id, "w2");
  first.decode.AwaitNoneReserved();
}

TEST_F(RemoteTokenSourceTest, AStreamQueuedOnABusyWorkerIsNotStalled) {
  RemoteTokenSourceOptions options;
  options.stall_timeout = absl::Seconds(10);
  Start(options);
  FakeWorker first(/*capacity=*/4);
  FakeWorker second(/*capacity=*/4);
  // Every stream on `first` brings one token, then waits (as a request
  // queued behind others on an overloaded worker does).
  first.decode.FailAfter(1, absl::OkStatus(), /*stall=*/true);
  AddFirstAndSpare(first, second);
  Events queued;
  ASSERT_THAT(source_->Submit(Request("r1", 5), queued.Callback()), IsOk());
  queued.AwaitTokens(2);
  // 9 s on, another stream on the same worker brings its tokens: the
  // worker makes progress.
  clock_.Advance(absl::Seconds(9));
  AddFirstAndSpare(first, second);
  Events busy;
  ASSERT_THAT(source_->Submit(Request("r2", 5), busy.Callback()), IsOk());
  busy.AwaitTokens(2);
  // r1 has had no token for 11 s, but its worker had one 2 s ago.
  clock_.Advance(absl::Seconds(2));
  AddFirstAndSpare(first, second);
  source_->RunTimersForTesting();
  EXPECT_FALSE(queued.ended());
  EXPECT_TRUE(second.decode.requests().empty());
  // 10 s with no token from any of the worker's streams: both migrate.
  clock_.Advance(absl::Seconds(9));
  AddFirstAndSpare(first, second);
  source_->RunTimersForTesting();

  for (Events* events : {&queued, &busy}) {
    const std::vector<engine::TokenEvent> got = events->AwaitEnd();
    EXPECT_EQ(Tokens(got), ExpectedTokens(5));
    ExpectOneContiguousStream(got);
    EXPECT_EQ(got.back().placement->decode_worker_id, "w2");
  }
  first.decode.AwaitNoneReserved();
}

TEST_F(RemoteTokenSourceTest, AWorkerFailingAfterTheLastTokenEndsTheRequestAsItWould) {
  Start();
  FakeWorker first(/*capacity=*/4);
  FakeWorker second(/*capacity=*/4);
  first.decode.FailAfter(2, absl::OkStatus(), /*stall=*/true);  // all of them
  AddFirstAndSpare(first, second);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());
  events.AwaitTokens(3);
  first.decode.CloseStalled(absl::UnavailableError("Socket closed"));

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  ExpectCompletedInFull(got, 3);
  EXPECT_TRUE(second.decode.requests().empty());
}

TEST_F(RemoteTokenSourceTest, WithNoWorkerLeftAMigratingRequestEndsUnavailable) {
  Start();
  FakeWorker only(/*capacity=*/4);
  only.decode.FailAfter(1, absl::UnavailableError("Socket closed"));
  AddWorker("w1", only);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1", 6), events.Callback()), IsOk());
  // It waits for a worker to come, until migration_wait (10 s).
  source_->AwaitWaitingKvForTesting(1);
  clock_.Advance(absl::Seconds(9));
  source_->RunTimersForTesting();
  EXPECT_FALSE(events.ended());
  clock_.Advance(absl::Seconds(2));
  source_->RunTimersForTesting();

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  // What reached the client before the failure (the decode stream may
  // fail before the prefill's first token arrives).
  ExpectPrefixOf(Tokens(got), ExpectedTokens(2));
  ExpectOneContiguousStream(got);
  EXPECT_THAT(got.back().error, StatusIs(absl::StatusCode::kUnavailable,
                                         HasSubstr("no worker could take the request over")));
  source_->AwaitIdleForTesting();
  EXPECT_EQ(admission_->num_in_flight(), 0);
}

TEST_F(RemoteTokenSourceTest, AMigrationWaitsForAWorkerToCome) {
  Start();
  FakeWorker first(/*capacity=*/4);
  FakeWorker second(/*capacity=*/4);
  first.decode.FailAfter(1, absl::UnavailableError("Socket closed"));
  AddWorker("w1", first);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1", 6), events.Callback()), IsOk());
  source_->AwaitWaitingKvForTesting(1);
  AddWorker("w2", second);
  clock_.Advance(absl::Seconds(1));
  source_->RunTimersForTesting();

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  EXPECT_EQ(Tokens(got), ExpectedTokens(6));
  ExpectOneContiguousStream(got);
  EXPECT_EQ(got.back().placement->decode_worker_id, "w2");
}

TEST_F(RemoteTokenSourceTest, TheMigrationLimitEndsTheRequestWithTheWorkersStatus) {
  RemoteTokenSourceOptions options;
  options.migration_limit = 1;
  Start(options);
  FakeWorker first(/*capacity=*/4);
  FakeWorker second(/*capacity=*/4);
  first.decode.FailAfter(1, absl::UnavailableError("Socket closed"));
  second.decode.FailAfter(1, absl::AbortedError("the KV reservation is gone"));
  AddFirstAndSpare(first, second);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1", 8), events.Callback()), IsOk());

  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  ExpectPrefixOf(Tokens(got), ExpectedTokens(4));
  ExpectOneContiguousStream(got);
  EXPECT_THAT(got.back().error,
              StatusIs(absl::StatusCode::kAborted, HasSubstr("migration limit of 1 reached")));
}

TEST_F(RemoteTokenSourceTest, ANonMigratableFailureIsNotMigrated) {
  Start();
  FakeWorker first(/*capacity=*/4);
  FakeWorker second(/*capacity=*/4);
  first.decode.FailAfter(1, absl::InternalError("engine step failed"));
  AddFirstAndSpare(first, second);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1", 6), events.Callback()), IsOk());

  const engine::TokenEvent end = events.AwaitEnd().back();
  EXPECT_THAT(end.error, StatusIs(absl::StatusCode::kInternal, HasSubstr("engine step failed")));
  EXPECT_TRUE(second.decode.requests().empty());
}

TEST_F(RemoteTokenSourceTest, ARequestFindingTheKvCacheFullWaitsAndIsServedWhenRoomFrees) {
  RemoteTokenSourceOptions options;
  options.kv_retry_interval = absl::Milliseconds(100);
  Start(options);
  FakeWorker worker(/*capacity=*/1);
  AddWorker("w1", worker);
  worker.decode.set_hold(true);
  Events first;
  ASSERT_THAT(source_->Submit(Request("r1"), first.Callback()), IsOk());
  worker.decode.AwaitHeld(1);

  Events second;
  ASSERT_THAT(source_->Submit(Request("r2"), second.Callback()), IsOk());
  source_->AwaitWaitingKvForTesting(1);
  EXPECT_EQ(source_->num_waiting_kv(), 1);
  EXPECT_FALSE(second.ended());

  worker.decode.ReleaseHeld();  // The first request ends; its blocks free.
  EXPECT_EQ(first.AwaitEnd().back().finish, engine::FinishReason::kLength);
  worker.decode.AwaitNoneReserved();
  clock_.Advance(absl::Milliseconds(100));
  source_->RunTimersForTesting();

  const std::vector<engine::TokenEvent> got = second.AwaitEnd();
  EXPECT_EQ(got.back().finish, engine::FinishReason::kLength);
  EXPECT_EQ(Tokens(got), (std::vector<int32_t>{kFirstToken, 8, 9}));
  EXPECT_EQ(source_->num_waiting_kv(), 0);
}

TEST_F(RemoteTokenSourceTest, AWaitingRequestGoesToAnotherDecodeWorkerWithRoom) {
  Start();
  FakeWorker full(/*capacity=*/0);
  FakeWorker roomy(/*capacity=*/4);
  AddWorker("full", full, /*running=*/0);
  AddWorker("roomy", roomy, /*running=*/8);  // Busier: admission picks `full` first.
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());
  source_->AwaitWaitingKvForTesting(1);

  AddWorker("full", full, /*running=*/16);  // Now the busier one.
  clock_.Advance(absl::Seconds(1));
  source_->RunTimersForTesting();

  const engine::TokenEvent end = events.AwaitEnd().back();
  EXPECT_EQ(end.finish, engine::FinishReason::kLength);
  EXPECT_EQ(end.placement->decode_worker_id, "roomy");
}

TEST_F(RemoteTokenSourceTest, AWaitEndsWithResourceExhaustedAndRetryInfoAtItsLimit) {
  RemoteTokenSourceOptions options;
  options.max_kv_wait = absl::Seconds(5);
  options.kv_full_retry_after = absl::Seconds(2);
  Start(options);
  FakeWorker worker(/*capacity=*/0);
  AddWorker("w1", worker);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());
  source_->AwaitWaitingKvForTesting(1);

  clock_.Advance(absl::Seconds(4));
  AddWorker("w1", worker);  // Fresh load: the retry finds the cache still full.
  source_->RunTimersForTesting();
  source_->AwaitWaitingKvForTesting(1);
  EXPECT_FALSE(events.ended());

  clock_.Advance(absl::Seconds(2));
  source_->RunTimersForTesting();
  const engine::TokenEvent end = events.AwaitEnd().back();
  EXPECT_EQ(end.finish, engine::FinishReason::kError);
  EXPECT_THAT(end.error, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(GetRetryDelay(end.error), absl::Seconds(2));
  EXPECT_TRUE(absl::StrContains(end.error.message(), "KV room")) << end.error;
  EXPECT_EQ(source_->num_waiting_kv(), 0);
}

TEST_F(RemoteTokenSourceTest, TheClientsDeadlineBoundsTheWait) {
  Start();
  FakeWorker worker(/*capacity=*/0);
  AddWorker("w1", worker);
  engine::EngineRequest request = Request("r1");
  request.time_limit = absl::Seconds(1);
  Events events;
  ASSERT_THAT(source_->Submit(std::move(request), events.Callback()), IsOk());
  source_->AwaitWaitingKvForTesting(1);

  clock_.Advance(absl::Milliseconds(1500));
  source_->RunTimersForTesting();
  EXPECT_THAT(events.AwaitEnd().back().error, StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST_F(RemoteTokenSourceTest, AbortEndsAWaitAtOnce) {
  Start();
  FakeWorker worker(/*capacity=*/0);
  AddWorker("w1", worker);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());
  source_->AwaitWaitingKvForTesting(1);

  source_->Abort("r1");
  EXPECT_EQ(events.AwaitEnd().back().finish, engine::FinishReason::kAborted);
  EXPECT_EQ(source_->num_waiting_kv(), 0);
  EXPECT_EQ(source_->num_in_flight(), 0);
}

TEST_F(RemoteTokenSourceTest, AbortCancelsTheCallsInFlightAndFreesTheReservation) {
  Start();
  FakeWorker worker(/*capacity=*/4);
  worker.decode.set_hold(true);
  AddWorker("w1", worker);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());
  worker.decode.AwaitHeld(1);
  events.AwaitTokens(1);

  source_->Abort("r1");
  const std::vector<engine::TokenEvent> got = events.AwaitEnd();
  EXPECT_EQ(got.back().finish, engine::FinishReason::kAborted);
  EXPECT_EQ(Tokens(got), (std::vector<int32_t>{kFirstToken}));
  worker.decode.AwaitNoneReserved();
}

double Counted(prometheus::Registry& registry, const std::string& name,
               const prometheus::Labels& labels) {
  return telemetry::FindSeries(registry, name, labels).value;
}

TEST_F(RemoteTokenSourceTest, ARequestRefusedAtTheDoorCountsAsRejectedOnly) {
  prometheus::Registry registry;
  RouterMetrics metrics(registry, admission::QosConfig::SingleDefaultClass());
  RemoteTokenSourceOptions options;
  options.metrics = &metrics;
  Start(options);  // No worker has reported: admission refuses (no_workers).
  Events events;
  EXPECT_THAT(source_->Submit(Request("r1"), events.Callback()),
              StatusIs(absl::StatusCode::kResourceExhausted));

  const std::string requests = "trident_router_requests_total";
  EXPECT_EQ(Counted(registry, requests, {{"class", "default"}, {"outcome", "rejected"}}), 1);
  EXPECT_EQ(Counted(registry, requests, {{"class", "default"}, {"outcome", "error"}}), 0);
  EXPECT_EQ(Counted(registry, "trident_router_requests_in_flight", {{"stage", "prefill"}}), 0);
}

TEST_F(RemoteTokenSourceTest, AWaitRefusedAtItsLimitCountsAsRejectedForKvCapacity) {
  prometheus::Registry registry;
  RouterMetrics metrics(registry, admission::QosConfig::SingleDefaultClass());
  RemoteTokenSourceOptions options;
  options.metrics = &metrics;
  options.max_kv_wait = absl::Seconds(1);
  Start(options);
  FakeWorker worker(/*capacity=*/0);
  AddWorker("w1", worker);
  Events events;
  ASSERT_THAT(source_->Submit(Request("r1"), events.Callback()), IsOk());
  source_->AwaitWaitingKvForTesting(1);
  EXPECT_EQ(Counted(registry, "trident_router_requests_waiting_kv", {}), 1);

  clock_.Advance(absl::Seconds(2));
  source_->RunTimersForTesting();
  events.AwaitEnd();
  const std::string requests = "trident_router_requests_total";
  EXPECT_EQ(Counted(registry, "trident_router_requests_waiting_kv", {}), 0);
  EXPECT_EQ(Counted(registry, requests, {{"class", "default"}, {"outcome", "rejected"}}), 1);
  EXPECT_EQ(Counted(registry, requests, {{"class", "default"}, {"outcome", "error"}}), 0);
  EXPECT_EQ(Counted(registry, "trident_router_requests_rejected_total",
                    {{"class", "default"}, {"reason", "kv_capacity"}}),
            1);
}

TEST_F(RemoteTokenSourceTest, TheThreadCountDoesNotGrowWithStreamsInFlight) {
  Start();
  FakeWorker worker(/*capacity=*/1024);
  worker.decode.set_hold(true);
  AddWorker("w1", worker);
  std::vector<std::unique_ptr<Events>> events;
  auto submit = [&](int n) {
    for (int i = 0; i < n; ++i) {
      events.push_back(std::make_unique<Events>());
      ASSERT_THAT(
          source_->Submit(Request(absl::StrCat("r", events.size())), events.back()->Callback()),
          IsOk());
    }
  };
  submit(1);
  worker.decode.AwaitHeld(1);
  const int threads_at_1 = ProcessThreads();
  submit(511);
  worker.decode.AwaitHeld(512);
  const int threads_at_512 = ProcessThreads();
  std::printf("process threads: %d with 1 stream in flight, %d with 512\n", threads_at_1,
              threads_at_512);
  EXPECT_EQ(source_->num_in_flight(), 512);
  // gRPC's callback pools may grow a little under load; never per request.
  EXPECT_LE(threads_at_512, threads_at_1 + 16);

  worker.decode.ReleaseHeld();
  for (auto& e : events) EXPECT_EQ(e->AwaitEnd().back().finish, engine::FinishReason::kLength);
}

}  // namespace
}  // namespace trident::router
