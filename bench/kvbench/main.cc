// kvbench: the KV-cache benchmarks' client. Runs multi-turn chat or a
// Mooncake-shaped trace (workload.h) against a Generation server (a router,
// or a worker in role both) and prints TTFT, TPOT, goodput and the prefix
// hit rate against the ideal one; see bench/kv_cache.sh.
//
//   kvbench --target=127.0.0.1:50051 --mode=chat --session_rate=2 --sessions=100
//   kvbench --mode=trace --ideal_only      # the trace's ideal hit, no server

#include <algorithm>
#include <fstream>
#include <utility>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/kvbench/driver.h"
#include "bench/kvbench/workload.h"

ABSL_FLAG(std::string, target, "", "host:port of the Generation server.");
ABSL_FLAG(std::string, mode, "chat",
          "chat, trace, or tier: TTFT of a prompt the worker's cache holds (GPU hit), one only "
          "the DRAM tier holds (evicted here, fetched), and a fresh one (miss), one at a time.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the workload.");
ABSL_FLAG(int32_t, sessions, 100, "Sessions (conversations) to run.");
ABSL_FLAG(double, session_rate, 1.0, "New sessions per second (Poisson).");
ABSL_FLAG(int32_t, system_prompts, 1, "chat: distinct shared system prompts.");
ABSL_FLAG(int32_t, system_tokens, 1500, "chat: tokens of each system prompt.");
ABSL_FLAG(int32_t, min_turns, 3, "chat: turns per conversation, at least.");
ABSL_FLAG(int32_t, max_turns, 6, "chat: turns per conversation, at most.");
ABSL_FLAG(double, user_tokens, 80, "chat: median tokens of a user message.");
ABSL_FLAG(double, output_tokens, 150, "Median tokens of an answer.");
ABSL_FLAG(int32_t, max_output_tokens, 512, "Longest answer.");
ABSL_FLAG(double, think_s, 1.0, "chat: mean pause between an answer and the next turn.");
ABSL_FLAG(int32_t, trace_block_tokens, 512, "trace: tokens per trace block (hash id).");
ABSL_FLAG(int32_t, max_prompt_tokens, 7000, "trace: longest prompt.");
ABSL_FLAG(double, first_tokens, 1200, "trace: median tokens of a session's first prompt.");
ABSL_FLAG(double, append_tokens, 300, "trace: median tokens a later turn adds.");
ABSL_FLAG(double, turn_gap_s, 8.0, "trace: mean gap between a session's turns.");
ABSL_FLAG(double, max_run_s, 0, "No turn starts this many seconds after the start (0: no limit).");
ABSL_FLAG(int32_t, threads, 64, "Client threads (sessions in flight at most).");
ABSL_FLAG(double, ttft_slo_ms, 300, "TTFT target for goodput.");
ABSL_FLAG(double, tpot_slo_ms, 25, "TPOT target for goodput.");
ABSL_FLAG(int32_t, block_tokens, 16, "Block size of the ideal hit rate (the servers').");
ABSL_FLAG(bool, uncached_control, false,
          "chat: afterwards, send each request's uncached tokens alone as a fresh prompt at the "
          "same times (prefilling only what the cache lacked), and report both.");
ABSL_FLAG(bool, ideal_only, false, "trace: print the workload's ideal hit rate and exit.");
ABSL_FLAG(int32_t, tier_prompts, 16,
          "tier: distinct prompts cycled (their KV several times the worker's pool).");
ABSL_FLAG(int32_t, tier_prompt_tokens, 4096, "tier: tokens of each prompt.");
ABSL_FLAG(int32_t, tier_rounds, 8, "tier: measured rounds (a miss, a GPU hit, a DRAM hit each).");
ABSL_FLAG(double, tier_settle_s, 5.0,
          "tier: pause after the warm-up for the write-through to finish.");
ABSL_FLAG(std::string, json_out, "", "Write the summary (and the control's) here as JSON.");

