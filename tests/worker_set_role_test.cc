// WorkerControl.SetRole on a real worker process (CPU backend, generated
// llama3-tiny model): an idle decode worker becomes a prefill worker; a
// colocated worker switching roles drains a generation in flight, or aborts
// it when the drain timeout is zero, and every KV block is free afterwards.

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/service_process.h"
#include "trident/v1/generation.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::ServiceProcess;
using ::trident::testing::TestTmpPath;

// Long enough that the generation is still running when SetRole arrives a
// millisecond after its first token (llama3-tiny needs well under 1 ms per
// token; 1500 tokens take hundreds of them).
constexpr int32_t kLongGeneration = 1500;

class WorkerSetRoleTest : public ::testing::Test {
 protected:
  void StartWorker(const std::string& role, const std::string& name) {
    const std::string model_dir = TestTmpPath("llama3-tiny");
    ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", model_dir), IsOk());
    auto started =
        testing::StartService({RunfilePath("services/worker/worker"), absl::StrCat("--role=", role),
                               absl::StrCat("--worker_id=", name), "--kv_transport=ucx",
                               "--ucx_transports=tcp", "--pin_threads=false", "--cpu_threads=1",
                               "--kv_cache_mb=16", absl::StrCat("--model=", model_dir),
                               // Refusals at once: the announce period is
                               // covered by worker_role_test and
                               // controller_live_test.
                               "--role_change_announce=0s"},
                              TestTmpPath(absl::StrCat(name, ".log")));
    ASSERT_THAT(started, IsOk());
    worker_ = *started;
    control_ = v1::WorkerControl::NewStub(worker_.channel);
    generation_ = v1::Generation::NewStub(worker_.channel);
    decode_ = v1::Decode::NewStub(worker_.channel);
    prefill_ = v1::Prefill::NewStub(worker_.channel);
  }

  void TearDown() override { EXPECT_THAT(testing::StopService(worker_), IsOk()); }

  struct SetRoleResult {
    grpc::Status status;
    v1::SetRoleResponse response;
  };
  SetRoleResult SetRole(v1::Role role, int64_t drain_timeout_seconds) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    v1::SetRoleRequest request;
    request.set_role(role);
    request.mutable_drain_timeout()->set_seconds(drain_timeout_seconds);
    request.set_reason("worker_set_role_test");
    SetRoleResult r;
    r.status = control_->SetRole(&context, request, &r.response);
    return r;
  }

  // The first load sample with `state`, within 30 s.
  v1::WorkerLoad AwaitLoad(v1::ServingState state) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::GetLoadRequest request;
    request.mutable_interval()->set_nanos(10'000'000);
    auto reader = control_->GetLoad(&context, request);
    v1::WorkerLoad load;
    while (reader->Read(&load)) {
      if (load.state() == state) {
        context.TryCancel();
        return load;
      }
    }
    ADD_FAILURE() << "no load sample in state " << v1::ServingState_Name(state);
    return v1::WorkerLoad();
  }

  grpc::Status ReserveKv(v1::ReserveKvResponse* response) {
    grpc::ClientContext context;
    v1::ReserveKvRequest request;
    request.set_request_id("reserve");
    request.set_num_tokens(8);
    return decode_->ReserveKv(&context, request, response);
  }

  // Gives a reservation up as the router does, then abandons it as its
  // writer does, which frees its blocks.
  void ReleaseKv(const v1::ReserveKvResponse& reserved) {
    grpc::ClientContext context;
    v1::ReleaseKvRequest request;
    request.set_decode_incarnation(reserved.destination().decode_incarnation());
    request.set_reservation_id(reserved.destination().reservation_id());
    v1::ReleaseKvResponse response;
    ASSERT_TRUE(decode_->ReleaseKv(&context, request, &response).ok());
    grpc::ClientContext commit_context;
    v1::CommitKvRequest commit;
    commit.set_decode_incarnation(reserved.destination().decode_incarnation());
    commit.set_reservation_id(reserved.destination().reservation_id());
    commit.set_outcome(v1::COMMIT_OUTCOME_ABORTED);
    v1::CommitKvResponse committed;
    ASSERT_TRUE(decode_->CommitKv(&commit_context, commit, &committed).ok());
  }

  static v1::GenerateRequest Generation(const std::string& id, int32_t max_tokens) {
    v1::GenerateRequest request;
    request.set_request_id(id);
    for (int32_t t : {11, 22, 33, 44, 55, 66, 77}) request.mutable_token_ids()->add_ids(t);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_stop()->set_ignore_eos(true);
    return request;
  }

  // A generation that has streamed its first token; the test reads the rest.
  struct Running {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
    int tokens = 0;
    bool completed = false;

    grpc::Status ReadToTheEnd() {
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
        if (response.has_chunk()) tokens += response.chunk().token_ids_size();
        if (response.has_complete()) completed = true;
      }
      return reader->Finish();
    }
  };
  void StartGeneration(const std::string& id, Running* running) {
    running->reader = generation_->Generate(&running->context, Generation(id, kLongGeneration));
    v1::GenerateResponse first;
    ASSERT_TRUE(running->reader->Read(&first));
    ASSERT_TRUE(first.has_chunk());
    running->tokens = first.chunk().token_ids_size();
  }

  ServiceProcess worker_;
  std::unique_ptr<v1::WorkerControl::Stub> control_;
  std::unique_ptr<v1::Generation::Stub> generation_;
  std::unique_ptr<v1::Decode::Stub> decode_;
  std::unique_ptr<v1::Prefill::Stub> prefill_;
};

