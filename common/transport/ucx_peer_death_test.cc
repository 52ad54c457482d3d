// Peer failure across processes: a UCX peer (ucx_test_peer) is SIGKILLed
// while writes are in flight, and this process must see every write complete
// (UNAVAILABLE once the death is noticed) without hanging, and keep working.

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/process/subprocess.h"
#include "common/status/status_macros.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "common/transport/ucx_worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Generous: only a hang ever reaches it.
constexpr absl::Duration kDeadline = absl::Seconds(60);
constexpr size_t kRegionBytes = 16 << 20;
constexpr size_t kPutBytes = 1 << 20;
constexpr int kInFlight = 8;

std::string PeerBinary() { return trident::testing::RunfilePath("common/transport/ucx_test_peer"); }

absl::Status WaitFor(absl::Notification& notification) {
  if (!notification.WaitForNotificationWithTimeout(kDeadline)) {
    return absl::DeadlineExceededError("callback did not run");
  }
  return absl::OkStatus();
}

// Starts an operation and waits for its callback. The state is shared with
// the callback, which may still run after a timeout.
absl::Status Call(const std::function<void(DoneCallback)>& start) {
  struct State {
    absl::Notification done;
    absl::Status status;
  };
  auto state = std::make_shared<State>();
  start([state](absl::Status status) {
    state->status = std::move(status);
    state->done.Notify();
  });
  if (absl::Status wait = WaitFor(state->done); !wait.ok()) return wait;
  return state->status;
}

struct RemoteRegion {
  std::string address;
  std::string rkey;
  uint64_t base = 0;
  uint64_t length = 0;
};

absl::StatusOr<RemoteRegion> ParseTargetLine(const std::string& line) {
  std::vector<std::string> fields = absl::StrSplit(line, ' ');
  RemoteRegion region;
  if (fields.size() != 4 || !absl::SimpleAtoi(fields[2], &region.base) ||
      !absl::SimpleAtoi(fields[3], &region.length)) {
    return absl::InternalError(absl::StrCat("bad ready line from ucx_test_peer: ", line));
  }
  region.address = absl::HexStringToBytes(fields[0]);
  region.rkey = absl::HexStringToBytes(fields[1]);
  return region;
}

// Keeps kInFlight puts posted (re-posting from their callbacks) until one
// fails; then lets the rest drain.
class Pump {
 public:
  Pump(std::shared_ptr<Endpoint> endpoint, std::shared_ptr<RemoteKey> rkey, uint64_t base)
      : endpoint_(std::move(endpoint)),
        rkey_(std::move(rkey)),
        base_(base),
        source_(kPutBytes, 0x42) {}

  void Start() {
    {
      absl::MutexLock lock(&mu_);
      in_flight_ = kInFlight;
    }
    for (int i = 0; i < kInFlight; ++i) PostOne(i);
  }

  absl::Notification sixteen_completed;
  absl::Notification drained;

  absl::Status first_error() {
    absl::MutexLock lock(&mu_);
    return first_error_;
  }
  int completed_ok() {
    absl::MutexLock lock(&mu_);
    return completed_ok_;
  }

 private:
  void PostOne(uint64_t n) {
    const uint64_t slots = kRegionBytes / kPutBytes;
    endpoint_->Put(source_.data(), kPutBytes, base_ + (n % slots) * kPutBytes, rkey_,
                   [this, n](absl::Status status) {
                     bool again = false;
                     {
                       absl::MutexLock lock(&mu_);
                       if (status.ok()) {
                         if (++completed_ok_ == 16) sixteen_completed.Notify();
                       } else if (first_error_.ok()) {
                         first_error_ = status;
                       }
                       if (first_error_.ok()) {
                         again = true;
                       } else if (--in_flight_ == 0) {
                         drained.Notify();
                       }
                     }
                     if (again) PostOne(n + kInFlight);
                   });
  }

