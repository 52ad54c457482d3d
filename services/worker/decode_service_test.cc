// trident.v1.Decode served by DecodeService over a real gRPC server, on an
// engine with the fake backend; a second engine plays the prefill worker,
// and the fake's "KV" is copied into the reserved blocks as a transport
// would write them.

#include "services/worker/decode_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/backend/fake_model_backend.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/worker/decode_kv_testing.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;

constexpr int32_t kVocab = 50;
constexpr int32_t kBlocks = 32;
constexpr int32_t kBlockSize = 4;
constexpr uint64_t kIncarnation = 77;

std::unique_ptr<backend::FakeModelBackend> Fake() {
  return std::make_unique<backend::FakeModelBackend>(kVocab, kBlocks, kBlockSize, 128);
}

engine::EngineRequest Greedy(std::string id, std::vector<int32_t> prompt, int32_t max_tokens) {
  engine::EngineRequest r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// The decode worker under test plus a prefill engine.
class DecodeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto decode_fake = Fake();
    decode_kv_ = decode_fake.get();
    engine_ = std::make_unique<engine::Engine>(std::move(decode_fake), engine::EngineOptions{});
    auto prefill_fake = Fake();
    prefill_kv_ = prefill_fake.get();
    prefill_ = std::make_unique<engine::Engine>(std::move(prefill_fake), engine::EngineOptions{});
    v1::ModelInfoResponse info;
    info.set_vocab_size(kVocab);
    info.set_max_context_tokens(1024);
    DecodeServiceOptions options;
    options.worker_id = "decode-0";
    options.incarnation = kIncarnation;
    options.address = "127.0.0.1:1";
    options.role = v1::ROLE_DECODE;
    options.lease_check_interval = absl::Milliseconds(10);
    kv_ = std::make_unique<DecodeKvForTests>(engine_.get(), &clock_, "decode-0", kIncarnation,
                                             kBlockSize, kBlocks);
    service_ = std::make_unique<DecodeService>(engine_.get(), info, &kv_->reservations,
                                               &kv_->receiver, &clock_, options);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Decode::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    server_->Shutdown();
    engine_->Shutdown();
    prefill_->Shutdown();
  }

  // Prefill-only run of `request` on the prefill engine.
  engine::TokenEvent Prefill(engine::EngineRequest request) {
    request.prefill_only = true;
    absl::Notification done;
    engine::TokenEvent event;
    EXPECT_THAT(prefill_->Submit(request,
                                 [&](const engine::TokenEvent& ev) {
                                   event = ev;
                                   done.Notify();
                                 }),
                IsOk());
    done.WaitForNotification();
    return event;
  }

  v1::ReserveKvResponse Reserve(const std::string& id, int32_t tokens, absl::Duration lease) {
    grpc::ClientContext context;
    v1::ReserveKvRequest request;
    request.set_request_id(id);
    request.set_num_tokens(tokens);
    if (lease > absl::ZeroDuration()) {
      request.mutable_lease()->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(lease)));
    }
    v1::ReserveKvResponse response;
    const grpc::Status status = stub_->ReserveKv(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  grpc::Status Commit(uint64_t reservation, v1::CommitOutcome outcome, int32_t first_token,
                      uint64_t incarnation = kIncarnation) {
    grpc::ClientContext context;
    v1::CommitKvRequest request;
    request.set_decode_incarnation(incarnation);
    request.set_reservation_id(reservation);
    request.set_outcome(outcome);
    if (first_token >= 0) request.mutable_first_token()->add_token_ids(first_token);
    request.set_error_message("put failed on layer 2");
    v1::CommitKvResponse response;
    return stub_->CommitKv(&context, request, &response);
  }

  v1::DecodeRequest DecodeFor(const engine::EngineRequest& r, uint64_t reservation) {
    v1::DecodeRequest d;
    d.set_request_id(r.id);
    d.set_reservation_id(reservation);
    d.set_decode_incarnation(kIncarnation);
    for (int32_t t : r.prompt) d.add_prompt_token_ids(t);
    d.mutable_sampling()->set_temperature(0);
    d.mutable_sampling()->set_max_tokens(r.max_tokens);
    return d;
  }

  RealClock clock_;
  backend::FakeModelBackend* decode_kv_ = nullptr;
  backend::FakeModelBackend* prefill_kv_ = nullptr;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<engine::Engine> prefill_;
  std::unique_ptr<DecodeKvForTests> kv_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Decode::Stub> stub_;
};

