// WorkerControl.SetRole over a real gRPC server, with the worker's Decode,
// Prefill, Generation and WorkerControl services sharing one WorkerRole on an
// engine whose fake backend holds every forward pass at a gate, so that work
// stays in flight until the test lets it go.

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/backend/fake_model_backend.h"
#include "common/frontend/generation_service.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/worker/decode_kv_testing.h"
#include "services/worker/decode_service.h"
#include "services/worker/load_streams.h"
#include "services/worker/prefill_service.h"
#include "services/worker/role_call_gate.h"
#include "services/worker/worker_role.h"
#include "services/worker/worker_services.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;

constexpr int32_t kVocab = 50;
constexpr int32_t kBlocks = 32;
constexpr int32_t kBlockSize = 4;
constexpr uint64_t kIncarnation = 77;

// The fake backend, with every Forward held until Open().
class GatedBackend final : public backend::FakeModelBackend {
 public:
  GatedBackend() : FakeModelBackend(kVocab, kBlocks, kBlockSize, 128) {}

  absl::Status Forward(absl::Span<const backend::StepSequence> batch, float* logits) override {
    {
      absl::MutexLock lock(&mu_);
      ++entered_;
      mu_.Await(absl::Condition(&open_));
    }
    return FakeModelBackend::Forward(batch, logits);
  }

  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // Waits until a forward pass (so a sequence) is in the engine.
  void AwaitEntered() {
    absl::MutexLock lock(&mu_);
    auto entered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entered_ > 0; };
    mu_.Await(absl::Condition(&entered));
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
};

struct Stream {
  std::vector<int32_t> tokens;
  bool completed = false;
  grpc::Status status;
};

// Reads a server stream to its end.
template <typename Reader, typename Response>
Stream ReadAll(Reader& reader) {
  Stream s;
  Response response;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      for (int32_t t : response.chunk().token_ids()) s.tokens.push_back(t);
    }
    if (response.has_complete()) s.completed = true;
  }
  s.status = reader->Finish();
  return s;
}

class SetRoleTest : public ::testing::Test {
 protected:
  void Start(v1::Role initial) {
    role_ = std::make_unique<WorkerRole>(initial, &clock_);
    auto backend = std::make_unique<GatedBackend>();
    gate_ = backend.get();
    engine_ = std::make_unique<engine::Engine>(std::move(backend), engine::EngineOptions{});
    v1::ModelInfoResponse info;
    info.set_model("fake");
    info.set_vocab_size(kVocab);
    info.set_max_context_tokens(128);
    DecodeServiceOptions decode_options;
    decode_options.worker_id = "worker-0";
    decode_options.incarnation = kIncarnation;
    decode_options.worker_role = role_.get();
    kv_ = std::make_unique<DecodeKvForTests>(engine_.get(), &clock_, "worker-0", kIncarnation,
                                             kBlockSize, kBlocks);
    decode_ = std::make_unique<DecodeService>(engine_.get(), info, &kv_->reservations,
                                              &kv_->receiver, &clock_, decode_options);
    PrefillServiceOptions prefill_options;
    prefill_options.worker_id = "worker-0";
    prefill_options.worker_role = role_.get();
    prefill_ = std::make_unique<PrefillService>(engine_.get(), info, /*sender=*/nullptr, &clock_,
                                                prefill_options);
    generation_gate_ = std::make_unique<RoleCallGate>(role_.get());
    generation_ = std::make_unique<frontend::GenerationService>(
        engine_.get(), /*tokenizer=*/nullptr, info, &clock_, generation_gate_.get());
    WorkerRole* role = role_.get();
    engine::Engine* engine = engine_.get();
    loads_ = std::make_unique<LoadStreams>([role, engine] {
      const WorkerRole::State state = role->state();
      WorkerIdentity identity{.worker_id = "worker-0",
                              .incarnation = kIncarnation,
                              .role = state.role,
                              .pending_role = state.pending_role};
      return WorkerLoadFromStats(identity, engine->stats(), 0, 0, absl::Now());
    });
    control_ = std::make_unique<WorkerControlService>(engine_.get(), loads_.get(), role_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    for (grpc::Service* s : std::vector<grpc::Service*>{decode_.get(), prefill_.get(),
                                                        generation_.get(), control_.get()}) {
      builder.RegisterService(s);
    }
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto channel =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    decode_stub_ = v1::Decode::NewStub(channel);
    prefill_stub_ = v1::Prefill::NewStub(channel);
    generation_stub_ = v1::Generation::NewStub(channel);
    control_stub_ = v1::WorkerControl::NewStub(channel);
  }

  void TearDown() override {
    if (gate_ != nullptr) gate_->Open();
    if (server_ != nullptr) server_->Shutdown();
    if (engine_ != nullptr) engine_->Shutdown();
    control_.reset();
    loads_.reset();
  }

  struct SetRoleResult {
    grpc::Status status;
    v1::SetRoleResponse response;
  };
  SetRoleResult SetRole(v1::Role role, absl::Duration drain_timeout, uint64_t directive_id = 0) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::SetRoleRequest request;
    request.set_role(role);
    request.mutable_drain_timeout()->set_seconds(absl::ToInt64Seconds(drain_timeout));
    request.mutable_drain_timeout()->set_nanos(
        static_cast<int32_t>(absl::ToInt64Nanoseconds(drain_timeout % absl::Seconds(1))));
    request.set_directive_id(directive_id);
    request.set_reason("test");
    SetRoleResult r;
    r.status = control_stub_->SetRole(&context, request, &r.response);
    return r;
  }

