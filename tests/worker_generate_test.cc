// The worker in role `both` serves trident.v1.Generation end to end: a real
// worker process with a generated llama3-tiny model, called through gRPC.
//  - Greedy tokens equal Hugging Face's (the committed reference fixture).
//  - Streamed text deltas are valid UTF-8 and concatenate to the detokenized
//    output; stop strings end the stream before the match.
//  - Bad requests get the documented status and BadRequest field.
//  - Cancellation and Abort end the stream and free every KV block.

#include <signal.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc/status.h"
#include "common/model/generate/model_gen.h"
#include "common/process/subprocess.h"
#include "common/status/error_details.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "common/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "trident/v1/generation.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident {
namespace {

namespace v1 = ::trident::v1;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::StatusIs;
using ::trident::testing::TestTmpPath;

struct Result {
  std::vector<int32_t> tokens;
  std::vector<std::string> deltas;
  v1::GenerateComplete complete;
  absl::Status status;
  std::string text() const {
    std::string t;
    for (const auto& d : deltas) t += d;
    return t;
  }
};

class WorkerGenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new std::string(TestTmpPath("llama3-tiny"));
    auto spec = model::generate::PresetSpec("llama3-tiny");
    ASSERT_THAT(spec.status(), IsOk());
    ASSERT_THAT(model::generate::WriteModel(*spec, *model_dir_), IsOk());
    log_ = new std::string(TestTmpPath("worker.log"));
    absl::StatusOr<SpawnedProcess> spawned =
        Spawn({.argv = {RunfilePath("services/worker/worker"), "--host=127.0.0.1", "--port=0",
                        "--metrics_port=0", "--role=both", "--pin_threads=false", "--cpu_threads=2",
                        "--kv_cache_mb=16", absl::StrCat("--model=", *model_dir_)},
               .log_path = *log_,
               .wait_for_ready_line = true});
    ASSERT_THAT(spawned, IsOk());
    pid_ = spawned->pid;
    const nlohmann::json ready = nlohmann::json::parse(spawned->ready_line);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", ready["grpc_port"].get<int>()),
                                       grpc::InsecureChannelCredentials());
    generation_ = v1::Generation::NewStub(channel).release();
    control_ = v1::WorkerControl::NewStub(channel).release();
  }

  static void TearDownTestSuite() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      absl::StatusOr<ExitInfo> exit = WaitForExit(pid_, absl::Seconds(10));
      EXPECT_THAT(exit, IsOk());
      if (exit.ok()) {
        EXPECT_EQ(exit->exit_code, 0) << TailOfFile(*log_);
      }
    }
  }

  // Runs a Generate call to its end. `on_chunk` may cancel the context.
  Result Run(const v1::GenerateRequest& request,
             const std::function<void(grpc::ClientContext&, const Result&)>& on_chunk = nullptr) {
    Result result;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = generation_->Generate(&context, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      if (response.has_chunk()) {
        for (int32_t t : response.chunk().token_ids()) result.tokens.push_back(t);
        if (!response.chunk().text_delta().empty()) {
          result.deltas.push_back(response.chunk().text_delta());
        }
        if (on_chunk) on_chunk(context, result);
      } else {
        result.complete = response.complete();
      }
    }
    result.status = FromGrpcStatus(reader->Finish());
    return result;
  }

  v1::KvStats KvStats() {
    grpc::ClientContext context;
    v1::KvStats stats;
    EXPECT_TRUE(control_->GetKvStats(&context, v1::GetKvStatsRequest(), &stats).ok());
    return stats;
  }

  // The KV stats once the engine has applied every abort made so far: a
  // request that completes after them was scheduled after they took effect.
  v1::KvStats KvStatsAfterAborts() {
    v1::GenerateRequest after;
    after.set_text("x");
    after.mutable_sampling()->set_max_tokens(2);
    EXPECT_THAT(Run(after).status, IsOk());
    return KvStats();
  }

  static std::string* model_dir_;
  static std::string* log_;
  static pid_t pid_;
  static v1::Generation::Stub* generation_;
  static v1::WorkerControl::Stub* control_;
};

