// Disaggregated serving through the worker services, in one process over
// real gRPC: a prefill worker (PrefillService) and a decode worker
// (DecodeService), each on an engine with the fake backend, and an
// in-process KvSender that copies the fake's per-slot "KV" the way the UCX
// sender writes blocks. The test plays the router: ReserveKv on the decode
// worker, Prefill with that destination, Decode on the reservation.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/backend/fake_model_backend.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "common/time/proto_time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/worker/decode_kv_testing.h"
#include "services/worker/decode_service.h"
#include "services/worker/prefill_service.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;

constexpr int32_t kVocab = 50;
constexpr int32_t kBlocks = 32;
constexpr int32_t kBlockSize = 4;
constexpr uint64_t kIncarnation = 9;

std::unique_ptr<backend::FakeModelBackend> Fake() {
  return std::make_unique<backend::FakeModelBackend>(kVocab, kBlocks, kBlockSize, 128);
}

// Copies blocks between two fakes (one "layer"); can be told to fail.
class CopyingSender final : public transport::KvSender {
 public:
  CopyingSender(backend::FakeModelBackend* from, backend::FakeModelBackend* to)
      : from_(from), to_(to) {}
  int32_t num_layers() const override { return 1; }
  absl::StatusOr<std::unique_ptr<transport::KvTransfer>> Open(const v1::KvDestination& d) override {
    Note("open");
    if (fail_) return absl::UnavailableError("peer decode is unreachable");
    return std::unique_ptr<transport::KvTransfer>(new Transfer(this, d));
  }
  absl::Status Connect(const v1::KvDestination& d) override {
    Note("connect");
    if (fail_) return absl::UnavailableError("peer decode is unreachable");
    return absl::OkStatus();
  }
  void set_fail(bool fail) { fail_ = fail; }
  // Connect and Open calls, in order.
  std::vector<std::string> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // Waits for the first Open call (a transfer past its lease check).
  void AwaitOpen() {
    absl::MutexLock lock(&mu_);
    auto opened = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find(calls_.begin(), calls_.end(), "open") != calls_.end();
    };
    mu_.Await(absl::Condition(&opened));
  }

 private:
  class Transfer final : public transport::KvTransfer {
   public:
    Transfer(CopyingSender* s, const v1::KvDestination& d)
        : s_(s), dst_(d.block_ids().begin(), d.block_ids().end()) {}
    void SendLayer(int32_t layer, absl::Span<const int32_t> blocks,
                   std::function<void(absl::Status)> done) override {
      s_->to_->CopyKvBlocks(*s_->from_, blocks, dst_);
      bytes_ += static_cast<int64_t>(blocks.size()) * kBlockSize * 4;
      ++messages_;
      done(absl::OkStatus());
    }
    int64_t bytes_sent() const override { return bytes_; }
    int32_t messages() const override { return messages_; }
    std::string lane() const override { return "memcpy"; }
    int64_t message_bytes() const override { return 0; }

   private:
    CopyingSender* s_;
    std::vector<int32_t> dst_;
    int64_t bytes_ = 0;
    int32_t messages_ = 0;
  };
  void Note(std::string call) {
    absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
  }

  backend::FakeModelBackend* from_;
  backend::FakeModelBackend* to_;
  bool fail_ = false;
  absl::Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<grpc::Server> Serve(grpc::Service* service, int* port) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

class PrefillDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto prefill_fake = Fake();
    auto decode_fake = Fake();
    sender_ = std::make_unique<CopyingSender>(prefill_fake.get(), decode_fake.get());
    prefill_engine_ =
        std::make_unique<engine::Engine>(std::move(prefill_fake), engine::EngineOptions{});
    decode_engine_ =
        std::make_unique<engine::Engine>(std::move(decode_fake), engine::EngineOptions{});
    v1::ModelInfoResponse info;
    info.set_vocab_size(kVocab);
    info.set_max_context_tokens(128);
    int decode_port = 0;
    DecodeServiceOptions d;
    d.worker_id = "decode";
    d.incarnation = kIncarnation;
    d.role = v1::ROLE_DECODE;
    decode_kv_ = std::make_unique<DecodeKvForTests>(decode_engine_.get(), clock_ptr_, "decode",
                                                    kIncarnation, kBlockSize, kBlocks);
    decode_service_ =
        std::make_unique<DecodeService>(decode_engine_.get(), info, &decode_kv_->reservations,
                                        &decode_kv_->receiver, clock_ptr_, d);
    decode_server_ = Serve(decode_service_.get(), &decode_port);
    decode_address_ = absl::StrCat("127.0.0.1:", decode_port);
    PrefillServiceOptions p = prefill_options_;
    p.worker_id = "prefill";
    prefill_service_ =
        std::make_unique<PrefillService>(prefill_engine_.get(), info, sender_.get(), clock_ptr_, p);
    int prefill_port = 0;
    prefill_server_ = Serve(prefill_service_.get(), &prefill_port);
    decode_ = v1::Decode::NewStub(
        grpc::CreateChannel(decode_address_, grpc::InsecureChannelCredentials()));
    prefill_ = v1::Prefill::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", prefill_port),
                                                        grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    // The prefill side first: its last hand-offs (CommitKv) still reach the
    // decode worker.
    prefill_server_->Shutdown();
    prefill_service_.reset();
    decode_server_->Shutdown();
    prefill_engine_->Shutdown();
    decode_engine_->Shutdown();
    // Nothing leaked on either side.
    EXPECT_EQ(prefill_engine_->stats().blocks_free, kBlocks);
    EXPECT_EQ(decode_engine_->stats().blocks_free, kBlocks);
  }

  struct Outcome {
    std::vector<int32_t> tokens;
    grpc::Status prefill_status;
    grpc::Status decode_status;
    std::vector<std::string> prefill_messages;
    v1::GenerateComplete complete;
    // The prefill worker's prefix-cache reuse, the blocks the decode
    // worker's cache held (not written), and the KV bytes sent.
    int32_t prefill_cached_tokens = -1;
    int32_t decode_cached_blocks = -1;
    int64_t sent_bytes = -1;
  };

  // The router's part: reserve, prefill into the reservation, decode.
  Outcome Run(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens) {
    Outcome out;
    v1::ReserveKvRequest reserve;
    reserve.set_request_id(id);
    reserve.set_num_tokens(static_cast<int32_t>(prompt.size()));
    for (int32_t t : prompt) reserve.add_prompt_token_ids(t);
    v1::ReserveKvResponse reserved;
    {
      grpc::ClientContext context;
      const grpc::Status s = decode_->ReserveKv(&context, reserve, &reserved);
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    v1::KvDestination destination = reserved.destination();
    destination.set_decode_address(decode_address_);
    out.decode_cached_blocks = destination.num_cached_blocks();

    v1::DecodeRequest decode;
    decode.set_request_id(id);
    decode.set_reservation_id(destination.reservation_id());
    decode.set_decode_incarnation(kIncarnation);
    v1::PrefillRequest prefill;
    prefill.set_request_id(id);
    for (int32_t t : prompt) {
      decode.add_prompt_token_ids(t);
      prefill.add_prompt_token_ids(t);
    }
    decode.mutable_sampling()->set_temperature(0);
    decode.mutable_sampling()->set_max_tokens(max_tokens);
    *prefill.mutable_sampling() = decode.sampling();
    *prefill.mutable_destination() = destination;

    grpc::ClientContext decode_context;
    auto decode_reader = decode_->Decode(&decode_context, decode);
    grpc::ClientContext prefill_context;
    auto prefill_reader = prefill_->Prefill(&prefill_context, prefill);
    v1::PrefillResponse p;
    while (prefill_reader->Read(&p)) {
      if (p.has_started()) out.prefill_messages.push_back("started");
      if (p.has_first_token()) {
        out.prefill_cached_tokens = p.cached_tokens();
        out.prefill_messages.push_back("first_token");
        for (int32_t t : p.first_token().token_ids()) out.tokens.push_back(t);
      }
      if (p.has_progress()) out.prefill_messages.push_back("progress");
      if (p.has_transfer_done()) {
        out.prefill_messages.push_back("transfer_done");
        out.sent_bytes = p.transfer_done().sent_bytes();
      }
      if (p.has_complete()) out.prefill_messages.push_back("complete");
    }
    out.prefill_status = prefill_reader->Finish();
    v1::DecodeResponse d;
    while (decode_reader->Read(&d)) {
      if (d.has_chunk()) {
        for (int32_t t : d.chunk().token_ids()) out.tokens.push_back(t);
      }
      if (d.has_complete()) out.complete = d.complete();
    }
    out.decode_status = decode_reader->Finish();
    return out;
  }

  std::vector<int32_t> Alone(const std::vector<int32_t>& prompt, int32_t max_tokens) {
    engine::Engine single(Fake(), {});
    engine::EngineRequest r;
    r.id = "alone";
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    std::vector<int32_t> tokens;
    absl::Notification done;
    EXPECT_THAT(single.Submit(r,
                              [&](const engine::TokenEvent& ev) {
                                tokens.push_back(ev.token);
                                if (ev.finish != engine::FinishReason::kNone) done.Notify();
                              }),
                IsOk());
    done.WaitForNotification();
    return tokens;
  }

  RealClock clock_;
  // What the services run with; a derived fixture may change them before
  // SetUp.
  const Clock* clock_ptr_ = &clock_;
  PrefillServiceOptions prefill_options_;
  std::unique_ptr<CopyingSender> sender_;
  std::unique_ptr<engine::Engine> prefill_engine_;
  std::unique_ptr<engine::Engine> decode_engine_;
  std::unique_ptr<DecodeKvForTests> decode_kv_;
  std::unique_ptr<DecodeService> decode_service_;
  std::unique_ptr<PrefillService> prefill_service_;
  std::unique_ptr<grpc::Server> decode_server_;
  std::unique_ptr<grpc::Server> prefill_server_;
  std::string decode_address_;
  std::unique_ptr<v1::Decode::Stub> decode_;
  std::unique_ptr<v1::Prefill::Stub> prefill_;
};

