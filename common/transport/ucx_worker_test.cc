#include "common/transport/ucx_worker.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Generous: only a hang ever reaches it.
constexpr absl::Duration kDeadline = absl::Seconds(60);

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// Collects one completion.
class Done {
 public:
  DoneCallback callback() {
    return [this](absl::Status status) {
      status_ = std::move(status);
      done_.Notify();
    };
  }
  // The status, or DEADLINE_EXCEEDED if the callback never ran.
  absl::Status Wait() {
    if (!done_.WaitForNotificationWithTimeout(kDeadline)) {
      return absl::DeadlineExceededError("callback did not run");
    }
    return status_;
  }

 private:
  absl::Notification done_;
  absl::Status status_;
};

absl::Status FlushAndWait(Endpoint& endpoint) {
  Done done;
  endpoint.Flush(done.callback());
  return done.Wait();
}

absl::StatusOr<std::unique_ptr<UcxWorker>> MakeWorker(const std::string& transports,
                                                      const std::string& name) {
  return UcxWorker::Create({.transports = transports, .name = name});
}

// A writer worker connected to a target worker that registered `target_bytes`.
struct Link {
  // First, so that it is freed last: after the workers, whose progress
  // threads may still be delivering a put into it when a test ends.
  std::vector<uint8_t> target_memory;
  std::unique_ptr<UcxWorker> target;
  std::unique_ptr<UcxWorker> writer;
  std::unique_ptr<MemoryRegion> region;
  std::shared_ptr<Endpoint> endpoint;
  std::shared_ptr<RemoteKey> rkey;

  uint64_t remote(size_t offset) const {
    return reinterpret_cast<uint64_t>(target_memory.data()) + offset;
  }
};

class UcxWorkerTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Sets up a Link over GetParam(); skips the test if this machine's UCX
  // lacks the transport.
  void SetUp() override {
    auto target = MakeWorker(GetParam(), "target");
    if (!target.ok()) {
      GTEST_SKIP() << "UCX transport '" << GetParam()
                   << "' is not usable here: " << target.status();
    }
    link_.target = *std::move(target);
    auto writer = MakeWorker(GetParam(), "writer");
    ASSERT_THAT(writer, IsOk());
    link_.writer = *std::move(writer);
    link_.target_memory.assign(kTargetBytes, 0);
    auto region =
        link_.target->Register(link_.target_memory.data(), kTargetBytes, MemoryKind::kHost);
    ASSERT_THAT(region, IsOk());
    link_.region = *std::move(region);
    auto endpoint = link_.writer->Connect(link_.target->address(), "target");
    if (!endpoint.ok() && absl::IsUnavailable(endpoint.status())) {
      GTEST_SKIP() << "UCX transport '" << GetParam()
                   << "' cannot connect here: " << endpoint.status();
    }
    ASSERT_THAT(endpoint, IsOk());
    link_.endpoint = *std::move(endpoint);
    auto rkey = link_.endpoint->UnpackRkey(link_.region->packed_rkey());
    ASSERT_THAT(rkey, IsOk());
    link_.rkey = *std::move(rkey);
  }

  static constexpr size_t kTargetBytes = 4 << 20;
  Link link_;
};

