// trident: the command-line front end of a Trident cluster on this machine.
//
//   trident up        start controller, attention, workers, router and Prometheus
//   trident status    show every process and its health, and each worker's load
//   trident down      drain and stop them all
//   trident generate  stream a generation through the router

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/grpc/tls.h"
#include "common/logging/log.h"
#include "tools/cli/cluster.h"
#include "tools/cli/cluster_status.h"
#include "tools/cli/generate.h"

ABSL_FLAG(std::string, state_dir, "",
          "Directory for the cluster's state, logs and Prometheus data. Default: "
          "$XDG_STATE_HOME/trident or ~/.local/state/trident.");
ABSL_FLAG(std::string, bin_dir, "",
          "Directory holding the router, worker, attention and controller binaries. Default: "
          "found next to this binary.");
ABSL_FLAG(std::string, prometheus_bin, "prometheus", "The Prometheus server binary.");
ABSL_FLAG(std::string, workers, "prefill,decode",
          "Comma-separated roles, one worker each: prefill, decode or both (colocated; it also "
          "serves either half of a request). The router is given every worker; at least one "
          "must be able to prefill and one to decode.");
ABSL_FLAG(std::string, model, "",
          "Model directory every worker and the router serve. Default: a small random-weight "
          "llama3-tiny model generated once into <state_dir>/models.");
ABSL_FLAG(
    std::string, worker_flags, "",
    "Extra flags for every worker, space-separated (e.g. \"--dtype=bf16 --kv_cache_mb=256\").");
ABSL_FLAG(int32_t, offload_min_context_tokens, 0,
          "up: decode workers place each request whose prompt plus max_tokens reaches this many "
          "tokens on the CPU attention service (the prefill worker writes its prompt there) and "
          "move sequences that grow past it there (their decode attention runs there); 0 (the "
          "default): only when their KV cache runs short, and only while their start-up cost "
          "tables say the decode step keeps its throughput (--offload_keep_throughput).");
ABSL_FLAG(int32_t, attention_threads, 1,
          "up: kernel threads of the attention service (one per physical core at most).");
ABSL_FLAG(int64_t, attention_kv_store_mb, 64,
          "up: MiB of the attention service's 256 MiB KV budget its block store may hold (the "
          "prefix cache's DRAM tier, which decode-capable workers write through to and fetch "
          "from); 0 turns it off.");
ABSL_FLAG(std::string, address, "",
          "generate: host:port of a Generation endpoint. Default: the router of the cluster in "
          "--state_dir.");
ABSL_FLAG(bool, tls, false,
          "up: TLS on every gRPC port and mTLS between the services, with a private CA made for "
          "the cluster under <state_dir>/tls; later commands use it by themselves.");
ABSL_FLAG(std::string, api_key, "",
          "generate: the API key to send (a router started with --api_keys_file needs one). "
          "Default: $TRIDENT_API_KEY.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "generate with --address: verify the router's TLS certificate against this CA (PEM) "
          "instead of talking plaintext.");
ABSL_FLAG(int32_t, max_tokens, 64, "generate: most tokens to generate.");
ABSL_FLAG(double, temperature, 0.0, "generate: sampling temperature (0: greedy).");
ABSL_FLAG(int64_t, seed, -1, "generate: sampling seed (-1: random).");
ABSL_FLAG(bool, ignore_eos, false, "generate: keep generating past EOS tokens.");
ABSL_FLAG(absl::Duration, scrape_interval, absl::Seconds(1), "Prometheus scrape interval.");
ABSL_FLAG(absl::Duration, ready_timeout, absl::Seconds(120),
          "How long each process may take to start serving.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(3),
          "How long calls in flight may run when the cluster is stopped.");

namespace {

constexpr char kUsage[] = R"(trident: run a Trident cluster on this machine.

Usage:
  trident up [--workers=prefill,decode] [--model=DIR] [--state_dir=DIR] [--tls]
      Starts the controller, an attention service, the workers (one per
      role listed; KV moves between them over UCX) and the router in front
      of them, each as its own process on 127.0.0.1, and a Prometheus server
      scraping them; returns once all report SERVING and the router knows
      every worker, and prints where each listens. --tls: TLS on every gRPC
      port and mTLS between the services (a private CA in <state_dir>/tls).
  trident generate "PROMPT" [--max_tokens=64] [--temperature=0] [--address=HOST:PORT]
                   [--api_key=KEY] [--tls_ca_file=CA.pem]
      Streams a generation of PROMPT through the router to stdout as the
      tokens arrive, then prints the token counts, where the request ran
      (prefill and decode worker) and its timings to stderr.
  trident status [--state_dir=DIR]
      Shows each process, its addresses and its health, each worker's
      role, running and waiting sequences, KV cache usage, prefix-cache hit
      rate and cached blocks, and each attention service's KV and block
      store. Exits 1 unless all are SERVING.
  trident down [--state_dir=DIR]
      Drains and stops every process of the cluster.

Flags are listed with --help.)";

std::string DefaultStateDir() {
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/trident");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.local/state/trident");
  }
  return "/tmp/trident";
}

std::string StateDir() {
  const std::string flag = absl::GetFlag(FLAGS_state_dir);
  return flag.empty() ? DefaultStateDir() : flag;
}

void PrintStatus(const trident::cli::ClusterState& state,
                 const std::vector<trident::cli::ProcessStatus>& statuses) {
  std::fputs(trident::cli::FormatStatus(state, statuses).c_str(), stdout);
  std::fflush(stdout);
}