TEST_F(PrefillDecodeTest, TokensEqualOneWorkerAlone) {
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 1, 4, 1, 5, 9, 2, 6, 5}, {7}, {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9}};
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome out = Run(absl::StrCat("req", i), prompts[i], 10);
    ASSERT_TRUE(out.prefill_status.ok()) << out.prefill_status.error_message();
    ASSERT_TRUE(out.decode_status.ok()) << out.decode_status.error_message();
    EXPECT_EQ(out.tokens, Alone(prompts[i], 10)) << "prompt " << i;
    EXPECT_THAT(out.prefill_messages,
                ::testing::ElementsAre("started", "first_token", "progress", "transfer_done"));
    EXPECT_EQ(out.complete.usage().completion_tokens(), 10);
  }
}

// A conversation's second turn: the decode worker kept the first turn's
// blocks (prompt and answer) cached, reserves only what it lacks, and the
// prefill worker writes only that tail; the prefill worker itself reuses
// the first prompt's blocks it computed.
TEST_F(PrefillDecodeTest, SecondTurnMovesOnlyTheNewTokens) {
  const std::vector<int32_t> turn1 = {3, 1, 4, 1, 5, 9, 2, 6, 5};
  const Outcome first = Run("turn1", turn1, 6);
  ASSERT_TRUE(first.decode_status.ok()) << first.decode_status.error_message();
  EXPECT_EQ(first.decode_cached_blocks, 0);
  EXPECT_EQ(first.prefill_cached_tokens, 0);
  EXPECT_EQ(first.sent_bytes, 3 * kBlockSize * 4);  // All 3 blocks of 9 tokens.

  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), first.tokens.begin(), first.tokens.end());
  turn2.insert(turn2.end(), {7, 7, 2});  // 18 tokens.
  const Outcome second = Run("turn2", turn2, 5);
  ASSERT_TRUE(second.prefill_status.ok()) << second.prefill_status.error_message();
  ASSERT_TRUE(second.decode_status.ok()) << second.decode_status.error_message();
  EXPECT_EQ(second.tokens, Alone(turn2, 5));
  // The decode worker computed 14 of the first turn's 15 tokens (the last
  // answer token's KV never is): 3 whole blocks. 5 blocks, 2 sent.
  EXPECT_EQ(second.decode_cached_blocks, 3);
  EXPECT_EQ(second.sent_bytes, 2 * kBlockSize * 4);
  // The prefill worker holds the first prompt's 2 whole blocks.
  EXPECT_EQ(second.prefill_cached_tokens, 8);
  EXPECT_EQ(decode_engine_->stats().kv_reserved_cached_blocks_total, 3);
}