TEST_P(UcxWorkerTransportTest, PutBytesAreVisibleAfterFlush) {
  const uint32_t seed = 20240611;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<uint8_t> source = RandomBytes(kTargetBytes, seed);
  std::vector<uint8_t> expected(kTargetBytes, 0);
  // (offset, length): a single byte, an unaligned middle piece, a large tail.
  const std::vector<std::pair<size_t, size_t>> pieces = {
      {0, 1}, {4097, 100'003}, {kTargetBytes - (3 << 20), 3 << 20}};
  for (const auto& [offset, length] : pieces) {
    Done done;
    link_.endpoint->Put(source.data() + offset, length, link_.remote(offset), link_.rkey,
                        done.callback());
    ASSERT_THAT(done.Wait(), IsOk());
    std::memcpy(expected.data() + offset, source.data() + offset, length);
  }
  ASSERT_THAT(FlushAndWait(*link_.endpoint), IsOk());
  EXPECT_TRUE(link_.target_memory == expected);
  EXPECT_FALSE(link_.endpoint->failed());
}

TEST_P(UcxWorkerTransportTest, ManyConcurrentPutsFromSeveralThreadsAllLand) {
  const uint32_t seed = 7;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int kThreads = 4;
  constexpr int kPutsPerThread = 256;
  constexpr size_t kSlot = kTargetBytes / (kThreads * kPutsPerThread);
  const std::vector<uint8_t> source = RandomBytes(kTargetBytes, seed);

  absl::Mutex mu;
  int completed = 0;
  std::vector<absl::Status> errors;
  absl::Notification all_done;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPutsPerThread; ++i) {
        const size_t offset = (t * kPutsPerThread + i) * kSlot;
        link_.endpoint->Put(source.data() + offset, kSlot, link_.remote(offset), link_.rkey,
                            [&](absl::Status status) {
                              absl::MutexLock lock(&mu);
                              if (!status.ok()) errors.push_back(status);
                              if (++completed == kThreads * kPutsPerThread) all_done.Notify();
                            });
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(kDeadline));
  EXPECT_THAT(errors, ::testing::IsEmpty());
  ASSERT_THAT(FlushAndWait(*link_.endpoint), IsOk());
  EXPECT_TRUE(link_.target_memory == source);
}

TEST_P(UcxWorkerTransportTest, FlushWithNothingOutstandingSucceeds) {
  EXPECT_THAT(FlushAndWait(*link_.endpoint), IsOk());
}

TEST_P(UcxWorkerTransportTest, LaneNamesTheTransport) {
  EXPECT_EQ(link_.endpoint->lane(), GetParam());
}

TEST_P(UcxWorkerTransportTest, CallbacksMayCallBlockingMethodsInline) {
  // A completion callback runs on the progress thread; UnpackRkey there runs
  // inline instead of waiting on itself.
  const std::vector<uint8_t> source = RandomBytes(64, 1);
  absl::Notification done;
  absl::StatusOr<std::shared_ptr<RemoteKey>> rkey;
  bool on_progress_thread = false;
  link_.endpoint->Put(source.data(), source.size(), link_.remote(0), link_.rkey,
                      [&](absl::Status status) {
                        on_progress_thread = link_.writer->OnProgressThread();
                        rkey = link_.endpoint->UnpackRkey(link_.region->packed_rkey());
                        done.Notify();
                      });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kDeadline));
  EXPECT_TRUE(on_progress_thread);
  EXPECT_THAT(rkey, IsOk());
  EXPECT_FALSE(link_.writer->OnProgressThread());
}