TEST_F(WorkerSetRoleTest, IdleDecodeWorkerBecomesAPrefillWorker) {
  StartWorker("decode", "decode-0");
  v1::ReserveKvResponse reserved;
  ASSERT_TRUE(ReserveKv(&reserved).ok());
  ReleaseKv(reserved);

  const SetRoleResult r = SetRole(v1::ROLE_PREFILL, 30);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.response.previous_role(), v1::ROLE_DECODE);
  EXPECT_EQ(r.response.role(), v1::ROLE_PREFILL);
  EXPECT_EQ(r.response.drained_sequences(), 0);
  EXPECT_EQ(r.response.aborted_sequences(), 0);
  EXPECT_EQ(AwaitLoad(v1::SERVING_STATE_SERVING).role(), v1::ROLE_PREFILL);

  // Prefill works (computed and discarded without a destination)...
  grpc::ClientContext context;
  v1::PrefillRequest prefill;
  prefill.set_request_id("p1");
  for (int32_t t : {11, 22, 33, 44}) prefill.add_prompt_token_ids(t);
  auto reader = prefill_->Prefill(&context, prefill);
  v1::PrefillResponse response;
  int first_tokens = 0;
  while (reader->Read(&response)) first_tokens += response.has_first_token() ? 1 : 0;
  const grpc::Status prefilled = reader->Finish();
  EXPECT_TRUE(prefilled.ok()) << prefilled.error_message();
  EXPECT_EQ(first_tokens, 1);
  // ... and KV reservations are not this worker's business any more.
  const grpc::Status refused = ReserveKv(&reserved);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("ROLE_PREFILL"));
  EXPECT_TRUE(testing::AllKvBlocksFree(worker_));
}

TEST_F(WorkerSetRoleTest, GenerationInFlightDrainsBeforeTheSwitch) {
  StartWorker("both", "both-0");
  Running running;
  StartGeneration("long", &running);

  SetRoleResult result;
  std::thread set_role([&] { result = SetRole(v1::ROLE_DECODE, 60); });
  EXPECT_EQ(AwaitLoad(v1::SERVING_STATE_DRAINING).pending_role(), v1::ROLE_DECODE);
  // New colocated work goes elsewhere meanwhile.
  grpc::ClientContext refused_context;
  auto refused = generation_->Generate(&refused_context, Generation("late", 4));
  v1::GenerateResponse ignored;
  while (refused->Read(&ignored)) {
  }
  const grpc::Status late = refused->Finish();
  EXPECT_EQ(late.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(late.error_message(), HasSubstr("draining"));

  const grpc::Status generated = running.ReadToTheEnd();
  set_role.join();
  EXPECT_TRUE(generated.ok()) << generated.error_message();
  EXPECT_TRUE(running.completed);
  EXPECT_EQ(running.tokens, kLongGeneration);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.response.previous_role(), v1::ROLE_BOTH);
  EXPECT_EQ(result.response.role(), v1::ROLE_DECODE);
  EXPECT_EQ(result.response.drained_sequences(), 1);
  EXPECT_EQ(result.response.aborted_sequences(), 0);
  EXPECT_EQ(AwaitLoad(v1::SERVING_STATE_SERVING).role(), v1::ROLE_DECODE);
  EXPECT_TRUE(testing::AllKvBlocksFree(worker_));

  // Now a decode worker: reservations yes, colocated generations no.
  v1::ReserveKvResponse reserved;
  ASSERT_TRUE(ReserveKv(&reserved).ok());
  ReleaseKv(reserved);
  grpc::ClientContext context;
  auto after = generation_->Generate(&context, Generation("after", 4));
  while (after->Read(&ignored)) {
  }
  EXPECT_EQ(after->Finish().error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(WorkerSetRoleTest, ZeroDrainTimeoutAbortsTheGenerationAndFreesItsBlocks) {
  StartWorker("both", "both-1");
  Running running;
  StartGeneration("long", &running);

  const SetRoleResult result = SetRole(v1::ROLE_PREFILL, 0);
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.response.role(), v1::ROLE_PREFILL);
  EXPECT_EQ(result.response.drained_sequences(), 0);
  EXPECT_EQ(result.response.aborted_sequences(), 1);
  const grpc::Status aborted = running.ReadToTheEnd();
  EXPECT_EQ(aborted.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(aborted.error_message(),
              HasSubstr("switching its role from ROLE_BOTH to ROLE_PREFILL"));
  EXPECT_FALSE(running.completed);
  EXPECT_LT(running.tokens, kLongGeneration);
  EXPECT_TRUE(testing::AllKvBlocksFree(worker_));
}

}  // namespace
}  // namespace trident