  // Reads load samples until one has `state` (and `pending_role`).
  void AwaitLoadState(v1::ServingState state, v1::Role pending_role) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::GetLoadRequest request;
    request.mutable_interval()->set_nanos(10'000'000);
    auto reader = control_stub_->GetLoad(&context, request);
    v1::WorkerLoad load;
    while (reader->Read(&load)) {
      if (load.state() == state && load.pending_role() == pending_role) {
        context.TryCancel();
        reader->Finish();
        return;
      }
    }
    ADD_FAILURE() << "no load sample in state " << v1::ServingState_Name(state);
  }

  grpc::Status ReserveKv(const std::string& id, v1::ReserveKvResponse* response) {
    grpc::ClientContext context;
    v1::ReserveKvRequest request;
    request.set_request_id(id);
    request.set_num_tokens(5);
    return decode_stub_->ReserveKv(&context, request, response);
  }

  grpc::Status CommitKv(uint64_t reservation, v1::CommitOutcome outcome) {
    grpc::ClientContext context;
    v1::CommitKvRequest request;
    request.set_decode_incarnation(kIncarnation);
    request.set_reservation_id(reservation);
    request.set_outcome(outcome);
    if (outcome != v1::COMMIT_OUTCOME_ABORTED) request.mutable_first_token()->add_token_ids(7);
    v1::CommitKvResponse response;
    return decode_stub_->CommitKv(&context, request, &response);
  }

  static v1::GenerateRequest Generate(const std::string& id, int32_t max_tokens) {
    v1::GenerateRequest request;
    request.set_request_id(id);
    for (int32_t t : {3, 1, 4, 1, 5}) request.mutable_token_ids()->add_ids(t);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_stop()->set_ignore_eos(true);
    return request;
  }

  Stream RunGenerate(const v1::GenerateRequest& request) {
    grpc::ClientContext context;
    auto reader = generation_stub_->Generate(&context, request);
    return ReadAll<decltype(reader), v1::GenerateResponse>(reader);
  }

  Stream RunPrefill(const std::string& id) {
    grpc::ClientContext context;
    v1::PrefillRequest request;
    request.set_request_id(id);
    for (int32_t t : {2, 7, 1, 8}) request.add_prompt_token_ids(t);
    request.mutable_sampling()->set_temperature(0);
    auto reader = prefill_stub_->Prefill(&context, request);
    Stream s;
    v1::PrefillResponse response;
    while (reader->Read(&response)) {
      if (response.has_first_token()) s.tokens.push_back(response.first_token().token_ids(0));
    }
    s.status = reader->Finish();
    return s;
  }

  // Every KV block can be taken at once: none is held. A one-token request
  // through the engine first makes sure that releases already queued in the
  // engine (a prefill's blocks) have been applied.
  void ExpectAllBlocksFree() {
    absl::Notification done;
    engine::EngineRequest flush;
    flush.id = "flush";
    flush.prompt = {1};
    flush.max_tokens = 1;
    ASSERT_TRUE(engine_
                    ->Submit(flush,
                             [&done](const engine::TokenEvent& ev) {
                               if (ev.finish != engine::FinishReason::kNone) done.Notify();
                             })
                    .ok());
    done.WaitForNotification();
    auto all = engine_->ReserveBlocks(kBlocks);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_TRUE(engine_->FreeBlocks(*all).ok());
  }

  RealClock clock_;
  std::unique_ptr<WorkerRole> role_;
  GatedBackend* gate_ = nullptr;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<DecodeKvForTests> kv_;
  std::unique_ptr<DecodeService> decode_;
  std::unique_ptr<PrefillService> prefill_;
  std::unique_ptr<RoleCallGate> generation_gate_;
  std::unique_ptr<frontend::GenerationService> generation_;
  std::unique_ptr<LoadStreams> loads_;
  std::unique_ptr<WorkerControlService> control_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Decode::Stub> decode_stub_;
  std::unique_ptr<v1::Prefill::Stub> prefill_stub_;
  std::unique_ptr<v1::Generation::Stub> generation_stub_;
  std::unique_ptr<v1::WorkerControl::Stub> control_stub_;
};

