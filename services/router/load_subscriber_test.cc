#include "services/router/load_subscriber.h"

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

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
  explicit FakeWorker(int port_wanted = 0, std::string id = "w1")
      : worker_id(std::move(id)),
        loads([this] {
          v1::WorkerLoad load;
          load.set_worker_id(worker_id);
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

  std::string address() const { return absl::StrCat("127.0.0.1:", port); }

  const std::string worker_id;
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

// What the callbacks saw, by address.
struct Seen {
  absl::Mutex mu;
  std::map<std::string, int> loads ABSL_GUARDED_BY(mu);
  std::map<std::string, std::vector<absl::StatusCode>> downs ABSL_GUARDED_BY(mu);
  // Loads of an address counted when its first down arrived.
  std::map<std::string, int> loads_at_down ABSL_GUARDED_BY(mu);

  LoadCallbacks callbacks() {
    LoadCallbacks callbacks;
    callbacks.on_load = [this](const std::string& address, const v1::WorkerLoad&) {
      absl::MutexLock lock(&mu);
      ++loads[address];
    };
    callbacks.on_down = [this](const std::string& address, const absl::Status& why) {
      absl::MutexLock lock(&mu);
      if (downs[address].empty()) loads_at_down[address] = loads[address];
      downs[address].push_back(why.code());
    };
    return callbacks;
  }

  // Waits until `address` has delivered at least `n` loads in all.
  bool AwaitLoads(const std::string& address, int n) {
    absl::MutexLock lock(&mu);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return loads[address] >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }
  int LoadsOf(const std::string& address) {
    absl::MutexLock lock(&mu);
    return loads[address];
  }
};

TEST(LoadSubscriberTest, SetAddressesStartsNewStreamsAndRetiresRemovedOnes) {
  FakeWorker one(0, "w1");
  FakeWorker two(0, "w2");
  ASSERT_NE(one.server, nullptr);
  ASSERT_NE(two.server, nullptr);
  Seen seen;
  LoadSubscriberOptions options;
  options.interval = absl::Milliseconds(10);
  options.retry = absl::Milliseconds(20);
  LoadSubscriber subscriber({}, seen.callbacks(), options);
  EXPECT_TRUE(subscriber.addresses().empty());

  subscriber.SetAddresses({one.address()});
  ASSERT_TRUE(seen.AwaitLoads(one.address(), 2));
  subscriber.SetAddresses({one.address(), two.address(), two.address()});
  ASSERT_TRUE(seen.AwaitLoads(two.address(), 2));
  EXPECT_EQ(subscriber.addresses().size(), 2u);

  subscriber.SetAddresses({two.address()});

  // Removed: reported down once, as no longer wanted, and silent after.
  EXPECT_EQ(subscriber.addresses(), std::vector<std::string>{two.address()});
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.downs[one.address()],
              std::vector<absl::StatusCode>{absl::StatusCode::kCancelled});
    EXPECT_TRUE(seen.downs[two.address()].empty());
  }
  const int one_loads = seen.LoadsOf(one.address());
  ASSERT_TRUE(seen.AwaitLoads(two.address(), seen.LoadsOf(two.address()) + 3));
  EXPECT_EQ(seen.LoadsOf(one.address()), one_loads);
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.loads_at_down[one.address()], one_loads);
  }

  // Added again: followed again.
  subscriber.SetAddresses({one.address(), two.address()});
  ASSERT_TRUE(seen.AwaitLoads(one.address(), one_loads + 2));
}

}  // namespace
}  // namespace trident::router