  const std::shared_ptr<Endpoint> endpoint_;
  const std::shared_ptr<RemoteKey> rkey_;
  const uint64_t base_;
  const std::vector<char> source_;
  absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int completed_ok_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

class UcxPeerDeathTest : public ::testing::TestWithParam<std::string> {};
class UcxWriterDeathTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxPeerDeathTest, WritesFailWithUnavailableWhenTheTargetIsKilledMidTransfer) {
  const std::string transports = GetParam();
  // Declared first so that it outlives the worker, whose shutdown runs its
  // callbacks if the test fails early.
  std::unique_ptr<Pump> pump;
  auto worker = UcxWorker::Create({.transports = transports, .name = "writer"});
  ASSERT_THAT(worker, IsOk());
  auto target = Spawn({.argv = {PeerBinary(), "--mode=target", "--transports=" + transports,
                                absl::StrCat("--region_bytes=", kRegionBytes)},
                       .log_path = trident::testing::TestTmpPath("target_" + transports + ".log"),
                       .wait_for_ready_line = true});
  ASSERT_THAT(target, IsOk());
  auto region = ParseTargetLine(target->ready_line);
  ASSERT_THAT(region, IsOk());
  auto endpoint = (*worker)->Connect(region->address, "decode-target");
  ASSERT_THAT(endpoint, IsOk());
  EXPECT_EQ((*endpoint)->lane(), transports);
  auto rkey = (*endpoint)->UnpackRkey(region->rkey);
  ASSERT_THAT(rkey, IsOk());

  pump = std::make_unique<Pump>(*endpoint, *rkey, region->base);
  pump->Start();
  ASSERT_THAT(WaitFor(pump->sixteen_completed), IsOk());
  ASSERT_EQ(kill(target->pid, SIGKILL), 0);
  const absl::Time killed = absl::Now();
  // Reap it at once, as its parent would in production: shared-memory
  // transports detect death by the peer's pid, and a zombie still has one.
  auto exit = WaitForExit(target->pid, kDeadline);
  ASSERT_THAT(exit, IsOk());
  EXPECT_EQ(exit->signal, SIGKILL);

  // Every write in flight completes, the first failure being UNAVAILABLE.
  ASSERT_THAT(WaitFor(pump->drained), IsOk());
  std::cerr << "failure seen " << absl::FormatDuration(absl::Now() - killed)
            << " after SIGKILL over " << transports << ", after " << pump->completed_ok()
            << " successful writes\n";
  EXPECT_THAT(pump->first_error(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("decode-target")));

  // Later operations fail at once.
  std::vector<char> bytes(64, 1);
  EXPECT_THAT(Call([&](DoneCallback done) {
                (*endpoint)->Put(bytes.data(), bytes.size(), region->base, *rkey, std::move(done));
              }),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("decode-target")));
  EXPECT_THAT(Call([&](DoneCallback done) { (*endpoint)->Flush(std::move(done)); }),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("decode-target")));
  EXPECT_TRUE((*endpoint)->failed());

  // Tearing down after a dead peer returns promptly (the deadline only
  // catches a hang).
  const absl::Time teardown = absl::Now();
  rkey->reset();
  endpoint->reset();
  worker->reset();
  EXPECT_LT(absl::Now() - teardown, absl::Seconds(10));
}

// Spawns a test peer with `argv`, waits for its ready line `ready` and kills
// it with SIGKILL.
void SpawnReadyAndKill(std::vector<std::string> argv, const std::string& log_name,
                       const std::string& ready) {
  auto peer = Spawn({.argv = std::move(argv),
                     .log_path = trident::testing::TestTmpPath(log_name),
                     .wait_for_ready_line = true});
  ASSERT_THAT(peer, IsOk());
  ASSERT_EQ(peer->ready_line, ready);
  ASSERT_EQ(kill(peer->pid, SIGKILL), 0);
  auto exit = WaitForExit(peer->pid, kDeadline);
  ASSERT_THAT(exit, IsOk());
  EXPECT_EQ(exit->signal, SIGKILL);
}