std::string* WorkerGenerateTest::model_dir_ = nullptr;
std::string* WorkerGenerateTest::log_ = nullptr;
pid_t WorkerGenerateTest::pid_ = -1;
v1::Generation::Stub* WorkerGenerateTest::generation_ = nullptr;
v1::WorkerControl::Stub* WorkerGenerateTest::control_ = nullptr;

TEST_F(WorkerGenerateTest, GreedyTokensEqualTransformers) {
  std::ifstream in(RunfilePath("tests/fixtures/models/llama3-tiny/reference.json"));
  const nlohmann::json ref = nlohmann::json::parse(
      std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  for (const auto& prompt : ref["prompts"]) {
    v1::GenerateRequest request;
    for (int32_t id : prompt["prompt_ids"]) request.mutable_token_ids()->add_ids(id);
    const auto greedy = prompt["greedy"].get<std::vector<int32_t>>();
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(static_cast<int32_t>(greedy.size()));
    request.mutable_stop()->set_ignore_eos(true);
    Result r = Run(request);
    ASSERT_THAT(r.status, IsOk());
    EXPECT_THAT(r.tokens, ElementsAreArray(greedy));
    EXPECT_EQ(r.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.complete.usage().completion_tokens(), static_cast<int32_t>(greedy.size()));
  }
}

TEST_F(WorkerGenerateTest, TextDeltasAreValidUtf8AndMatchDetokenize) {
  v1::GenerateRequest request;
  request.set_text("Hello, world! 你好 🌍 café");
  request.mutable_sampling()->set_max_tokens(40);
  request.mutable_sampling()->set_seed(7);
  request.mutable_sampling()->set_temperature(1.0f);
  request.mutable_stop()->set_ignore_eos(true);
  request.mutable_options()->set_text_deltas(true);
  Result r = Run(request);
  ASSERT_THAT(r.status, IsOk());
  ASSERT_EQ(r.tokens.size(), 40u);
  for (const auto& d : r.deltas) EXPECT_TRUE(tokenizer::IsValidUtf8(d)) << d;
  grpc::ClientContext context;
  v1::DetokenizeRequest detok;
  for (int32_t t : r.tokens) detok.add_token_ids(t);
  v1::DetokenizeResponse text;
  ASSERT_TRUE(generation_->Detokenize(&context, detok, &text).ok());
  EXPECT_EQ(r.text(), text.text());
  // The same seed gives the same tokens.
  Result again = Run(request);
  EXPECT_EQ(again.tokens, r.tokens);
}

TEST_F(WorkerGenerateTest, StopStringEndsTheStreamBeforeTheMatch) {
  v1::GenerateRequest request;
  request.set_text("Once upon a time");
  request.mutable_sampling()->set_max_tokens(40);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_stop()->set_ignore_eos(true);
  request.mutable_options()->set_text_deltas(true);
  Result full = Run(request);
  ASSERT_THAT(full.status, IsOk());
  const std::string text = full.text();
  ASSERT_GE(text.size(), 12u);
  // A stop string from the middle of the output, likely spanning tokens.
  const std::string stop = text.substr(text.size() / 2, 3);
  request.mutable_stop()->add_stop_strings(stop);
  Result stopped = Run(request);
  ASSERT_THAT(stopped.status, IsOk());
  EXPECT_EQ(stopped.complete.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(stopped.complete.stop_string(), stop);
  EXPECT_EQ(stopped.text(), text.substr(0, text.find(stop)));
  // The match aborted the sequence before the stream ended.
  const v1::KvStats stats = KvStatsAfterAborts();
  EXPECT_EQ(stats.blocks_free(), stats.blocks_total());
}

TEST_F(WorkerGenerateTest, BadRequestsGetTheDocumentedStatus) {
  v1::GenerateRequest bad_token;
  bad_token.mutable_token_ids()->add_ids(1);
  bad_token.mutable_token_ids()->add_ids(1 << 20);
  Result r = Run(bad_token);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(GetBadRequestField(r.status), "token_ids.ids[1]");

  v1::GenerateRequest hot;
  hot.set_text("hi");
  hot.mutable_sampling()->set_temperature(3);
  r = Run(hot);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(GetBadRequestField(r.status), "sampling.temperature");

  v1::GenerateRequest no_prompt;
  r = Run(no_prompt);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(GetBadRequestField(r.status), "prompt");

  v1::GenerateRequest too_long;
  for (int i = 0; i < 5000; ++i) too_long.mutable_token_ids()->add_ids(5);
  r = Run(too_long);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInvalidArgument));

  v1::GenerateRequest other_model;
  other_model.set_model("no-such-model");
  other_model.set_text("hi");
  r = Run(other_model);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such-model")));

  v1::GenerateRequest bad_id;
  bad_id.set_request_id("has space");
  bad_id.set_text("hi");
  r = Run(bad_id);
  EXPECT_EQ(GetBadRequestField(r.status), "request_id");
  EXPECT_EQ(KvStats().blocks_free(), KvStats().blocks_total());
}

