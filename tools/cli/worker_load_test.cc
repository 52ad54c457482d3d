#include "tools/cli/worker_load.h"

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::cli {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

v1::WorkerLoad DecodeLoad() {
  v1::WorkerLoad load;
  load.set_worker_id("worker-1");
  load.set_role(v1::ROLE_DECODE);
  load.set_state(v1::SERVING_STATE_SERVING);
  load.set_running_sequences(3);
  load.set_waiting_sequences(2);
  load.set_kv_blocks_used(25);
  load.set_kv_blocks_free(75);
  load.set_kv_blocks_total(100);
  return load;
}

// Sends `load` once and keeps the stream open until the client cancels it,
// as a worker's load stream does; with `load` unset, ends the stream with
// `status` instead.
class FakeWorkerControl final : public v1::WorkerControl::CallbackService {
 public:
  explicit FakeWorkerControl(std::optional<v1::WorkerLoad> load,
                             grpc::Status status = grpc::Status::OK)
      : load_(std::move(load)), status_(std::move(status)) {}

  grpc::ServerWriteReactor<v1::WorkerLoad>* GetLoad(grpc::CallbackServerContext*,
                                                    const v1::GetLoadRequest*) override {
    class Reactor final : public grpc::ServerWriteReactor<v1::WorkerLoad> {
     public:
      Reactor(const std::optional<v1::WorkerLoad>& load, const grpc::Status& status)
          : load_(load.value_or(v1::WorkerLoad())) {
        if (load.has_value()) {
          StartWrite(&load_);
        } else {
          Finish(status);
        }
      }
      void OnWriteDone(bool) override {}
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }

     private:
      v1::WorkerLoad load_;
    };
    return new Reactor(load_, status_);
  }

 private:
  const std::optional<v1::WorkerLoad> load_;
  const grpc::Status status_;
};

// An in-process gRPC server on a port the system picks.
struct FakeWorker {
  explicit FakeWorker(std::optional<v1::WorkerLoad> load, grpc::Status status = grpc::Status::OK)
      : service(std::move(load), std::move(status)) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~FakeWorker() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }

  FakeWorkerControl service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(SummarizeWorkerLoadTest, NamesRoleAndStateAndComputesKvUsage) {
  const WorkerLoadSummary summary = SummarizeWorkerLoad(DecodeLoad());
  EXPECT_EQ(summary.worker_id, "worker-1");
  EXPECT_EQ(summary.role, "decode");
  EXPECT_EQ(summary.pending_role, "");
  EXPECT_EQ(summary.state, "serving");
  EXPECT_EQ(summary.running_sequences, 3);
  EXPECT_EQ(summary.waiting_sequences, 2);
  EXPECT_DOUBLE_EQ(summary.kv_cache_usage_ratio, 0.25);
}

TEST(SummarizeWorkerLoadTest, ShowsARoleChangeInProgressAndAnEmptyPool) {
  v1::WorkerLoad load;
  load.set_role(v1::ROLE_BOTH);
  load.set_pending_role(v1::ROLE_PREFILL);
  load.set_state(v1::SERVING_STATE_DRAINING);
  const WorkerLoadSummary summary = SummarizeWorkerLoad(load);
  EXPECT_EQ(summary.role, "both");
  EXPECT_EQ(summary.pending_role, "prefill");
  EXPECT_EQ(summary.state, "draining");
  EXPECT_EQ(summary.kv_cache_usage_ratio, 0);
}

TEST(ReadWorkerLoadTest, ReadsTheFirstSampleAndEndsTheStream) {
  FakeWorker worker(DecodeLoad());
  ASSERT_NE(worker.server, nullptr);
  absl::StatusOr<WorkerLoadSummary> summary = ReadWorkerLoad(worker.address());
  ASSERT_THAT(summary, IsOk());
  EXPECT_EQ(summary->role, "decode");
  EXPECT_EQ(summary->running_sequences, 3);
}

TEST(ReadWorkerLoadTest, ReturnsTheWorkersError) {
  FakeWorker worker(std::nullopt, grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down"));
  ASSERT_NE(worker.server, nullptr);
  EXPECT_THAT(ReadWorkerLoad(worker.address()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
}

TEST(ReadWorkerLoadTest, AStreamEndingEmptyIsUnavailable) {
  FakeWorker worker(std::nullopt);
  ASSERT_NE(worker.server, nullptr);
  EXPECT_THAT(ReadWorkerLoad(worker.address()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("ended empty")));
}

TEST(ReadWorkerLoadTest, NoWorkerListeningIsAnError) {
  int port = 0;
  {
    FakeWorker gone(DecodeLoad());
    port = gone.port;
  }
  EXPECT_FALSE(ReadWorkerLoad(absl::StrCat("127.0.0.1:", port), absl::Milliseconds(500)).ok());
}

}  // namespace
}  // namespace trident::cli