// The reverse failure: the process holding the memory must survive a writer
// that dies mid-transfer, and keep serving other writers. With UCX 1.13.1 it
// does not, on any transport this machine has, because puts there are
// emulated with active messages that the target acknowledges one by one:
//   tcp:   always aborts the target: the ack's send fails inside
//          ucp_put_handler and ucp_request_try_send calls ucs_fatal
//          ("unexpected error: Endpoint timeout").
//   posix: sometimes a SIGSEGV in the target's progress thread.
//   sysv:  sometimes the target stops completing a new writer's puts.
// Nothing above UCX can catch these, which is why KV goes as messages on
// these lanes (KvWriteMode::kMessage; UcxMessengerDeathTest above) and as
// puts only where the target takes no part (RDMA, cuda_ipc, cma). Kept to
// check a newer UCX: run with --gtest_also_run_disabled_tests.
TEST_P(UcxWriterDeathTest, TargetKeepsWorkingWhenAWriterIsKilledMidTransfer) {
  const std::string transports = GetParam();
  auto worker = UcxWorker::Create({.transports = transports, .name = "target"});
  ASSERT_THAT(worker, IsOk());
  std::vector<char> memory(kRegionBytes, 0);
  auto region = (*worker)->Register(memory.data(), memory.size(), MemoryKind::kHost);
  ASSERT_THAT(region, IsOk());
  const uint64_t base = reinterpret_cast<uint64_t>(memory.data());
  SpawnReadyAndKill({PeerBinary(), "--mode=writer", "--transports=" + transports,
                     "--peer=" + absl::BytesToHexString((*worker)->address()),
                     "--rkey=" + absl::BytesToHexString((*region)->packed_rkey()),
                     absl::StrCat("--base=", base), absl::StrCat("--region_bytes=", kRegionBytes)},
                    "writer_" + transports + ".log", "writing");
  if (HasFatalFailure()) return;

  // This process still serves writes from a new writer.
  auto other = UcxWorker::Create({.transports = transports, .name = "writer-2"});
  ASSERT_THAT(other, IsOk());
  auto endpoint = (*other)->Connect((*worker)->address(), "target");
  ASSERT_THAT(endpoint, IsOk());
  auto rkey = (*endpoint)->UnpackRkey((*region)->packed_rkey());
  ASSERT_THAT(rkey, IsOk());
  std::vector<char> bytes(4096, 7);
  EXPECT_THAT(Call([&](DoneCallback done) {
                (*endpoint)->Put(bytes.data(), bytes.size(), base, *rkey, std::move(done));
              }),
              IsOk());
  EXPECT_THAT(Call([&](DoneCallback done) { (*endpoint)->Flush(std::move(done)); }), IsOk());
  EXPECT_EQ(std::vector<char>(memory.begin(), memory.begin() + bytes.size()), bytes);
}

// Spawns a messenger peer sending `message_bytes` messages to `worker` over
// `transports` (by rendezvous if asked), waits until it is sending, and
// kills it with SIGKILL.
void KillSenderMidStream(const UcxWorker& worker, const std::string& transports,
                         size_t message_bytes, bool rendezvous, const std::string& log_name) {
  std::vector<std::string> argv = {PeerBinary(), "--mode=messenger", "--transports=" + transports,
                                   "--peer=" + absl::BytesToHexString(worker.address()),
                                   absl::StrCat("--region_bytes=", message_bytes)};
  if (rendezvous) argv.push_back("--rendezvous=1");
  SpawnReadyAndKill(std::move(argv), log_name, "sending");
}

// Sends one message "after" of `message_bytes` 7s to `worker` (id 1) from a
// new worker, which it returns (keep it until the message is seen) once the
// Send completed OK; else the error.
absl::StatusOr<std::unique_ptr<UcxWorker>> SendFromNewSender(const UcxWorker& worker,
                                                             const std::string& transports,
                                                             size_t message_bytes,
                                                             bool rendezvous) {
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> other,
                           UcxWorker::Create({.transports = transports, .name = "sender-2"}));
  TRIDENT_ASSIGN_OR_RETURN(std::shared_ptr<Endpoint> endpoint,
                           other->Connect(worker.address(), "receiver"));
  const std::vector<char> bytes(message_bytes, 7);
  TRIDENT_RETURN_IF_ERROR(Call([&](DoneCallback done) {
    endpoint->Send(1, "after", bytes.data(), bytes.size(), std::move(done), rendezvous);
  }));
  return other;
}