// A block-aligned prompt the decode worker holds whole: nothing is written
// and no transfer is opened (a lane's metrics would count one opened and
// left unused as incomplete), and the tokens are still the model's.
TEST_F(PrefillDecodeTest, AFullHitAtTheDecodeWorkerWritesNothing) {
  const std::vector<int32_t> prompt = {2, 7, 1, 8, 2, 8, 1, 8};
  const Outcome first = Run("first", prompt, 3);
  ASSERT_TRUE(first.decode_status.ok()) << first.decode_status.error_message();
  const Outcome again = Run("again", prompt, 3);
  ASSERT_TRUE(again.prefill_status.ok()) << again.prefill_status.error_message();
  ASSERT_TRUE(again.decode_status.ok()) << again.decode_status.error_message();
  EXPECT_EQ(again.decode_cached_blocks, 2);
  EXPECT_EQ(again.sent_bytes, 0);
  const std::vector<std::string> calls = sender_->calls();
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "open"), 1);
  EXPECT_EQ(again.tokens, Alone(prompt, 3));
  EXPECT_EQ(again.tokens, first.tokens);
}

TEST_F(PrefillDecodeTest, ConnectsToTheDecodeWorkerBeforeTheFirstLayerIsReady) {
  const Outcome out = Run("early", {3, 1, 4, 1, 5}, 3);
  ASSERT_TRUE(out.prefill_status.ok()) << out.prefill_status.error_message();
  ASSERT_TRUE(out.decode_status.ok()) << out.decode_status.error_message();
  EXPECT_THAT(sender_->calls(), ::testing::ElementsAre("connect", "open"));
}