namespace trident::kvbench {
namespace {

absl::StatusOr<std::vector<Session>> MakeSessions(const Vocabulary& vocab) {
  if (absl::GetFlag(FLAGS_mode) == "chat") {
    ChatSpec spec;
    spec.seed = absl::GetFlag(FLAGS_seed);
    spec.sessions = absl::GetFlag(FLAGS_sessions);
    spec.session_rate = absl::GetFlag(FLAGS_session_rate);
    spec.system_prompts = absl::GetFlag(FLAGS_system_prompts);
    spec.system_tokens = absl::GetFlag(FLAGS_system_tokens);
    spec.min_turns = absl::GetFlag(FLAGS_min_turns);
    spec.max_turns = absl::GetFlag(FLAGS_max_turns);
    spec.user_tokens_median = absl::GetFlag(FLAGS_user_tokens);
    spec.output_tokens_median = absl::GetFlag(FLAGS_output_tokens);
    spec.output_tokens_max = absl::GetFlag(FLAGS_max_output_tokens);
    spec.think_mean_s = absl::GetFlag(FLAGS_think_s);
    return MakeChatSessions(spec, vocab);
  }
  if (absl::GetFlag(FLAGS_mode) == "trace") {
    TraceSpec spec;
    spec.seed = absl::GetFlag(FLAGS_seed);
    spec.sessions = absl::GetFlag(FLAGS_sessions);
    spec.session_rate = absl::GetFlag(FLAGS_session_rate);
    spec.block_tokens = absl::GetFlag(FLAGS_trace_block_tokens);
    spec.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
    spec.first_tokens_median = absl::GetFlag(FLAGS_first_tokens);
    spec.append_tokens_median = absl::GetFlag(FLAGS_append_tokens);
    spec.output_tokens_median = absl::GetFlag(FLAGS_output_tokens);
    spec.output_tokens_max = absl::GetFlag(FLAGS_max_output_tokens);
    spec.turn_gap_mean_s = absl::GetFlag(FLAGS_turn_gap_s);
    return MakeTraceSessions(spec, vocab);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--mode: expected chat or trace, got ", absl::GetFlag(FLAGS_mode)));
}

// The control: each completed request's uncached tokens as a fresh prompt,
// sent at the same offset, one turn per session.
std::vector<Session> UncachedControl(const std::vector<RequestResult>& results,
                                     const Vocabulary& vocab) {
  std::vector<Session> control;
  for (const RequestResult& r : results) {
    if (!r.ok) continue;
    Session s;
    s.id = static_cast<int64_t>(control.size());
    s.start = r.send_offset;
    Turn turn;
    const int32_t uncached =
        std::max<int32_t>(1, static_cast<int32_t>(r.prompt.size()) - r.cached_tokens);
    // Fresh for this run too: an earlier run's control left its prompts cached.
    turn.tokens = FreshTokens(static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) +
                                  static_cast<uint64_t>(s.id) * 7919,
                              uncached, vocab);
    turn.output_tokens = r.wanted_tokens;
    s.turns.push_back(std::move(turn));
    control.push_back(std::move(s));
  }
  return control;
}

// The DRAM tier: prompts cycled through a worker whose pool holds a few of
// them; each round times a miss, a GPU hit and a DRAM hit.
int RunTier(const std::string& target, const Vocabulary& vocab) {
  const int32_t count = absl::GetFlag(FLAGS_tier_prompts);
  const int32_t length = absl::GetFlag(FLAGS_tier_prompt_tokens);
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < count; ++i) prompts.push_back(FreshTokens(1000 + i, length, vocab));
  // Greedy outputs of the warm-up (computed, nothing cached), to compare
  // the hits' with.
  constexpr int32_t kOutput = 16;
  Generator generator(target);
  std::vector<std::vector<int32_t>> computed;
  for (const std::vector<int32_t>& p : prompts) {
    RequestResult r = generator.GenerateOnce(p, kOutput);
    if (!r.ok) return std::cerr << "warm-up failed: " << r.error << "\n", 1;
    computed.push_back(std::move(r.output));
  }
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_tier_settle_s)));
  std::vector<RequestResult> miss, gpu, dram;
  int gpu_equal = 0, dram_equal = 0;
  for (int32_t r = 0; r < absl::GetFlag(FLAGS_tier_rounds); ++r) {
    const std::vector<int32_t> fresh = FreshTokens(5000 + r, length, vocab);
    miss.push_back(generator.GenerateOnce(fresh, kOutput));
    gpu.push_back(generator.GenerateOnce(fresh, kOutput));
    if (gpu.back().output == miss.back().output) ++gpu_equal;
    // The prompt sent longest ago: evicted here, held by the store.
    dram.push_back(generator.GenerateOnce(prompts[r % count], kOutput));
    if (dram.back().output == computed[r % count]) ++dram_equal;
  }
  std::cout << "greedy outputs equal to computing the prompt: GPU hits " << gpu_equal << " of "
            << gpu.size() << ", DRAM hits " << dram_equal << " of " << dram.size() << "\n";
  nlohmann::json json = {{"mode", "tier"},          {"prompt_tokens", length},
                         {"prompts", count},          {"gpu_hits_equal", gpu_equal},
                         {"dram_hits_equal", dram_equal}, {"rounds", gpu.size()}};
  for (const auto& [name, results] :
       {std::pair{"miss", &miss}, std::pair{"gpu_hit", &gpu}, std::pair{"dram_hit", &dram}}) {
    std::vector<double> ttft;
    int64_t cached = 0, from_dram = 0, failed = 0;
    for (const RequestResult& r : *results) {
      if (!r.ok) {
        ++failed;
        continue;
      }
      ttft.push_back(absl::ToDoubleMilliseconds(r.ttft));
      cached += r.cached_tokens;
      from_dram += r.dram_cached_tokens;
    }
    std::sort(ttft.begin(), ttft.end());
    const double p50 = ttft.empty() ? 0 : ttft[ttft.size() / 2];
    const double n = std::max<double>(1, static_cast<double>(ttft.size()));
    std::cout << name << ": TTFT p50 " << p50 << " ms over " << ttft.size() << " requests ("
              << failed << " failed); cached " << cached / n << " tokens a request, " << from_dram / n
              << " of them fetched from DRAM\n";
    json[name] = {{"ttft_p50_ms", p50},
                  {"cached_tokens_mean", cached / n},
                  {"dram_cached_tokens_mean", from_dram / n},
                  {"failed", failed}};
  }
  if (const std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    std::ofstream(path) << json.dump(2) << "\n";
  }
  return 0;
}

