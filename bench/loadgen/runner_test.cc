// RunLoad against an in-process fake Generation server on localhost: what
// the requests carry, and how rejections with RetryInfo come back through
// real gRPC into the report.

#include "bench/loadgen/runner.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"
#include "common/grpc/reactors.h"
#include "common/grpc/server.h"
#include "common/grpc/status.h"
#include "common/status/error_details.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident::loadgen {
namespace {

namespace v1 = ::trident::v1;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::Each;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::Lt;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr uint64_t kSeed = 314159;

// Streams one chunk per token (token id 7), then `complete`, then OK.
class StreamTokens final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit StreamTokens(int32_t num_tokens) {
    for (int32_t i = 0; i < num_tokens; ++i) {
      responses_.emplace_back().mutable_chunk()->add_token_ids(7);
    }
    v1::GenerateComplete* complete = responses_.emplace_back().mutable_complete();
    complete->set_finish_reason(v1::FINISH_REASON_LENGTH);
    complete->mutable_usage()->set_completion_tokens(num_tokens);
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (next_ == responses_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&responses_[next_++]);
  }

  std::deque<v1::GenerateResponse> responses_;
  size_t next_ = 0;
};

// Serves class "interactive" and rejects class "batch" with
// RESOURCE_EXHAUSTED and a RetryInfo of 1.5 s, as the router's admission
// control does. Records every request. Thread-safe.
class FakeGeneration final : public v1::Generation::CallbackService {
 public:
  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override {
    {
      absl::MutexLock lock(&mu_);
      requests_.push_back(*request);
    }
    if (request->qos_class() == "batch") {
      const int64_t target_ms =
          request->slo().ttft().seconds() * 1000 + request->slo().ttft().nanos() / 1'000'000;
      return new FinishedWriteReactor<v1::GenerateResponse>(ResourceExhaustedWithRetry(
          absl::StrCat("predicted TTFT ", 200 + request->token_ids().ids_size(),
                       " ms exceeds the target ", target_ms, " ms"),
          absl::Milliseconds(1500)));
    }
    return new StreamTokens(request->sampling().max_tokens());
  }

  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* context,
                                      const v1::ModelInfoRequest* request,
                                      v1::ModelInfoResponse* response) override {
    response->set_model("fake");
    response->set_vocab_size(50);
    response->set_max_context_tokens(64);
    response->set_bos_token_id(2);
    response->add_eos_token_ids(0);
    response->add_eos_token_ids(1);
    for (const char* name : {"interactive", "batch"}) response->add_qos_classes()->set_name(name);
    return FinishUnary(context, absl::OkStatus());
  }

  std::vector<v1::GenerateRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::GenerateRequest> requests_ ABSL_GUARDED_BY(mu_);
};

class RunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::printf("seed=%llu\n", static_cast<unsigned long long>(kSeed));
    absl::StatusOr<std::unique_ptr<GrpcServer>> server =
        GrpcServer::Start({.host = "127.0.0.1", .port = 0}, {{&service_, "trident.v1.Generation"}});
    ASSERT_THAT(server, IsOk());
    server_ = *std::move(server);
  }
  void TearDown() override {
    if (server_) server_->Drain(absl::Now());
  }

  RunOptions Options(const std::string& qos) {
    RunOptions options;
    options.target = absl::StrCat("127.0.0.1:", server_->port());
    options.print_progress = false;
    options.request_timeout = absl::Seconds(60);
    WorkloadSpec& w = options.workload;
    w.seed = kSeed;
    w.arrival = {.kind = ArrivalKind::kPoisson, .rate_per_s = 400};
    w.num_requests = 40;
    w.prompt_tokens = *ParseLengthDistribution("uniform:1:20", LengthColumn::kPrompt, "p");
    w.output_tokens = *ParseLengthDistribution("uniform:1:5", LengthColumn::kOutput, "o");
    w.qos = *ParseQosMix(qos, SloTargets{});
    return options;
  }

  FakeGeneration service_;
  std::unique_ptr<GrpcServer> server_;
};

