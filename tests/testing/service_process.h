// Starting Trident service binaries as child processes in integration tests:
// each binds port 0 and reports its ports on its ready line.

#ifndef TRIDENT_TESTS_TESTING_SERVICE_PROCESS_H_
#define TRIDENT_TESTS_TESTING_SERVICE_PROCESS_H_

#include <signal.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "trident/v1/attention.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::testing {

struct ServiceProcess {
  pid_t pid = -1;
  std::string address;  // 127.0.0.1:<grpc port>
  std::shared_ptr<grpc::Channel> channel;
  int metrics_port = 0;  // 0 when the ready line names none.
};

// Runs `argv` (a service binary and its flags; --host, --port and
// --metrics_port are added) with its log in `log_path`, and waits for it to
// be ready.
inline absl::StatusOr<ServiceProcess> StartService(std::vector<std::string> argv,
                                                   const std::string& log_path) {
  argv.push_back("--host=127.0.0.1");
  argv.push_back("--port=0");
  argv.push_back("--metrics_port=0");
  absl::StatusOr<SpawnedProcess> spawned =
      Spawn({.argv = argv, .log_path = log_path, .wait_for_ready_line = true});
  if (!spawned.ok()) return spawned.status();
  ServiceProcess p;
  p.pid = spawned->pid;
  const nlohmann::json ready = nlohmann::json::parse(spawned->ready_line);
  p.address = absl::StrCat("127.0.0.1:", ready["grpc_port"].get<int>());
  p.channel = grpc::CreateChannel(p.address, grpc::InsecureChannelCredentials());
  if (ready.contains("metrics_port")) p.metrics_port = ready["metrics_port"].get<int>();
  return p;
}

// The argv of a small CPU worker (`worker_bin`) in `role`, with id `name`,
// on the model in `model_dir`: one unpinned thread and a 16 MiB KV cache.
inline std::vector<std::string> SmallCpuWorkerArgv(const std::string& worker_bin,
                                                   const std::string& model_dir,
                                                   const std::string& role,
                                                   const std::string& name) {
  return {worker_bin,
          absl::StrCat("--role=", role),
          absl::StrCat("--worker_id=", name),
          "--pin_threads=false",
          "--cpu_threads=1",
          "--kv_cache_mb=16",
          absl::StrCat("--model=", model_dir)};
}

// A small CPU worker (SmallCpuWorkerArgv of the runfiles' worker binary)
// moving KV over UCX's tcp transport, with `extra_flags`, logging to the
// test's temporary directory as <name>.log.
inline absl::StatusOr<ServiceProcess> StartUcxWorker(
    const std::string& model_dir, const std::string& role, const std::string& name,
    const std::vector<std::string>& extra_flags = {}) {
  std::vector<std::string> argv =
      SmallCpuWorkerArgv(RunfilePath("services/worker/worker"), model_dir, role, name);
  argv.push_back("--kv_transport=ucx");
  argv.push_back("--ucx_transports=tcp");
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  return StartService(argv, TestTmpPath(absl::StrCat(name, ".log")));
}

// A router (the runfiles' binary) on `model_dir` in front of the workers at
// `prefill` and `decode` (comma-separated addresses), with admission off
// and fast load streams unless `extra_flags` say otherwise, logging to the
// test's temporary directory as router.log.
inline absl::StatusOr<ServiceProcess> StartTestRouter(
    const std::string& model_dir, const std::string& prefill, const std::string& decode,
    const std::vector<std::string>& extra_flags = {}) {
  std::vector<std::string> argv = {RunfilePath("services/router/router"),
                                   absl::StrCat("--model=", model_dir),
                                   absl::StrCat("--prefill_workers=", prefill),
                                   absl::StrCat("--decode_workers=", decode),
                                   "--load_interval_ms=20",
                                   "--admission=false"};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  return StartService(argv, TestTmpPath("router.log"));
}

// SIGTERM and wait (up to 30 s).
inline absl::Status StopService(ServiceProcess& p) {
  if (p.pid <= 0) return absl::OkStatus();
  kill(p.pid, SIGTERM);
  absl::Status s = WaitForExit(p.pid, absl::Seconds(30)).status();
  p.pid = -1;
  return s;
}