TEST_F(SetRoleTest, IdleDecodeWorkerBecomesAPrefillWorker) {
  Start(v1::ROLE_DECODE);
  gate_->Open();
  EXPECT_EQ(RunPrefill("p0").status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);

  const SetRoleResult r = SetRole(v1::ROLE_PREFILL, absl::Seconds(30));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.response.previous_role(), v1::ROLE_DECODE);
  EXPECT_EQ(r.response.role(), v1::ROLE_PREFILL);
  EXPECT_EQ(r.response.drained_sequences(), 0);
  EXPECT_EQ(r.response.aborted_sequences(), 0);
  AwaitLoadState(v1::SERVING_STATE_SERVING, v1::ROLE_UNSPECIFIED);

  const Stream prefill = RunPrefill("p1");
  EXPECT_TRUE(prefill.status.ok()) << prefill.status.error_message();
  EXPECT_EQ(prefill.tokens.size(), 1u);
  v1::ReserveKvResponse reserved;
  const grpc::Status refused = ReserveKv("d1", &reserved);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("ROLE_PREFILL, which does not serve decode"));

  // The same role again: a no-op.
  const SetRoleResult again = SetRole(v1::ROLE_PREFILL, absl::ZeroDuration());
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.response.previous_role(), v1::ROLE_PREFILL);
  EXPECT_EQ(again.response.role(), v1::ROLE_PREFILL);
  ExpectAllBlocksFree();
}