TEST_P(UcxWorkerTransportTest, DestroyingTheWriterCompletesEveryOutstandingPutOnce) {
  const std::vector<uint8_t> source = RandomBytes(kTargetBytes, 3);
  constexpr int kPuts = 64;
  std::atomic<int> ok{0};
  std::atomic<int> unavailable{0};
  std::atomic<int> other{0};
  for (int i = 0; i < kPuts; ++i) {
    link_.endpoint->Put(source.data(), kTargetBytes, link_.remote(0), link_.rkey,
                        [&](absl::Status status) {
                          if (status.ok()) {
                            ++ok;
                          } else if (absl::IsUnavailable(status)) {
                            ++unavailable;
                          } else {
                            ++other;
                          }
                        });
  }
  link_.writer.reset();  // Joins the progress thread: every callback has run.
  EXPECT_EQ(ok + unavailable, kPuts);
  EXPECT_EQ(other, 0);
  EXPECT_TRUE(link_.endpoint->failed());

  // The endpoint outlives its worker and stays inert.
  Done later;
  link_.endpoint->Put(source.data(), 8, link_.remote(0), link_.rkey, later.callback());
  EXPECT_THAT(later.Wait(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(FlushAndWait(*link_.endpoint), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(link_.endpoint->UnpackRkey(link_.region->packed_rkey()),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST_P(UcxWorkerTransportTest, RendezvousMessagesLandWhereTheReceiverSays) {
  // A rendezvous message is announced to its handler, which hands it to
  // another thread; that thread fetches it into its own buffer. An eager
  // message of the same id still goes to the plain handler, and a
  // rendezvous message the receiver drops completes its Send.
  const uint32_t seed = 77;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<uint8_t> large = RandomBytes(3 << 20, seed);
  const std::vector<uint8_t> small = RandomBytes(100, seed + 1);
  absl::Mutex mu;
  std::vector<std::pair<std::string, std::unique_ptr<IncomingMessage>>> announced;
  std::vector<std::string> eager;
  ASSERT_THAT(link_.target->SetMessageHandler(
                  7,
                  [&](absl::string_view header, absl::string_view data) {
                    absl::MutexLock lock(&mu);
                    eager.push_back(absl::StrCat(header, ":", data.size()));
                  },
                  [&](absl::string_view header, std::unique_ptr<IncomingMessage> message) {
                    absl::MutexLock lock(&mu);
                    announced.emplace_back(std::string(header), std::move(message));
                  }),
              IsOk());
  Done sent_large, sent_dropped, sent_small;
  link_.endpoint->Send(7, "keep", large.data(), large.size(), sent_large.callback(),
                       /*rendezvous=*/true);
  link_.endpoint->Send(7, "drop", large.data(), large.size(), sent_dropped.callback(),
                       /*rendezvous=*/true);
  link_.endpoint->Send(7, "small", small.data(), small.size(), sent_small.callback());
  EXPECT_THAT(sent_small.Wait(), IsOk());
  {
    absl::MutexLock lock(&mu);
    auto both = [&] { return announced.size() == 2 && eager.size() == 1; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&both), kDeadline));
    EXPECT_EQ(eager[0], "small:100");
  }
  std::vector<uint8_t> landed(large.size(), 0);
  Done received;
  std::thread receiver([&] {
    absl::MutexLock lock(&mu);
    for (auto& [header, message] : announced) {
      EXPECT_EQ(message->length(), large.size()) << header;
      if (header == "keep") message->Receive(landed.data(), received.callback());
    }
    announced.clear();  // Drops "drop" from this thread.
  });
  receiver.join();
  EXPECT_THAT(received.Wait(), IsOk());
  EXPECT_EQ(landed, large);
  EXPECT_THAT(sent_large.Wait(), IsOk());
  // The dropped message releases its sender (UCX 1.13 reports OK: delivery
  // is confirmed above UCX).
  EXPECT_THAT(sent_dropped.Wait(), Not(StatusIs(absl::StatusCode::kDeadlineExceeded)));
}

TEST_P(UcxWorkerTransportTest, HandshakeIsAnsweredByThePeerWorker) {
  // Twice: the first one rides the connection setup, the second an
  // established connection; both from the same endpoint.
  for (int i = 0; i < 2; ++i) {
    Done answered;
    link_.endpoint->Handshake(answered.callback());
    EXPECT_THAT(answered.Wait(), IsOk()) << "handshake " << i;
  }
  // And the other way round, from a new endpoint of the target.
  auto back = link_.target->Connect(link_.writer->address(), "writer");
  ASSERT_THAT(back, IsOk());
  Done answered;
  (*back)->Handshake(answered.callback());
  EXPECT_THAT(answered.Wait(), IsOk());
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxWorkerTransportTest,
                         ::testing::Values("tcp", "posix", "sysv"),
                         [](const auto& info) { return info.param; });

TEST(UcxWorkerTest, PeerWorkerDestroyedInProcessFailsPutsWithUnavailableOverTcp) {
  // Over TCP the peer's sockets close with its worker, so this needs no
  // second process (shared memory checks the peer's pid: see
  // ucx_peer_death_test).
  auto target = MakeWorker("tcp", "target");
  ASSERT_THAT(target, IsOk());
  auto writer = MakeWorker("tcp", "writer");
  ASSERT_THAT(writer, IsOk());
  std::vector<uint8_t> memory(1 << 20, 0);
  auto region = (*target)->Register(memory.data(), memory.size(), MemoryKind::kHost);
  ASSERT_THAT(region, IsOk());
  auto endpoint = (*writer)->Connect((*target)->address(), "decode-7");
  ASSERT_THAT(endpoint, IsOk());
  auto rkey = (*endpoint)->UnpackRkey((*region)->packed_rkey());
  ASSERT_THAT(rkey, IsOk());
  const std::vector<uint8_t> source = RandomBytes(memory.size(), 5);
  Done first;
  (*endpoint)->Put(source.data(), source.size(), reinterpret_cast<uint64_t>(memory.data()), *rkey,
                   first.callback());
  ASSERT_THAT(first.Wait(), IsOk());
  ASSERT_THAT(FlushAndWait(**endpoint), IsOk());

  region->reset();
  target->reset();

  // Puts keep failing once the failure is seen; the first may still be
  // accepted locally before the reset arrives, so post until one fails.
  absl::Status status;
  const absl::Time deadline = absl::Now() + kDeadline;
  while (status.ok() && absl::Now() < deadline) {
    Done done;
    (*endpoint)->Put(source.data(), source.size(), reinterpret_cast<uint64_t>(memory.data()), *rkey,
                     done.callback());
    status = done.Wait();
    if (status.ok()) status = FlushAndWait(**endpoint);
  }
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("decode-7")));
  Done after;
  (*endpoint)->Put(source.data(), 8, reinterpret_cast<uint64_t>(memory.data()), *rkey,
                   after.callback());
  EXPECT_THAT(after.Wait(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("decode-7")));
  EXPECT_TRUE((*endpoint)->failed());
}

TEST(UcxWorkerTest, HandshakeWithAGonePeerFailsWithUnavailableNamingIt) {
  auto target = MakeWorker("tcp", "target");
  ASSERT_THAT(target, IsOk());
  auto writer = MakeWorker("tcp", "writer");
  ASSERT_THAT(writer, IsOk());
  auto endpoint = (*writer)->Connect((*target)->address(), "decode-9");
  ASSERT_THAT(endpoint, IsOk());
  target->reset();  // Its sockets close: the ping, or its answer, never comes.
  Done answered;
  (*endpoint)->Handshake(answered.callback());
  EXPECT_THAT(answered.Wait(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("decode-9")));
}

TEST(UcxWorkerTest, HandshakePendingWhenTheEndpointClosesFailsAndOneAfterwardsToo) {
  auto target = MakeWorker("tcp", "target");
  ASSERT_THAT(target, IsOk());
  auto writer = MakeWorker("tcp", "writer");
  ASSERT_THAT(writer, IsOk());
  auto endpoint = (*writer)->Connect((*target)->address(), "decode-3");
  ASSERT_THAT(endpoint, IsOk());
  Done answered;
  (*endpoint)->Handshake(answered.callback());
  ASSERT_THAT(answered.Wait(), IsOk());
  // A worker destroyed with a handshake pending completes it.
  Done pending;
  (*endpoint)->Handshake(pending.callback());
  writer->reset();
  EXPECT_THAT(pending.Wait(), AnyOf(IsOk(), StatusIs(absl::StatusCode::kUnavailable)));
  Done after;
  (*endpoint)->Handshake(after.callback());
  EXPECT_THAT(after.Wait(), StatusIs(absl::StatusCode::kUnavailable));
}

TEST(UcxWorkerTest, TheHandshakeMessageIdIsReserved) {
  auto worker = MakeWorker("tcp", "w");
  ASSERT_THAT(worker, IsOk());
  EXPECT_THAT((*worker)->SetMessageHandler(kHandshakeMessageId,
                                           [](absl::string_view, absl::string_view) {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reserved")));
}

TEST(UcxWorkerTest, RegisterRejectsNullOrEmptyMemory) {
  auto worker = MakeWorker("tcp", "w");
  ASSERT_THAT(worker, IsOk());
  char byte = 0;
  EXPECT_THAT((*worker)->Register(nullptr, 16, MemoryKind::kHost),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*worker)->Register(&byte, 0, MemoryKind::kHost),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(UcxWorkerTest, RegisterRefusesCudaMemoryWithoutCudaSupport) {
  auto worker = MakeWorker("", "w");
  ASSERT_THAT(worker, IsOk());
  if ((*worker)->supports_cuda_memory()) GTEST_SKIP() << "this UCX supports CUDA memory";
  char byte = 0;
  EXPECT_THAT((*worker)->Register(&byte, 1, MemoryKind::kCuda),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("CUDA")));
}

TEST(UcxWorkerTest, ConnectRejectsAnEmptyAddress) {
  auto worker = MakeWorker("tcp", "w");
  ASSERT_THAT(worker, IsOk());
  EXPECT_THAT((*worker)->Connect("", "peer-1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("peer-1")));
}

TEST(UcxWorkerTest, UnknownTransportFailsCreateOrConnectNamingIt) {
  auto worker = MakeWorker("no_such_transport", "w");
  if (!worker.ok()) {
    EXPECT_THAT(worker,
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no_such_transport")));
    return;
  }
  auto peer = MakeWorker("tcp", "peer");
  ASSERT_THAT(peer, IsOk());
  EXPECT_THAT((*worker)->Connect((*peer)->address(), "peer"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no_such_transport")));
}

TEST(UcxWorkerTest, RkeysAreBoundToTheirEndpoint) {
  auto target = MakeWorker("tcp", "target");
  ASSERT_THAT(target, IsOk());
  auto writer = MakeWorker("tcp", "writer");
  ASSERT_THAT(writer, IsOk());
  std::vector<uint8_t> memory(4096, 0);
  auto region = (*target)->Register(memory.data(), memory.size(), MemoryKind::kHost);
  ASSERT_THAT(region, IsOk());
  auto first = (*writer)->Connect((*target)->address(), "target");
  ASSERT_THAT(first, IsOk());
  auto second = (*writer)->Connect((*target)->address(), "target");
  ASSERT_THAT(second, IsOk());
  auto rkey = (*first)->UnpackRkey((*region)->packed_rkey());
  ASSERT_THAT(rkey, IsOk());
  EXPECT_THAT((*first)->UnpackRkey(""), StatusIs(absl::StatusCode::kInvalidArgument));

  Done wrong_endpoint;
  (*second)->Put(memory.data(), 8, reinterpret_cast<uint64_t>(memory.data()), *rkey,
                 wrong_endpoint.callback());
  EXPECT_THAT(wrong_endpoint.Wait(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another endpoint")));
  Done null_rkey;
  (*second)->Put(memory.data(), 8, reinterpret_cast<uint64_t>(memory.data()), nullptr,
                 null_rkey.callback());
  EXPECT_THAT(null_rkey.Wait(), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(UcxWorkerTest, CreateRejectsNonPositiveIntervals) {
  EXPECT_THAT(UcxWorker::Create({.keepalive_interval = absl::ZeroDuration()}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::transport