TEST_F(WorkerGenerateTest, CancelAndAbortEndTheStreamAndFreeEveryBlock) {
  v1::GenerateRequest request;
  request.set_text("A long story:");
  request.mutable_sampling()->set_max_tokens(1500);
  request.mutable_stop()->set_ignore_eos(true);
  Result cancelled = Run(request, [](grpc::ClientContext& context, const Result& so_far) {
    if (so_far.tokens.size() == 3) context.TryCancel();
  });
  EXPECT_THAT(cancelled.status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_LT(cancelled.tokens.size(), 1500u);

  request.set_request_id("abort-me");
  Result aborted = Run(request, [this](grpc::ClientContext&, const Result& so_far) {
    if (so_far.tokens.size() != 2) return;
    grpc::ClientContext context;
    v1::AbortRequest abort;
    abort.set_request_id("abort-me");
    v1::AbortResponse response;
    EXPECT_TRUE(generation_->Abort(&context, abort, &response).ok());
    EXPECT_TRUE(response.aborted());
  });
  ASSERT_THAT(aborted.status, IsOk());
  EXPECT_EQ(aborted.complete.finish_reason(), v1::FINISH_REASON_ABORT);
  EXPECT_LT(aborted.tokens.size(), 1500u);

  // After both aborts took effect, so the counts are final.
  const v1::KvStats stats = KvStatsAfterAborts();
  EXPECT_GT(stats.blocks_total(), 0);
  EXPECT_EQ(stats.blocks_free(), stats.blocks_total());
  EXPECT_EQ(stats.sequences(), 0);
}

}  // namespace
}  // namespace trident

namespace trident {
namespace {

// WorkerControl.GetLoad streams samples: the first at once, then one per
// interval, with the engine's figures; a bad interval is INVALID_ARGUMENT
// naming it; cancelling ends the stream with CANCELLED.
TEST_F(WorkerGenerateTest, GetLoadStreamsSamplesUntilCancelled) {
  grpc::ClientContext context;
  v1::GetLoadRequest request;
  request.mutable_interval()->set_nanos(20'000'000);
  auto reader = control_->GetLoad(&context, request);
  v1::WorkerLoad previous;
  for (int i = 0; i < 3; ++i) {
    v1::WorkerLoad load;
    ASSERT_TRUE(reader->Read(&load)) << "sample " << i;
    EXPECT_FALSE(load.worker_id().empty());
    EXPECT_NE(load.incarnation(), 0u);
    EXPECT_EQ(load.role(), v1::ROLE_BOTH);
    EXPECT_EQ(load.state(), v1::SERVING_STATE_SERVING);
    EXPECT_GT(load.kv_blocks_total(), 0);
    EXPECT_EQ(load.kv_blocks_free() + load.kv_blocks_used(), load.kv_blocks_total());
    if (i > 0) {
      EXPECT_EQ(load.incarnation(), previous.incarnation());
      const int64_t t = load.sample_time().seconds() * 1000000000LL + load.sample_time().nanos();
      const int64_t p =
          previous.sample_time().seconds() * 1000000000LL + previous.sample_time().nanos();
      EXPECT_GE(t - p, 10'000'000) << "samples closer than the interval allows";
    }
    previous = load;
  }
  context.TryCancel();
  v1::WorkerLoad ignored;
  while (reader->Read(&ignored)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);

  grpc::ClientContext bad_context;
  v1::GetLoadRequest bad;
  bad.mutable_interval()->set_nanos(1'000'000);
  auto bad_reader = control_->GetLoad(&bad_context, bad);
  while (bad_reader->Read(&ignored)) {
  }
  const grpc::Status status = bad_reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("interval"));
}

}  // namespace
}  // namespace trident