TEST_F(SetRoleTest, BadAndStaleRequestsGetTheDocumentedStatus) {
  Start(v1::ROLE_BOTH);
  gate_->Open();
  EXPECT_EQ(SetRole(v1::ROLE_UNSPECIFIED, absl::Seconds(1)).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  const SetRoleResult too_long = SetRole(v1::ROLE_DECODE, absl::Hours(2));
  EXPECT_EQ(too_long.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(too_long.status.error_message(), HasSubstr("drain_timeout"));
  ASSERT_TRUE(SetRole(v1::ROLE_DECODE, absl::ZeroDuration(), /*directive_id=*/5).status.ok());
  const SetRoleResult stale = SetRole(v1::ROLE_PREFILL, absl::ZeroDuration(), 4);
  EXPECT_EQ(stale.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(role_->role(), v1::ROLE_DECODE);
  // Generation needs role both.
  const Stream refused = RunGenerate(Generate("g1", 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(SetRoleTest, InFlightGenerationDrainsWhileNewWorkIsRefused) {
  Start(v1::ROLE_BOTH);
  grpc::ClientContext context;
  auto reader = generation_stub_->Generate(&context, Generate("g1", 6));
  gate_->AwaitEntered();

  SetRoleResult result;
  std::thread set_role([&] { result = SetRole(v1::ROLE_DECODE, absl::Seconds(60)); });
  AwaitLoadState(v1::SERVING_STATE_DRAINING, v1::ROLE_DECODE);
  // New colocated work is refused for now; decode work is still taken.
  const Stream refused = RunGenerate(Generate("g2", 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("draining"));
  EXPECT_EQ(SetRole(v1::ROLE_PREFILL, absl::ZeroDuration()).status.error_code(),
            grpc::StatusCode::ABORTED);
  v1::ReserveKvResponse reserved;
  ASSERT_TRUE(ReserveKv("d1", &reserved).ok());
  ASSERT_TRUE(CommitKv(reserved.destination().reservation_id(), v1::COMMIT_OUTCOME_ABORTED).ok());

  gate_->Open();
  const Stream generated = ReadAll<decltype(reader), v1::GenerateResponse>(reader);
  set_role.join();
  EXPECT_TRUE(generated.status.ok()) << generated.status.error_message();
  EXPECT_TRUE(generated.completed);
  EXPECT_EQ(generated.tokens.size(), 6u);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.response.previous_role(), v1::ROLE_BOTH);
  EXPECT_EQ(result.response.role(), v1::ROLE_DECODE);
  EXPECT_EQ(result.response.drained_sequences(), 1);
  EXPECT_EQ(result.response.aborted_sequences(), 0);
  EXPECT_GT(result.response.drain_time().seconds() * 1'000'000'000LL +
                result.response.drain_time().nanos(),
            0);
  EXPECT_EQ(RunGenerate(Generate("g3", 4)).status.error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ExpectAllBlocksFree();
}

TEST_F(SetRoleTest, GenerationLeftAfterTheDrainTimeoutIsAbortedWithAClearStatus) {
  Start(v1::ROLE_BOTH);
  grpc::ClientContext context;
  auto reader = generation_stub_->Generate(&context, Generate("g1", 6));
  gate_->AwaitEntered();

  SetRoleResult result;
  std::thread set_role([&] { result = SetRole(v1::ROLE_PREFILL, absl::Milliseconds(20)); });
  // The client hears why at once; the engine frees the sequence once its
  // forward pass is let go.
  const Stream aborted = ReadAll<decltype(reader), v1::GenerateResponse>(reader);
  EXPECT_EQ(aborted.status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(aborted.status.error_message(), HasSubstr("drain timeout"));
  EXPECT_FALSE(aborted.completed);
  gate_->Open();
  set_role.join();
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.response.role(), v1::ROLE_PREFILL);
  EXPECT_EQ(result.response.drained_sequences(), 0);
  EXPECT_EQ(result.response.aborted_sequences(), 1);
  ExpectAllBlocksFree();
  EXPECT_TRUE(RunPrefill("p1").status.ok());
}

TEST_F(SetRoleTest, ZeroDrainTimeoutAbortsPrefillsAtOnce) {
  Start(v1::ROLE_PREFILL);
  grpc::ClientContext context;
  v1::PrefillRequest request;
  request.set_request_id("p1");
  for (int32_t t : {2, 7, 1, 8}) request.add_prompt_token_ids(t);
  auto reader = prefill_stub_->Prefill(&context, request);
  gate_->AwaitEntered();

  SetRoleResult result;
  std::thread set_role([&] { result = SetRole(v1::ROLE_DECODE, absl::ZeroDuration()); });
  v1::PrefillResponse response;
  while (reader->Read(&response)) {
  }
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(status.error_message(), HasSubstr("from ROLE_PREFILL to ROLE_DECODE"));
  gate_->Open();
  set_role.join();
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.response.aborted_sequences(), 1);
  ExpectAllBlocksFree();
}

TEST_F(SetRoleTest, ReservationsAwaitingTheirDecodeAreDrainedThenReleased) {
  Start(v1::ROLE_DECODE);
  gate_->Open();
  // One reservation whose Decode is waiting for the KV, and one without.
  v1::ReserveKvResponse waited, orphan;
  ASSERT_TRUE(ReserveKv("d1", &waited).ok());
  ASSERT_TRUE(ReserveKv("d2", &orphan).ok());
  grpc::ClientContext context;
  v1::DecodeRequest decode;
  decode.set_request_id("d1");
  decode.set_reservation_id(waited.destination().reservation_id());
  decode.set_decode_incarnation(kIncarnation);
  for (int32_t t : {1, 2, 3, 4, 5}) decode.add_prompt_token_ids(t);
  decode.mutable_sampling()->set_max_tokens(3);
  auto reader = decode_stub_->Decode(&context, decode);

  SetRoleResult result;
  std::thread set_role([&] { result = SetRole(v1::ROLE_PREFILL, absl::Seconds(60)); });
  AwaitLoadState(v1::SERVING_STATE_DRAINING, v1::ROLE_PREFILL);
  v1::ReserveKvResponse refused;
  EXPECT_EQ(ReserveKv("d3", &refused).error_code(), grpc::StatusCode::UNAVAILABLE);
  // The prefill side's first token ended d1; the router gave d2 up, and its
  // writer then abandoned it.
  ASSERT_TRUE(CommitKv(waited.destination().reservation_id(), v1::COMMIT_OUTCOME_FINISHED).ok());
  const Stream decoded = ReadAll<decltype(reader), v1::DecodeResponse>(reader);
  EXPECT_TRUE(decoded.status.ok()) << decoded.status.error_message();
  EXPECT_TRUE(decoded.completed);
  {
    grpc::ClientContext release_context;
    v1::ReleaseKvRequest release;
    release.set_decode_incarnation(kIncarnation);
    release.set_reservation_id(orphan.destination().reservation_id());
    v1::ReleaseKvResponse released;
    ASSERT_TRUE(decode_stub_->ReleaseKv(&release_context, release, &released).ok());
    EXPECT_TRUE(released.released());
  }
  set_role.join();
  ASSERT_TRUE(CommitKv(orphan.destination().reservation_id(), v1::COMMIT_OUTCOME_ABORTED).ok());
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.response.drained_sequences(), 2);
  EXPECT_EQ(result.response.aborted_sequences(), 0);
  EXPECT_EQ(kv_->reservations.num_reservations(), 0);
  ExpectAllBlocksFree();
}

TEST_F(SetRoleTest, AReservationLeftAfterTheDrainIsReleased) {
  Start(v1::ROLE_DECODE);
  gate_->Open();
  v1::ReserveKvResponse orphan;
  ASSERT_TRUE(ReserveKv("d1", &orphan).ok());
  const SetRoleResult result = SetRole(v1::ROLE_PREFILL, absl::ZeroDuration());
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.response.aborted_sequences(), 1);
  // Released: its writer's late commit frees the blocks it kept.
  EXPECT_EQ(kv_->reservations.blocks_held(), 2);
  ASSERT_TRUE(CommitKv(orphan.destination().reservation_id(), v1::COMMIT_OUTCOME_COMPLETE).ok());
  EXPECT_EQ(kv_->reservations.num_reservations(), 0);
  ExpectAllBlocksFree();
}

TEST_F(SetRoleTest, CancellingTheCallCutsTheDrainShort) {
  Start(v1::ROLE_BOTH);
  grpc::ClientContext context;
  auto reader = generation_stub_->Generate(&context, Generate("g1", 6));
  gate_->AwaitEntered();
  {
    grpc::ClientContext set_role;
    set_role.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
    v1::SetRoleRequest request;
    request.set_role(v1::ROLE_DECODE);
    request.mutable_drain_timeout()->set_seconds(3600);
    v1::SetRoleResponse response;
    EXPECT_EQ(control_stub_->SetRole(&set_role, request, &response).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  const Stream aborted = ReadAll<decltype(reader), v1::GenerateResponse>(reader);
  EXPECT_EQ(aborted.status.error_code(), grpc::StatusCode::ABORTED);
  gate_->Open();
  AwaitLoadState(v1::SERVING_STATE_SERVING, v1::ROLE_UNSPECIFIED);
  EXPECT_EQ(role_->role(), v1::ROLE_DECODE);
}

}  // namespace
}  // namespace trident::worker