// What messages are for: a receiver survives a sender killed mid-message and
// keeps receiving from others, over tcp and posix shared memory. Not over
// sysv: there UCX 1.13.1 sometimes stops delivering a new sender's messages
// after a sender died (as with puts, below), so workers leave sysv out.
class UcxMessengerDeathTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxMessengerDeathTest, ReceiverKeepsWorkingWhenASenderIsKilledMidMessage) {
  const std::string transports = GetParam();
  if (transports == "posix") {
    // Known failure, kept visible: about 1 run in 20 the receiver never gets
    // the new sender's message (UCX 1.13.1's shared-memory FIFO, shared by
    // all senders, can stay wedged by a sender killed mid-write), as sysv
    // does more often. tcp is unaffected.
    GTEST_SKIP() << "UCX 1.13.1 posix FIFO can wedge after a sender dies; see the comment";
  }
  // Declared before the worker, so that they outlive it: over tcp a message
  // the dead senders sent can still arrive while the worker shuts down, and
  // its handler takes `mu` and counts into the map (declared after the
  // worker, the map was gone by then: LeakSanitizer caught a handler's
  // insert into it).
  absl::Mutex mu;
  // By header: the killed senders' ("m"), and the last one's ("after").
  absl::flat_hash_map<std::string, int64_t> received_bytes;
  auto worker = UcxWorker::Create({.transports = transports, .name = "receiver"});
  ASSERT_THAT(worker, IsOk());
  ASSERT_THAT((*worker)->SetMessageHandler(1,
                                           [&](absl::string_view header, absl::string_view data) {
                                             absl::MutexLock lock(&mu);
                                             received_bytes[header] += data.size();
                                           }),
              IsOk());
  constexpr size_t kMessageBytes = 1 << 20;
  for (int round = 0; round < 3; ++round) {
    KillSenderMidStream(**worker, transports, kMessageBytes, /*rendezvous=*/false,
                        absl::StrCat("messenger_", transports, "_", round, ".log"));
    if (HasFatalFailure()) return;
  }
  {
    // Whole messages only (tcp may still deliver some the dead sent).
    absl::MutexLock lock(&mu);
    EXPECT_GT(received_bytes["m"], 0);
    EXPECT_EQ(received_bytes["m"] % kMessageBytes, 0u);
  }

  // This process still receives from a new sender, whole messages only.
  auto sender = SendFromNewSender(**worker, transports, kMessageBytes, /*rendezvous=*/false);
  EXPECT_THAT(sender, IsOk());
  const absl::Time deadline = absl::Now() + kDeadline;
  absl::MutexLock lock(&mu);
  auto arrived = [&] { return received_bytes.contains("after"); };
  EXPECT_TRUE(mu.AwaitWithDeadline(absl::Condition(&arrived), deadline));
  EXPECT_EQ(received_bytes["after"], static_cast<int64_t>(kMessageBytes));
}

// Rendezvous messages (what KV messages are over shared memory): the
// receiver asks the sender for the data from inside UCX, so a sender that
// died must fail those fetches, not the receiver. The receiver holds the
// first three messages of each sender until the sender is dead, then fetches
// them; it fetches the others at once. Over shared memory only, where KV
// messages go by rendezvous (RendezvousForLane): over tcp UCX 1.13.1 aborts
// the receiver at shutdown after such fetches (tcp_iface.c:369).
class UcxRendezvousDeathTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxRendezvousDeathTest, ReceiverKeepsWorkingWhenASenderIsKilled) {
  const std::string transports = GetParam();
  if (transports == "posix" && std::getenv("TRIDENT_UCX_POSIX_DEATH_TESTS") == nullptr) {
    // Known failure, kept runnable: in a few runs of twenty (more on a loaded
    // machine) a new sender started after killed ones never gets its UCX
    // worker ready, or the receiver never gets its message: UCX 1.13.1's
    // shared-memory transport can stay wedged by a process killed while it
    // was connected (README, known limits). tcp is the transport for
    // deployments where workers die. TRIDENT_UCX_POSIX_DEATH_TESTS=1 runs it.
    GTEST_SKIP() << "UCX 1.13.1 posix can stay wedged after a sender dies; set "
                    "TRIDENT_UCX_POSIX_DEATH_TESTS=1 to run it";
  }
  constexpr size_t kMessageBytes = 1 << 20;
  // Declared before the worker, so that they outlive it: fetches still
  // pending when the test ends complete (CANCELLED) while the worker shuts
  // down, into these buffers and through callbacks that take `mu`.
  absl::Mutex mu;
  absl::flat_hash_map<std::string, int64_t> fetched_bytes;  // By header.
  int failed = 0;
  std::vector<std::unique_ptr<std::vector<char>>> buffers;
  std::vector<std::unique_ptr<IncomingMessage>> held;
  auto worker = UcxWorker::Create({.transports = transports, .name = "receiver"});
  ASSERT_THAT(worker, IsOk());
  auto fetch = [&](std::string header, IncomingMessage& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    buffers.push_back(std::make_unique<std::vector<char>>(message.length()));
    const size_t length = message.length();
    std::vector<char>* buffer = buffers.back().get();
    message.Receive(buffer->data(), [&, header, length, buffer](absl::Status status) {
      absl::MutexLock lock(&mu);
      if (status.ok()) {
        // The peer sends 0x3c bytes, the last sender 7s.
        const char want = header == "m" ? 0x3c : 7;
        EXPECT_EQ(std::count(buffer->begin(), buffer->end(), want), static_cast<int64_t>(length))
            << "a fetch reported OK with bytes that were not sent";
        fetched_bytes[header] += length;
      } else {
        EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable));
        ++failed;
      }
    });
  };
  ASSERT_THAT(
      (*worker)->SetMessageHandler(
          1, [](absl::string_view, absl::string_view) { ADD_FAILURE() << "an eager message"; },
          [&](absl::string_view header, std::unique_ptr<IncomingMessage> message) {
            absl::MutexLock lock(&mu);
            if (header == "m" && held.size() < 3) {
              held.push_back(std::move(message));
            } else {
              fetch(std::string(header), *message);
            }
          }),
      IsOk());
  for (int round = 0; round < 3; ++round) {
    KillSenderMidStream(**worker, transports, kMessageBytes, /*rendezvous=*/true,
                        absl::StrCat("rendezvous_messenger_", transports, "_", round, ".log"));
    if (HasFatalFailure()) return;
    // Fetch what the dead sender announced: each completes, most with
    // UNAVAILABLE.
    absl::MutexLock lock(&mu);
    for (auto& message : held) fetch("m", *message);
    held.clear();
  }

  // This process still receives from a new sender, whole.
  auto sender = SendFromNewSender(**worker, transports, kMessageBytes, /*rendezvous=*/true);
  EXPECT_THAT(sender, IsOk());
  const absl::Time deadline = absl::Now() + kDeadline;
  absl::MutexLock lock(&mu);
  auto arrived = [&] { return fetched_bytes.contains("after"); };
  EXPECT_TRUE(mu.AwaitWithDeadline(absl::Condition(&arrived), deadline));
  EXPECT_EQ(fetched_bytes["after"], static_cast<int64_t>(kMessageBytes));
  EXPECT_GT(fetched_bytes["m"], 0);
  std::printf("%s: %lld rendezvous bytes fetched from killed senders, %d fetches failed\n",
              transports.c_str(), static_cast<long long>(fetched_bytes["m"]), failed);
}

