#include "tools/cli/generate.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/time/proto_time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident::cli {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;
using ::testing::Not;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

v1::GenerateComplete Complete() {
  v1::GenerateComplete c;
  c.set_request_id("gen-1");
  c.set_finish_reason(v1::FINISH_REASON_LENGTH);
  c.mutable_usage()->set_prompt_tokens(10);
  c.mutable_usage()->set_completion_tokens(5);
  return c;
}

TEST(FormatCompletionTest, PrintsPlacementAndEveryTimingThatIsSet) {
  v1::GenerateComplete c = Complete();
  c.mutable_placement()->set_prefill_worker_id("worker-0");
  c.mutable_placement()->set_decode_worker_id("worker-1");
  SetProtoDuration(absl::Microseconds(200), c.mutable_timings()->mutable_queued());
  SetProtoDuration(absl::Milliseconds(3), c.mutable_timings()->mutable_prefill());
  SetProtoDuration(absl::Microseconds(1500), c.mutable_timings()->mutable_kv_transfer());
  SetProtoDuration(absl::Milliseconds(5), c.mutable_timings()->mutable_time_to_first_token());
  SetProtoDuration(absl::Milliseconds(2), c.mutable_timings()->mutable_time_per_output_token());
  SetProtoDuration(absl::Milliseconds(8), c.mutable_timings()->mutable_decode());
  EXPECT_EQ(FormatCompletion(c),
            "[gen-1: 10 prompt tokens, 5 generated, finish length, 500.0 tokens/s decode]\n"
            "[placement: prefill worker-0, decode worker-1]\n"
            "[timings: queued 0.2 ms, prefill 3.0 ms, kv_transfer 1.5 ms, "
            "time_to_first_token 5.0 ms, time_per_output_token 2.0 ms]\n");
}

TEST(FormatCompletionTest, LeavesOutWhatIsNotSet) {
  EXPECT_EQ(FormatCompletion(Complete()),
            "[gen-1: 10 prompt tokens, 5 generated, finish length]\n");
  v1::GenerateComplete c = Complete();
  c.mutable_placement()->set_decode_worker_id("worker-1");
  SetProtoDuration(absl::ZeroDuration(), c.mutable_timings()->mutable_kv_transfer());
  const std::string text = FormatCompletion(c);
  EXPECT_THAT(text, HasSubstr("[placement: decode worker-1]\n"));
  // Set to zero is still set; unset fields are not named.
  EXPECT_THAT(text, HasSubstr("[timings: kv_transfer 0.0 ms]\n"));
  EXPECT_THAT(text, Not(HasSubstr("prefill")));
}

TEST(FormatCompletionTest, NamesAnError) {
  v1::GenerateComplete c = Complete();
  c.set_finish_reason(v1::FINISH_REASON_ERROR);
  c.set_error_message("worker-1 lost");
  EXPECT_THAT(FormatCompletion(c), HasSubstr("finish error, error: worker-1 lost"));
}

// Streams `chunks`, then `complete` if set, then OK.
class FakeGeneration final : public v1::Generation::CallbackService {
 public:
  FakeGeneration(std::vector<std::string> chunks, bool complete)
      : chunks_(std::move(chunks)), complete_(complete) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext*, const v1::GenerateRequest* request) override {
    class Reactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
     public:
      explicit Reactor(std::vector<v1::GenerateResponse> responses)
          : responses_(std::move(responses)) {
        Next();
      }
      void OnWriteDone(bool ok) override {
        if (!ok) return Finish(grpc::Status::CANCELLED);
        Next();
      }
      void OnDone() override { delete this; }

     private:
      void Next() {
        if (next_ == responses_.size()) return Finish(grpc::Status::OK);
        StartWrite(&responses_[next_++]);
      }
      std::vector<v1::GenerateResponse> responses_;
      size_t next_ = 0;
    };
    std::vector<v1::GenerateResponse> responses;
    for (size_t i = 0; i < chunks_.size(); ++i) {
      v1::TokenChunk* chunk = responses.emplace_back().mutable_chunk();
      chunk->set_text_delta(chunks_[i]);
      chunk->add_token_ids(static_cast<int32_t>(i));
    }
    if (complete_) {
      v1::GenerateComplete* c = responses.emplace_back().mutable_complete();
      c->set_request_id(request->text());
      c->mutable_usage()->set_completion_tokens(static_cast<int32_t>(chunks_.size()));
    }
    return new Reactor(std::move(responses));
  }

 private:
  const std::vector<std::string> chunks_;
  const bool complete_;
};

struct FakeServer {
  explicit FakeServer(FakeGeneration* service) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service);
    server = builder.BuildAndStart();
  }
  ~FakeServer() { server->Shutdown(std::chrono::system_clock::now()); }

  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(StreamGenerationTest, CollectsTextTokensAndTheFinalMessage) {
  FakeGeneration service({"Once", " upon"}, /*complete=*/true);
  FakeServer server(&service);
  ASSERT_NE(server.server, nullptr);
  absl::StatusOr<GenerateSummary> summary = StreamGeneration(
      {.address = absl::StrCat("127.0.0.1:", server.port), .prompt = "p"}, nullptr);
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->text, "Once upon");
  EXPECT_EQ(summary->tokens, 2);
  EXPECT_EQ(summary->complete.request_id(), "p");
}

TEST(StreamGenerationTest, AStreamWithoutItsFinalMessageIsAnError) {
  FakeGeneration service({"Once"}, /*complete=*/false);
  FakeServer server(&service);
  ASSERT_NE(server.server, nullptr);
  EXPECT_THAT(StreamGeneration({.address = absl::StrCat("127.0.0.1:", server.port)}, nullptr),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("GenerateComplete")));
}

}  // namespace
}  // namespace trident::cli