int Up() {
  trident::cli::ClusterOptions options;
  options.state_dir = StateDir();
  options.bin_dir = absl::GetFlag(FLAGS_bin_dir);
  options.prometheus_bin = absl::GetFlag(FLAGS_prometheus_bin);
  options.model_dir = absl::GetFlag(FLAGS_model);
  options.worker_roles = absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty());
  options.tls = absl::GetFlag(FLAGS_tls);
  options.worker_flags = absl::StrSplit(absl::GetFlag(FLAGS_worker_flags), ' ', absl::SkipEmpty());
  options.offload_min_context_tokens = absl::GetFlag(FLAGS_offload_min_context_tokens);
  options.attention_threads = absl::GetFlag(FLAGS_attention_threads);
  options.attention_kv_store_mb = absl::GetFlag(FLAGS_attention_kv_store_mb);
  options.scrape_interval = absl::GetFlag(FLAGS_scrape_interval);
  options.ready_timeout = absl::GetFlag(FLAGS_ready_timeout);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  absl::StatusOr<trident::cli::ClusterState> state = trident::cli::Up(options);
  if (!state.ok()) {
    std::fprintf(stderr, "trident up: %s\n", std::string(state.status().message()).c_str());
    return 1;
  }
  std::printf("Trident is up (state in %s).\n\n", options.state_dir.c_str());
  PrintStatus(*state, trident::cli::CheckStatus(*state));
  const std::string state_flag = absl::GetFlag(FLAGS_state_dir).empty()
                                     ? ""
                                     : absl::StrCat(" --state_dir=", options.state_dir);
  std::printf(
      "\nGeneration API (trident.v1.Generation): %s (router)\nTry: trident generate \"Once upon "
      "a time\"%s\nPrometheus: %s\nLogs: %s/logs\nStop with: trident down%s\n",
      state->RouterAddress().c_str(), state_flag.c_str(), state->PrometheusUrl().c_str(),
      options.state_dir.c_str(), state_flag.c_str());
  return 0;
}

int Generate(const std::string& prompt) {
  trident::cli::GenerateOptions options;
  options.address = absl::GetFlag(FLAGS_address);
  if (options.address.empty()) {
    absl::StatusOr<trident::cli::ClusterState> state = trident::cli::LoadState(StateDir());
    if (!state.ok()) {
      std::fprintf(stderr,
                   "trident generate: %s (start one with `trident up`, or pass --address)\n",
                   std::string(state.status().message()).c_str());
      return 1;
    }
    options.address = state->RouterAddress();
    if (options.address.empty()) {
      std::fprintf(stderr, "trident generate: the cluster has no router; pass --address\n");
      return 1;
    }
    if (absl::Status tls = trident::cli::UseClusterTls(state->tls_dir); !tls.ok()) {
      std::fprintf(stderr, "trident generate: %s\n", std::string(tls.message()).c_str());
      return 1;
    }
  } else if (const std::string ca = absl::GetFlag(FLAGS_tls_ca_file); !ca.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        trident::TlsChannelCredentials({.ca_file = ca});
    if (!credentials.ok()) {
      std::fprintf(stderr, "trident generate: %s\n",
                   std::string(credentials.status().message()).c_str());
      return 1;
    }
    trident::SetClusterChannelCredentials(*credentials);
  }
  options.api_key = absl::GetFlag(FLAGS_api_key);
  if (const char* env = std::getenv("TRIDENT_API_KEY"); options.api_key.empty() && env != nullptr) {
    options.api_key = env;
  }
  options.prompt = prompt;
  options.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  options.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  if (absl::GetFlag(FLAGS_seed) >= 0) options.seed = absl::GetFlag(FLAGS_seed);
  options.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  absl::StatusOr<trident::cli::GenerateSummary> summary =
      trident::cli::StreamGeneration(options, stdout);
  std::printf("\n");
  std::fflush(stdout);
  if (!summary.ok()) {
    std::fprintf(stderr, "trident generate: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  std::fputs(trident::cli::FormatCompletion(summary->complete).c_str(), stderr);
  return 0;
}

int Status() {
  absl::StatusOr<trident::cli::ClusterState> state = trident::cli::LoadState(StateDir());
  if (!state.ok()) {
    std::fprintf(stderr, "trident status: %s\n", std::string(state.status().message()).c_str());
    return 1;
  }
  if (absl::Status tls = trident::cli::UseClusterTls(state->tls_dir); !tls.ok()) {
    std::fprintf(stderr, "trident status: %s\n", std::string(tls.message()).c_str());
    return 1;
  }
  const std::vector<trident::cli::ProcessStatus> statuses = trident::cli::CheckStatus(*state);
  PrintStatus(*state, statuses);
  return trident::cli::AllServing(statuses) ? 0 : 1;
}

int Down() {
  const absl::Status status =
      trident::cli::Down(StateDir(), absl::GetFlag(FLAGS_drain_timeout) + absl::Seconds(2));
  if (!status.ok()) {
    std::fprintf(stderr, "trident down: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  std::printf("Trident is down.\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "tools/cli/") || absl::StrContains(file, "common/logging");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  trident::log::InitLoggingFromFlags();
  if (args.size() < 2) {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  const std::string command = args[1];
  if (command == "generate") {
    if (args.size() != 3) {
      std::fprintf(stderr, "trident generate: give the prompt as one argument\n");
      return 2;
    }
    return Generate(args[2]);
  }
  if (args.size() != 2) {
    std::fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  if (command == "up") return Up();
  if (command == "status") return Status();
  if (command == "down") return Down();
  std::fprintf(stderr, "trident: unknown command '%s'\n\n%s\n", command.c_str(), kUsage);
  return 2;
}