// The worker's next load sample (its GetLoad stream's first), or none if it
// sends none within 5 s.
inline std::optional<trident::v1::WorkerLoad> NextLoadSample(
    const std::shared_ptr<grpc::Channel>& worker) {
  auto stub = trident::v1::WorkerControl::NewStub(worker);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  trident::v1::GetLoadRequest request;
  request.mutable_interval()->set_nanos(10'000'000);
  auto reader = stub->GetLoad(&context, request);
  trident::v1::WorkerLoad load;
  const bool got = reader->Read(&load);
  context.TryCancel();
  if (!got) return std::nullopt;
  return load;
}

// Reads the worker's load samples until every KV block is free and no
// reservation holds any (true), or until `timeout` (false). A load stream
// that ends early (the channel reset by a peer's death, say) is opened again,
// waiting for the channel to be ready, up to three times.
inline bool AllKvBlocksFree(const std::shared_ptr<grpc::Channel>& worker,
                            absl::Duration timeout = absl::Seconds(20)) {
  auto stub = trident::v1::WorkerControl::NewStub(worker);
  const absl::Time deadline = absl::Now() + timeout;
  trident::v1::GetLoadRequest request;
  request.mutable_interval()->set_nanos(10'000'000);
  for (int attempt = 0; attempt < 3; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    context.set_wait_for_ready(true);
    auto reader = stub->GetLoad(&context, request);
    trident::v1::WorkerLoad load;
    while (reader->Read(&load)) {
      if (load.kv_blocks_free() == load.kv_blocks_total() && load.kv_blocks_reserved() == 0) {
        context.TryCancel();
        return true;
      }
    }
    const grpc::Status status = reader->Finish();
    std::fprintf(stderr, "AllKvBlocksFree: load stream ended (%d '%s')\n",
                 static_cast<int>(status.error_code()), status.error_message().c_str());
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return false;
  }
  return false;
}

inline bool AllKvBlocksFree(const ServiceProcess& worker,
                            absl::Duration timeout = absl::Seconds(20)) {
  return AllKvBlocksFree(worker.channel, timeout);
}

// Polls the attention service's stats until it holds nothing a finished
// request could have left: no sequence or token of one (the sessions of
// live workers stay open), and in its KV block store no reserved (half-written), pinned or borrowed
// block, with its books balanced. Readable store blocks stay: they are the
// prefix cache. Its stats when so within `timeout`; otherwise
// kFailedPrecondition naming what the last sample still held.
inline absl::StatusOr<trident::v1::AttentionStats> AttentionServiceIdle(
    const std::shared_ptr<grpc::Channel>& service, absl::Duration timeout = absl::Seconds(30)) {
  auto stub = trident::v1::Attention::NewStub(service);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(20);
  std::string held = "no stats";
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    trident::v1::AttentionStats stats;
    const grpc::Status status =
        stub->GetStats(&context, trident::v1::GetAttentionStatsRequest(), &stats);
    if (status.ok()) {
      const trident::v1::BlockStoreStats& store = stats.block_store();
      if (stats.sequences() == 0 && stats.held_tokens() == 0 && store.reserved_blocks() == 0 &&
          store.pinned_blocks() == 0 && store.borrows() == 0 &&
          store.invariant_violation().empty()) {
        return stats;
      }
      held = absl::StrCat(
          stats.sequences(), " sequences (", stats.held_tokens(), " tokens), ", stats.sessions(),
          " sessions; store: ", store.blocks(), " blocks, ", store.reserved_blocks(), " reserved, ",
          store.pinned_blocks(), " pinned, ", store.borrows(), " borrows",
          store.invariant_violation().empty() ? ""
                                              : absl::StrCat(", ", store.invariant_violation()));
    } else {
      held = absl::StrCat("GetStats: ", status.error_message());
    }
    if (absl::Now() > deadline) {
      return absl::FailedPreconditionError(absl::StrCat("the attention service holds ", held));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_SERVICE_PROCESS_H_