// A peer that connects and dies at once, as a prefill worker killed right
// after its first transfer to a decode worker began: once its handshake is
// answered, its death costs the receiver nothing. (Without the handshake,
// over tcp, UCX 1.13.1 aborts the receiver when the peer dies while the
// receiver's wireup reply to it is still queued: ucp_request.c:684.)
class UcxHandshakeDeathTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxHandshakeDeathTest, ReceiverSurvivesPeersKilledRightAfterTheirHandshake) {
  const std::string transports = GetParam();
  // Declared before the worker, which may run the handler as it shuts down.
  absl::Mutex mu;
  int64_t received = 0;
  auto worker = UcxWorker::Create({.transports = transports, .name = "receiver"});
  ASSERT_THAT(worker, IsOk());
  ASSERT_THAT((*worker)->SetMessageHandler(1,
                                           [&](absl::string_view, absl::string_view data) {
                                             absl::MutexLock lock(&mu);
                                             received += data.size();
                                           }),
              IsOk());
  constexpr int kPeers = 8;
  for (int round = 0; round < kPeers; ++round) {
    SpawnReadyAndKill(
        {PeerBinary(), "--mode=handshaker", "--transports=" + transports,
         "--peer=" + absl::BytesToHexString((*worker)->address()), "--region_bytes=1"},
        absl::StrCat("handshaker_", transports, "_", round, ".log"), "answered");
    if (HasFatalFailure()) return;
  }
  // Alive, and still receiving.
  constexpr size_t kMessageBytes = 1 << 16;
  auto sender = SendFromNewSender(**worker, transports, kMessageBytes, /*rendezvous=*/false);
  EXPECT_THAT(sender, IsOk());
  absl::MutexLock lock(&mu);
  auto arrived = [&] { return received == static_cast<int64_t>(kMessageBytes); };
  EXPECT_TRUE(mu.AwaitWithDeadline(absl::Condition(&arrived), absl::Now() + kDeadline));
  std::printf("%s: the receiver outlived %d peers killed right after their handshake\n",
              transports.c_str(), kPeers);
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxHandshakeDeathTest, ::testing::Values("tcp", "posix"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Transports, UcxRendezvousDeathTest, ::testing::Values("posix"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Transports, UcxMessengerDeathTest, ::testing::Values("tcp", "posix"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Transports, UcxPeerDeathTest, ::testing::Values("tcp", "posix", "sysv"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(DISABLED_TargetDiesOnUcx1131, UcxWriterDeathTest,
                         ::testing::Values("tcp", "posix", "sysv"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace trident::transport
