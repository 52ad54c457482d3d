// Workloads with prefix reuse for the KV-cache benchmarks (bench/kvbench):
// what each session sends and when, with no network and no clock in it.
//
//  * Chat: conversations that share one of a few system prompts; each turn
//    appends the previous answer (the tokens the server generated, known
//    only at run time) and a new user message to the history, ShareGPT-like
//    lengths (lognormal, clipped).
//  * Trace: the shape of Mooncake's published conversation trace, scaled:
//    every prompt starts with one shared head block, about half the sessions
//    have one turn, and a later turn's prompt is the previous turn's prompt
//    plus new blocks (the answer and the next question), so whole-block
//    reuse is what the trace's hash ids show. Prompts are fixed token ids,
//    the same for the same blocks.
//
// Every draw comes from a seeded generator with one stream per purpose.

#ifndef TRIDENT_BENCH_KVBENCH_WORKLOAD_H_
#define TRIDENT_BENCH_KVBENCH_WORKLOAD_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace trident::kvbench {

// One request of a session.
struct Turn {
  // Chat: the new user message, sent after the history (the previous
  // turns' prompts and answers). Trace: the whole prompt.
  std::vector<int32_t> tokens;
  int32_t output_tokens = 1;
  // Chat: the pause after the previous turn's answer. Trace: when the turn
  // is due, from the session's start (it waits for the previous turn).
  absl::Duration delay;
};

struct Session {
  int64_t id = 0;
  absl::Duration start;  // From the run's start; non-decreasing over sessions.
  bool chat = false;     // Turns extend the history (see Turn::tokens).
  std::vector<Turn> turns;
};

// Token ids a prompt may use: [first_id, vocab_size).
struct Vocabulary {
  int32_t vocab_size = 32000;
  int32_t first_id = 16;  // Below: special tokens, never sent.
};

struct ChatSpec {
  uint64_t seed = 1;
  int32_t sessions = 100;
  double session_rate = 1.0;  // New conversations per second (Poisson).
  int32_t system_prompts = 1;
  int32_t system_tokens = 1500;
  int32_t min_turns = 3;
  int32_t max_turns = 6;
  // Lognormal with this median (sigma 0.8), clipped to [4, max].
  double user_tokens_median = 80;
  int32_t user_tokens_max = 512;
  double output_tokens_median = 150;
  int32_t output_tokens_max = 512;
  double think_mean_s = 1.0;  // Exponential.
};

struct TraceSpec {
  uint64_t seed = 1;
  int32_t sessions = 200;
  double session_rate = 2.0;
  int32_t block_tokens = 512;  // The trace's hash-id granularity.
  // First prompt: the head block plus lognormal(median, sigma 1.0) tokens,
  // clipped to max_prompt_tokens over the whole session.
  double first_tokens_median = 1200;
  double append_tokens_median = 300;  // Per later turn (sigma 0.7).
  int32_t max_prompt_tokens = 7000;
  double single_turn_share = 0.75;
  double mean_extra_turns = 1.3;  // Geometric, for multi-turn sessions.
  double output_tokens_median = 120;
  int32_t output_tokens_max = 400;
  double turn_gap_mean_s = 8.0;
};

// INVALID_ARGUMENT naming the field for counts or rates out of range.
absl::StatusOr<std::vector<Session>> MakeChatSessions(const ChatSpec& spec,
                                                      const Vocabulary& vocab);
absl::StatusOr<std::vector<Session>> MakeTraceSessions(const TraceSpec& spec,
                                                       const Vocabulary& vocab);

// Fresh token ids (none shared with any session's), `count` of them.
std::vector<int32_t> FreshTokens(uint64_t seed, int32_t count, const Vocabulary& vocab);

// The ideal (infinite cache) prefix hit of prompts sent in this order: for
// each, the whole `block_tokens` blocks of its longest prefix some earlier
// prompt had (at most prompt length - 1 tokens), over all prompt tokens.
// Chat prompts, which carry earlier answers, need cached_after (below).
// With `cached_after` (one per prompt, or empty), the whole blocks of
// cached_after[i] (e.g. prompt i and its answer) count as seen after prompt
// i, as a server caches what it generated.
double IdealHitRate(absl::Span<const std::vector<int32_t>> prompts, int32_t block_tokens,
                    absl::Span<const std::vector<int32_t>> cached_after = {});

}  // namespace trident::kvbench

#endif  // TRIDENT_BENCH_KVBENCH_WORKLOAD_H_