int Run() {
  if (absl::GetFlag(FLAGS_ideal_only)) {
    absl::StatusOr<std::vector<Session>> sessions = MakeSessions(Vocabulary{});
    if (!sessions.ok()) return std::cerr << sessions.status() << "\n", 2;
    std::vector<std::vector<int32_t>> prompts;
    int64_t tokens = 0;
    for (const Session& s : *sessions) {
      for (const Turn& t : s.turns) {
        prompts.push_back(t.tokens);
        tokens += static_cast<int64_t>(t.tokens.size());
      }
    }
    std::cout << prompts.size() << " requests, " << tokens / std::max<size_t>(1, prompts.size())
              << " prompt tokens on average; ideal hit rate "
              << IdealHitRate(prompts, absl::GetFlag(FLAGS_block_tokens)) << "\n";
    return 0;
  }
  const std::string target = absl::GetFlag(FLAGS_target);
  absl::StatusOr<Vocabulary> vocab = FetchVocabulary(target);
  if (!vocab.ok()) return std::cerr << vocab.status() << "\n", 1;
  if (absl::GetFlag(FLAGS_mode) == "tier") return RunTier(target, *vocab);
  absl::StatusOr<std::vector<Session>> sessions = MakeSessions(*vocab);
  if (!sessions.ok()) return std::cerr << sessions.status() << "\n", 2;
  DriverOptions options{.target = target,
                        .threads = absl::GetFlag(FLAGS_threads),
                        .ttft_slo = absl::Milliseconds(absl::GetFlag(FLAGS_ttft_slo_ms)),
                        .tpot_slo = absl::Milliseconds(absl::GetFlag(FLAGS_tpot_slo_ms))};
  if (absl::GetFlag(FLAGS_max_run_s) > 0) {
    options.max_run = absl::Seconds(absl::GetFlag(FLAGS_max_run_s));
  }
  absl::StatusOr<std::vector<RequestResult>> results = RunSessions(*sessions, options);
  if (!results.ok()) return std::cerr << results.status() << "\n", 1;
  const int32_t block = absl::GetFlag(FLAGS_block_tokens);
  const RunSummary summary = Summarize(*results, options, block);
  std::cout << absl::GetFlag(FLAGS_mode) << ": " << summary.Format() << "\n";
  nlohmann::json json = {{"mode", absl::GetFlag(FLAGS_mode)}, {"run", summary.ToJson()}};
  if (absl::GetFlag(FLAGS_uncached_control)) {
    absl::StatusOr<std::vector<RequestResult>> control =
        RunSessions(UncachedControl(*results, *vocab), options);
    if (!control.ok()) return std::cerr << control.status() << "\n", 1;
    const RunSummary c = Summarize(*control, options, block);
    std::cout << "uncached control: " << c.Format() << "\n";
    json["uncached_control"] = c.ToJson();
  }
  if (const std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    std::ofstream(path) << json.dump(2) << "\n";
  }
  return summary.failed == 0 ? 0 : 3;
}

}  // namespace
}  // namespace trident::kvbench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return trident::kvbench::Run();
}
