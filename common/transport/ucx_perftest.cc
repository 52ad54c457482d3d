#include "common/transport/ucx_perftest.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/process/subprocess.h"

namespace trident::transport {
namespace {

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

// `name` on PATH, else empty.
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace

std::string FindUcxPerftest() {
  const char* given = std::getenv("UCX_PERFTEST");
  if (given != nullptr && access(given, X_OK) == 0) return given;
  return FindOnPath("ucx_perftest");
}

absl::StatusOr<double> RunUcxPerftest(const std::string& perftest, const PerftestOptions& options) {
  if (options.message_bytes == 0) return absl::InvalidArgumentError("message_bytes is 0");
  const int port = FreePort();
  const uint64_t iterations =
      options.iterations > 0 ? options.iterations
                             : std::max<uint64_t>(20, (uint64_t{1} << 30) / options.message_bytes);
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  // Unique per run, so that runs may overlap (several pairs at once).
  static std::atomic<int> runs{0};
  const std::string tag = absl::StrCat(options.test, "_", options.transport, "_",
                                       options.message_bytes, "_", getpid(), "_", runs++);
  std::vector<std::string> argv = {"/usr/bin/env",
                                   "UCX_TLS=" + options.transport,
                                   "UCX_MM_ERROR_HANDLING=y",
                                   perftest,
                                   "-t",
                                   options.test,
                                   "-e",
                                   "-s",
                                   absl::StrCat(options.message_bytes),
                                   "-n",
                                   absl::StrCat(iterations),
                                   "-w",
                                   "5",
                                   "-p",
                                   absl::StrCat(port)};
  if (options.outstanding > 0) {
    argv.push_back("-O");
    argv.push_back(absl::StrCat(options.outstanding));
  }
  const std::string server_log = absl::StrCat(dir, "/perftest_server_", tag, ".log");
  auto server = Spawn({.argv = argv, .log_path = server_log});
  if (!server.ok()) return server.status();
  std::vector<std::string> client_argv = argv;
  client_argv.push_back("127.0.0.1");
  const std::string client_log = absl::StrCat(dir, "/perftest_client_", tag, ".log");
  absl::Status result = absl::UnavailableError("no attempt");
  double gbps = 0;
  // The server needs a moment to listen; a refused client exits at once.
  for (int attempt = 0; attempt < 50; ++attempt) {
    std::remove(client_log.c_str());
    auto client = Spawn({.argv = client_argv, .log_path = client_log});
    if (!client.ok()) {
      result = client.status();
      break;
    }
    auto exit = WaitForExit(client->pid, absl::Seconds(300));
    std::ifstream in(client_log);
    std::string line;
    bool found = false;
    while (std::getline(in, line)) {
      std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      // Final: iterations lat50 lat_avg lat_overall bw_avg bw_overall rate_avg rate_overall
      double mbps = 0;
      if (fields.size() >= 7 && fields[0] == "Final:" && absl::SimpleAtod(fields[6], &mbps)) {
        gbps = mbps * (1 << 20) / 1e9;  // ucx_perftest's MB is 2^20 bytes.
        found = true;
      }
    }
    if (found) {
      result = absl::OkStatus();
      break;
    }
    if (!exit.ok()) {
      kill(client->pid, SIGKILL);
      result = exit.status();
      break;
    }
    result = absl::UnavailableError(
        absl::StrCat("ucx_perftest client failed: ", TailOfFile(client_log, 300)));
    absl::SleepFor(absl::Milliseconds(100));
  }
  if (IsRunning(server->pid)) kill(server->pid, SIGKILL);
  WaitForExit(server->pid, absl::Seconds(10)).IgnoreError();
  if (!result.ok()) return result;
  return gbps;
}

}  // namespace trident::transport
