// A second process for ucx_peer_death_test: a UCX peer that the test kills
// with SIGKILL while transfers are in flight.
//
//   ucx_test_peer --mode=target --transports=tcp --region_bytes=N --ready_fd=K
//     Registers N bytes and writes "<address hex> <rkey hex> <base> <N>" to fd
//     K, then waits to be killed.
//   ucx_test_peer --mode=writer --transports=tcp --peer=<address hex>
//                 --rkey=<rkey hex> --base=<address> --region_bytes=N --ready_fd=K
//     Connects to that target and writes into its region without pause; once
//     16 writes have completed it writes "writing" to fd K. Runs until killed.
//   ucx_test_peer --mode=messenger --transports=tcp --peer=<address hex>
//                 --region_bytes=N --ready_fd=K
//     Connects to that worker and sends it active messages (id 1, N bytes
//     each) without pause; once 16 have completed it writes "sending" to fd
//     K. Runs until killed. With --rendezvous=1 the messages go by
//     rendezvous (Endpoint::Send's `rendezvous`).
//   ucx_test_peer --mode=handshaker --transports=tcp --peer=<address hex>
//                 --region_bytes=N --ready_fd=K
//     Connects to that worker, completes Endpoint::Handshake and writes
//     "answered" to fd K. Runs until killed.
//
// Exits 2 on bad arguments or a UCX error, after printing it to stderr.

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/transport/ucx_worker.h"

namespace trident::transport {
namespace {

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "ucx_test_peer: %s\n", message.c_str());
  std::exit(2);
}

void WriteLine(int fd, const std::string& line) {
  const std::string text = line + "\n";
  if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    Fail("cannot write the ready line");
  }
}

[[noreturn]] void WaitToBeKilled() {
  while (true) pause();
}

// Keeps `kInFlight` puts going from its own thread-free callback chain.
class Pump {
 public:
  static constexpr int kInFlight = 8;
  static constexpr size_t kPutBytes = 1 << 20;

  Pump(std::shared_ptr<Endpoint> endpoint, std::shared_ptr<RemoteKey> rkey, uint64_t base,
       size_t region_bytes, int ready_fd)
      : endpoint_(std::move(endpoint)),
        rkey_(std::move(rkey)),
        base_(base),
        slots_(region_bytes / kPutBytes),
        ready_fd_(ready_fd),
        source_(kPutBytes, 0x5a) {}

  void Start() {
    for (int i = 0; i < kInFlight; ++i) PostOne(i);
  }

 private:
  void PostOne(uint64_t n) {
    endpoint_->Put(source_.data(), kPutBytes, base_ + (n % slots_) * kPutBytes, rkey_,
                   [this, n](absl::Status status) {
                     if (!status.ok()) Fail(status.ToString());
                     if (++completed_ == 16) WriteLine(ready_fd_, "writing");
                     PostOne(n + kInFlight);
                   });
  }

  const std::shared_ptr<Endpoint> endpoint_;
  const std::shared_ptr<RemoteKey> rkey_;
  const uint64_t base_;
  const uint64_t slots_;
  const int ready_fd_;
  const std::vector<char> source_;
  std::atomic<int> completed_{0};
};

// Keeps `kInFlight` messages going, like Pump.
class MessagePump {
 public:
  static constexpr int kInFlight = 8;

  MessagePump(std::shared_ptr<Endpoint> endpoint, size_t message_bytes, int ready_fd,
              bool rendezvous)
      : endpoint_(std::move(endpoint)),
        ready_fd_(ready_fd),
        rendezvous_(rendezvous),
        source_(message_bytes, 0x3c) {}

  void Start() {
    for (int i = 0; i < kInFlight; ++i) PostOne();
  }

 private:
  void PostOne() {
    endpoint_->Send(
        1, "m", source_.data(), source_.size(),
        [this](absl::Status status) {
          if (!status.ok()) Fail(status.ToString());
          if (++completed_ == 16) WriteLine(ready_fd_, "sending");
          PostOne();
        },
        rendezvous_);
  }

  const std::shared_ptr<Endpoint> endpoint_;
  const int ready_fd_;
  const bool rendezvous_;
  const std::vector<char> source_;
  std::atomic<int> completed_{0};
};

int Main(int argc, char** argv) {
  // Never outlive the test, whatever happens to it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  absl::flat_hash_map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (!absl::ConsumePrefix(&arg, "--")) Fail(absl::StrCat("unexpected argument ", argv[i]));
    const size_t eq = arg.find('=');
    if (eq == absl::string_view::npos) Fail(absl::StrCat("expected --name=value: ", argv[i]));
    flags[std::string(arg.substr(0, eq))] = std::string(arg.substr(eq + 1));
  }
  int ready_fd = -1;
  uint64_t region_bytes = 0;
  if (!absl::SimpleAtoi(flags["ready_fd"], &ready_fd) ||
      !absl::SimpleAtoi(flags["region_bytes"], &region_bytes) || region_bytes == 0) {
    Fail("--ready_fd and --region_bytes are required");
  }
  const std::string mode = flags["mode"];
  auto worker = UcxWorker::Create({.transports = flags["transports"], .name = "peer-" + mode});
  if (!worker.ok()) Fail(worker.status().ToString());

  if (mode == "target") {
    std::vector<char> memory(region_bytes, 0);
    auto region = (*worker)->Register(memory.data(), memory.size(), MemoryKind::kHost);
    if (!region.ok()) Fail(region.status().ToString());
    WriteLine(ready_fd,
              absl::StrCat(absl::BytesToHexString((*worker)->address()), " ",
                           absl::BytesToHexString((*region)->packed_rkey()), " ",
                           reinterpret_cast<uint64_t>(memory.data()), " ", memory.size()));
    WaitToBeKilled();
  }
  if (mode == "writer") {
    uint64_t base = 0;
    if (!absl::SimpleAtoi(flags["base"], &base)) Fail("--base is required");
    auto endpoint = (*worker)->Connect(absl::HexStringToBytes(flags["peer"]), "target");
    if (!endpoint.ok()) Fail(endpoint.status().ToString());
    auto rkey = (*endpoint)->UnpackRkey(absl::HexStringToBytes(flags["rkey"]));
    if (!rkey.ok()) Fail(rkey.status().ToString());
    Pump pump(*endpoint, *rkey, base, region_bytes, ready_fd);
    pump.Start();
    WaitToBeKilled();
  }
  if (mode == "messenger") {
    auto endpoint = (*worker)->Connect(absl::HexStringToBytes(flags["peer"]), "receiver");
    if (!endpoint.ok()) Fail(endpoint.status().ToString());
    MessagePump pump(*endpoint, region_bytes, ready_fd, flags["rendezvous"] == "1");
    pump.Start();
    WaitToBeKilled();
  }
  if (mode == "handshaker") {
    auto endpoint = (*worker)->Connect(absl::HexStringToBytes(flags["peer"]), "receiver");
    if (!endpoint.ok()) Fail(endpoint.status().ToString());
    (*endpoint)->Handshake([ready_fd](absl::Status status) {
      if (!status.ok()) Fail(status.ToString());
      WriteLine(ready_fd, "answered");
    });
    WaitToBeKilled();
  }
  Fail(absl::StrCat("unknown --mode '", mode, "'"));
}

}  // namespace
}  // namespace trident::transport

int main(int argc, char** argv) { return trident::transport::Main(argc, argv); }