TEST_F(DecodeServiceTest, ReservedKvCommittedByThePrefillSideIsDecodedToTheEnd) {
  const engine::EngineRequest request = Greedy("r1", {3, 1, 4, 1, 5, 9, 2, 6, 5}, 8);
  std::vector<int32_t> expected;
  {
    engine::Engine single(Fake(), {});
    absl::Notification done;
    ASSERT_THAT(single.Submit(request,
                              [&](const engine::TokenEvent& ev) {
                                expected.push_back(ev.token);
                                if (ev.finish != engine::FinishReason::kNone) done.Notify();
                              }),
                IsOk());
    done.WaitForNotification();
  }
  const v1::ReserveKvResponse reserved = Reserve("r1", 9, absl::ZeroDuration());
  const v1::KvDestination& d = reserved.destination();
  EXPECT_EQ(d.decode_worker_id(), "decode-0");
  EXPECT_EQ(d.decode_incarnation(), kIncarnation);
  EXPECT_NE(d.reservation_id(), 0u);
  EXPECT_EQ(d.num_tokens(), 9);
  ASSERT_EQ(d.block_ids_size(), 3);
  EXPECT_EQ(d.endpoint().owner_id(), "decode-0");
  EXPECT_EQ(reserved.lease().seconds(), 30);

  // The decode call waits for the hand-off.
  grpc::ClientContext context;
  auto reader = stub_->Decode(&context, DecodeFor(request, d.reservation_id()));
  const engine::TokenEvent first = Prefill(request);
  ASSERT_EQ(first.finish, engine::FinishReason::kPrefilled);
  decode_kv_->CopyKvBlocks(*prefill_kv_, first.prefilled_blocks,
                           std::vector<int32_t>(d.block_ids().begin(), d.block_ids().end()));
  prefill_->ReleasePrefilled(request.id);
  ASSERT_TRUE(Commit(d.reservation_id(), v1::COMMIT_OUTCOME_COMPLETE, first.token).ok());

  std::vector<int32_t> got = {first.token};
  v1::DecodeResponse response;
  ASSERT_TRUE(reader->Read(&response));
  EXPECT_TRUE(response.has_joined());
  v1::GenerateComplete complete;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      for (int32_t t : response.chunk().token_ids()) got.push_back(t);
    } else if (response.has_complete()) {
      complete = response.complete();
    }
  }
  const grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(got, expected);
  EXPECT_EQ(complete.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(complete.usage().prompt_tokens(), 9);
  EXPECT_EQ(complete.usage().completion_tokens(), 8);
  EXPECT_EQ(kv_->reservations.num_reservations(), 0);
  // Every block is back: all of them can be reserved at once.
  auto all = engine_->ReserveBlocks(kBlocks);
  ASSERT_THAT(all.status(), IsOk());
  ASSERT_THAT(engine_->FreeBlocks(*all), IsOk());
}

TEST_F(DecodeServiceTest, FinishedAndAbortedHandOffsEndTheDecodeStream) {
  const engine::EngineRequest request = Greedy("r2", {1, 2, 3, 4, 5}, 4);
  const v1::ReserveKvResponse a = Reserve("fin", 5, absl::ZeroDuration());
  const v1::ReserveKvResponse b = Reserve("abort", 5, absl::ZeroDuration());
  ASSERT_TRUE(Commit(a.destination().reservation_id(), v1::COMMIT_OUTCOME_FINISHED, 7).ok());
  grpc::ClientContext fin_context;
  auto fin = stub_->Decode(&fin_context, DecodeFor(request, a.destination().reservation_id()));
  v1::DecodeResponse response;
  ASSERT_TRUE(fin->Read(&response));
  ASSERT_TRUE(response.has_complete()) << "no `joined` when the first token ended it";
  EXPECT_EQ(response.complete().usage().completion_tokens(), 1);
  EXPECT_TRUE(fin->Finish().ok());

  grpc::ClientContext abort_context;
  auto aborted =
      stub_->Decode(&abort_context, DecodeFor(request, b.destination().reservation_id()));
  ASSERT_TRUE(Commit(b.destination().reservation_id(), v1::COMMIT_OUTCOME_ABORTED, -1).ok());
  while (aborted->Read(&response)) {
  }
  const grpc::Status status = aborted->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(status.error_message(), HasSubstr("put failed on layer 2"));
  EXPECT_EQ(kv_->reservations.blocks_held(), 0);
}

TEST_F(DecodeServiceTest, ALeaseThatEndsFailsTheWaitingDecodeAndFreesItsBlocks) {
  const engine::EngineRequest request = Greedy("late", {1, 2, 3, 4, 5, 6}, 4);
  const v1::ReserveKvResponse r = Reserve("late", 6, absl::Milliseconds(50));
  grpc::ClientContext context;
  auto reader = stub_->Decode(&context, DecodeFor(request, r.destination().reservation_id()));
  v1::DecodeResponse response;
  while (reader->Read(&response)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(status.error_message(), HasSubstr("lease"));
  EXPECT_EQ(kv_->reservations.blocks_held(), 0);
  // The writer's late commit is refused.
  EXPECT_EQ(Commit(r.destination().reservation_id(), v1::COMMIT_OUTCOME_COMPLETE, 3).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(DecodeServiceTest, BadCallsGetTheDocumentedStatus) {
  {
    grpc::ClientContext context;
    v1::ReserveKvRequest request;
    request.set_num_tokens(4);
    v1::ReserveKvResponse response;
    const grpc::Status s = stub_->ReserveKv(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("request_id"));
  }
  {
    grpc::ClientContext context;
    v1::ReserveKvRequest request;
    request.set_request_id("x");
    request.set_num_tokens(4 * kBlocks + 1);
    v1::ReserveKvResponse response;
    EXPECT_EQ(stub_->ReserveKv(&context, request, &response).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  const v1::ReserveKvResponse r = Reserve("x", 4, absl::ZeroDuration());
  EXPECT_EQ(
      Commit(r.destination().reservation_id(), v1::COMMIT_OUTCOME_COMPLETE, 3, 5).error_code(),
      grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Commit(999, v1::COMMIT_OUTCOME_COMPLETE, 3).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Commit(r.destination().reservation_id(), v1::COMMIT_OUTCOME_COMPLETE, -1).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(
      Commit(r.destination().reservation_id(), v1::COMMIT_OUTCOME_UNSPECIFIED, 3).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
  {
    grpc::ClientContext context;
    v1::ReleaseKvRequest request;
    request.set_decode_incarnation(kIncarnation);
    request.set_reservation_id(r.destination().reservation_id());
    v1::ReleaseKvResponse response;
    ASSERT_TRUE(stub_->ReleaseKv(&context, request, &response).ok());
    EXPECT_TRUE(response.released());
  }
  // Without a reservation a decode-role worker cannot compute the prompt.
  grpc::ClientContext context;
  auto reader = stub_->Decode(&context, DecodeFor(Greedy("y", {1, 2}, 2), 0));
  v1::DecodeResponse response;
  while (reader->Read(&response)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace trident::worker