TEST_F(RunnerTest, RejectionsWithRetryInfoAreGroupedAndTimed) {
  absl::StatusOr<RunResult> result =
      RunLoad(Options("interactive:0.5:ttft=5000:tpot=1000,batch:0.5:ttft=100"));
  ASSERT_THAT(result, IsOk());
  const Report& report = result->report;
  int64_t batch = 0;
  for (const RequestRecord& r : result->records) {
    SCOPED_TRACE(absl::StrCat("request ", r.planned.index));
    if (r.planned.qos_class == "batch") {
      ++batch;
      EXPECT_EQ(OutcomeOf(r), Outcome::kRejected);
      EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kResourceExhausted));
      EXPECT_EQ(GetRetryDelay(r.status), absl::Milliseconds(1500));
      EXPECT_GE(r.end, r.sent);
    } else {
      EXPECT_EQ(OutcomeOf(r), Outcome::kCompleted);
      EXPECT_EQ(r.tokens_received(), r.planned.output_tokens);
    }
  }
  ASSERT_GT(batch, 5);
  ASSERT_LT(batch, 35);
  EXPECT_EQ(report.num_rejected, batch);
  EXPECT_EQ(report.num_completed, 40 - batch);
  EXPECT_EQ(report.rejections_by_code.at("RESOURCE_EXHAUSTED"), batch);
  ASSERT_EQ(report.rejections.size(), 1u);
  EXPECT_EQ(report.rejections[0].reason, "predicted TTFT # ms exceeds the target # ms");
  EXPECT_EQ(report.rejections[0].with_retry_info, batch);
  EXPECT_DOUBLE_EQ(report.rejections[0].retry_delay.p50_ms, 1500);
  EXPECT_EQ(report.rejections[0].time_to_reject.count, batch);
  EXPECT_LE(report.rejections[0].time_to_reject.p50_ms, report.rejections[0].time_to_reject.p99_ms);
  EXPECT_EQ(report.per_class.at("batch").rejected, batch);
  EXPECT_FALSE(report.per_class.at("batch").slo_attainment.has_value());
  // Attainment counts accepted requests only.
  EXPECT_LE(report.num_slo_met, report.num_completed);
  EXPECT_EQ(result->json["rejections"]["groups"][0]["with_retry_info"].get<int64_t>(), batch);
}

TEST_F(RunnerTest, RequestsAskForExactLengthsWithTheirClassAndTargets) {
  RunOptions options = Options("interactive:1:ttft=250:tpot=40");
  absl::StatusOr<RunResult> result = RunLoad(options);
  ASSERT_THAT(result, IsOk());
  absl::StatusOr<std::vector<PlannedRequest>> schedule = GenerateSchedule(options.workload);
  ASSERT_THAT(schedule, IsOk());
  std::vector<v1::GenerateRequest> seen = service_.requests();
  ASSERT_EQ(seen.size(), 40u);
  std::sort(seen.begin(), seen.end(),
            [](const auto& a, const auto& b) { return a.sampling().seed() < b.sampling().seed(); });
  std::vector<PlannedRequest> planned = *schedule;
  std::sort(planned.begin(), planned.end(),
            [](const auto& a, const auto& b) { return a.prompt_seed < b.prompt_seed; });
  for (size_t i = 0; i < seen.size(); ++i) {
    const v1::GenerateRequest& r = seen[i];
    SCOPED_TRACE(absl::StrCat("request with seed ", r.sampling().seed()));
    EXPECT_EQ(r.sampling().seed(), planned[i].prompt_seed);
    EXPECT_EQ(r.prompt_case(), v1::GenerateRequest::kTokenIds);
    EXPECT_EQ(r.token_ids().ids_size(), planned[i].prompt_tokens);
    // No special tokens (BOS 2, EOS 0 and 1) and nothing outside the vocabulary.
    EXPECT_THAT(r.token_ids().ids(), Each(AllOf(Ge(3), Lt(50))));
    EXPECT_EQ(r.sampling().max_tokens(), planned[i].output_tokens);
    EXPECT_TRUE(r.stop().ignore_eos());
    EXPECT_EQ(r.qos_class(), "interactive");
    EXPECT_EQ(r.slo().ttft().nanos(), 250'000'000);
    EXPECT_EQ(r.slo().tpot().nanos(), 40'000'000);
  }
  EXPECT_EQ(result->report.num_completed, 40);
}

TEST_F(RunnerTest, RefusesWorkloadsTheServerCannotTake) {
  RunOptions unknown_class = Options("premium");
  EXPECT_THAT(RunLoad(unknown_class),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("premium")));
  RunOptions too_long = Options("");
  too_long.workload.prompt_tokens =
      *ParseLengthDistribution("fixed:60", LengthColumn::kPrompt, "p");
  too_long.workload.output_tokens = *ParseLengthDistribution("fixed:5", LengthColumn::kOutput, "o");
  EXPECT_THAT(RunLoad(too_long),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_context_tokens 64")));
  EXPECT_TRUE(service_.requests().empty());
}

TEST(RunnerNoServerTest, UnreachableTargetFailsWithinTheConnectTimeout) {
  RunOptions options;
  options.target = "127.0.0.1:1";  // Nothing listens on port 1.
  options.connect_timeout = absl::Milliseconds(300);
  options.print_progress = false;
  options.workload.num_requests = 1;
  options.workload.prompt_tokens = *ParseLengthDistribution("fixed:1", LengthColumn::kPrompt, "p");
  options.workload.output_tokens = *ParseLengthDistribution("fixed:1", LengthColumn::kOutput, "o");
  options.workload.qos = {QosClassSpec{}};
  EXPECT_THAT(RunLoad(options),
              StatusIs(AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kUnavailable),
                       HasSubstr("127.0.0.1:1")));
}

}  // namespace
}  // namespace trident::loadgen