TEST_F(PrefillDecodeTest, AFirstTokenThatEndsTheRequestFinishesBothStreams) {
  const Outcome out = Run("one", {4, 4, 4, 4, 4}, 1);
  ASSERT_TRUE(out.prefill_status.ok()) << out.prefill_status.error_message();
  ASSERT_TRUE(out.decode_status.ok()) << out.decode_status.error_message();
  EXPECT_EQ(out.tokens, Alone({4, 4, 4, 4, 4}, 1));
  EXPECT_THAT(out.prefill_messages,
              ::testing::ElementsAre("started", "first_token", "transfer_done", "complete"));
  EXPECT_EQ(out.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
}

TEST_F(PrefillDecodeTest, AFailedTransferAbortsBothSidesAndFreesTheirBlocks) {
  sender_->set_fail(true);
  const Outcome out = Run("lost", {1, 2, 3, 4, 5, 6}, 5);
  EXPECT_EQ(out.prefill_status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(out.prefill_status.error_message(), HasSubstr("unreachable"));
  EXPECT_EQ(out.decode_status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_EQ(decode_kv_->reservations.blocks_held(), 0);
  // The early connect failed too; Open tried again and reported it.
  EXPECT_THAT(sender_->calls(), ::testing::ElementsAre("connect", "open"));
}

// A transfer held after its first layer (as a long prefill or a slow link
// would hold it), on a clock the test moves.
class PrefillLeaseTest : public PrefillDecodeTest {
 protected:
  PrefillLeaseTest() {
    clock_ptr_ = &fake_clock_;
    prefill_options_.lease_renew_period = absl::ZeroDuration();  // The test renews.
    prefill_options_.testonly_stall_after_layers = 0;
  }

  // Reserves (lease 30 s) and starts a prefill into the reservation; returns
  // once its first token arrived and its transfer opened (and is held).
  void Start(const std::string& id) {
    v1::ReserveKvRequest reserve;
    reserve.set_request_id(id);
    reserve.set_num_tokens(5);
    SetProtoDuration(absl::Seconds(30), reserve.mutable_lease());
    grpc::ClientContext context;
    const grpc::Status s = decode_->ReserveKv(&context, reserve, &reserved_);
    ASSERT_TRUE(s.ok()) << s.error_message();
    v1::PrefillRequest prefill;
    prefill.set_request_id(id);
    for (int32_t t : {3, 1, 4, 1, 5}) prefill.add_prompt_token_ids(t);
    prefill.mutable_sampling()->set_max_tokens(4);
    *prefill.mutable_destination() = reserved_.destination();
    prefill.mutable_destination()->set_decode_address(decode_address_);
    prefill_reader_ = prefill_->Prefill(&prefill_context_, prefill);
    v1::PrefillResponse response;
    while (prefill_reader_->Read(&response) && !response.has_first_token()) {
    }
    ASSERT_TRUE(response.has_first_token());
    // The clock moves only after the transfer's own lease check.
    sender_->AwaitOpen();
  }

  // Reads the prefill stream to its end.
  grpc::Status Finish() {
    v1::PrefillResponse response;
    while (prefill_reader_->Read(&response)) {
    }
    return prefill_reader_->Finish();
  }

  FakeClock fake_clock_{absl::FromUnixSeconds(1'700'000'000)};
  v1::ReserveKvResponse reserved_;
  grpc::ClientContext prefill_context_;
  std::unique_ptr<grpc::ClientReader<v1::PrefillResponse>> prefill_reader_;
};

TEST_F(PrefillLeaseTest, KeepsTheReservationPastItsLeaseUntilTheHandOff) {
  Start("long");
  EXPECT_EQ(prefill_service_->LeasesKeptForTesting(), 1);
  EXPECT_EQ(prefill_service_->RenewDueLeases(), 0);  // 30 s left of 30.
  // Well past the reservation's original lease, renewed every 16 s.
  for (int i = 0; i < 4; ++i) {
    fake_clock_.Advance(absl::Seconds(16));
    EXPECT_EQ(prefill_service_->RenewDueLeases(), 1) << "renewal " << i;
  }
  // The decode worker still holds the blocks: its lease was extended.
  EXPECT_GT(decode_kv_->reservations.blocks_held(), 0);
  // The router gives up: the prefill stops, hands over ABORTED, and both
  // sides free everything (TearDown); the lease is no longer kept.
  prefill_context_.TryCancel();
  EXPECT_EQ(Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(PrefillLeaseTest, AReservationWhoseLeaseEndedStopsThePrefillAtOnce) {
  Start("orphan");
  // No renewal in time (the decode worker was unreachable for the lease's
  // second half): the decode worker frees the reservation, and the next
  // renewal finds it gone.
  fake_clock_.Advance(absl::Seconds(31));
  decode_service_->ExpireLeases();
  EXPECT_EQ(decode_kv_->reservations.blocks_held(), 0);
  EXPECT_EQ(prefill_service_->RenewDueLeases(), 0);
  EXPECT_EQ(prefill_service_->LeasesKeptForTesting(), 0);
  const grpc::Status status = Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(status.error_message(), HasSubstr("KV reservation on decode worker decode"));
  EXPECT_THAT(status.error_message(), HasSubstr("expired"));
}

}  // namespace
}  // namespace trident::worker
