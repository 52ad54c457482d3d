#include "services/router/load_subscriber.h"

#include <atomic>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/worker/load_streams.h"
#include "services/worker/worker_services.h"

namespace trident::router {
namespace {

namespace v1 = ::trident::v1;

// A worker's WorkerControl with load streams whose samples count up.
struct FakeWorker {
  explicit FakeWorker(int port_wanted = 0)
      : loads([this] {
          v1::WorkerLoad load;
          load.set_worker_id("w1");
          load.set_running_sequences(samples.fetch_add(1));
          return load;
        }),
        control(nullptr, &loads) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port_wanted),
                             grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&control);
    server = builder.BuildAndStart();
  }
  // Cancels the open load streams at once (they never end by themselves).
  ~FakeWorker() { server->Shutdown(std::chrono::system_clock::now()); }

  std::atomic<int> samples{0};
  worker::LoadStreams loads;
  worker::WorkerControlService control;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(LoadSubscriberTest, DeliversSamplesReportsAnOutageAndReconnects) {
  auto worker = std::make_unique<FakeWorker>();
  ASSERT_NE(worker->server, nullptr);
  const int port = worker->port;
  absl::Mutex mu;
  int loads = 0;
  int downs = 0;
  std::string last_worker_id;
  LoadCallbacks callbacks;
  callbacks.on_load = [&](const std::string& address, const v1::WorkerLoad& load) {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(address, absl::StrCat("127.0.0.1:", port));
    last_worker_id = load.worker_id();
    ++loads;
  };
  callbacks.on_down = [&](const std::string&, const absl::Status& why) {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(why.ok());
    ++downs;
  };
  LoadSubscriberOptions options;
  options.interval = absl::Milliseconds(10);
  options.retry = absl::Milliseconds(20);
  LoadSubscriber subscriber({absl::StrCat("127.0.0.1:", port)}, callbacks, options);
  {
    absl::MutexLock lock(&mu);
    auto three = [&]() { return loads >= 3; };
    mu.Await(absl::Condition(&three));
    EXPECT_EQ(last_worker_id, "w1");
    EXPECT_EQ(downs, 0);
  }
  worker.reset();  // the worker goes away
  {
    absl::MutexLock lock(&mu);
    auto down = [&]() { return downs >= 1; };
    mu.Await(absl::Condition(&down));
  }
  // It comes back on the same port: samples flow again, with one outage
  // reported for the whole time it was gone.
  worker = std::make_unique<FakeWorker>(port);
  ASSERT_NE(worker->server, nullptr);
  int before;
  {
    absl::MutexLock lock(&mu);
    before = loads;
  }
  {
    absl::MutexLock lock(&mu);
    auto more = [&]() { return loads >= before + 3; };
    mu.Await(absl::Condition(&more));
    EXPECT_EQ(downs, 1);
  }
}

}  // namespace
}  // namespace trident::router
