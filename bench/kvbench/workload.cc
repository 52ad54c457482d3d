#include "bench/kvbench/workload.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "bench/loadgen/workload.h"

namespace trident::kvbench {
namespace {

using loadgen::DeriveSeed;

// One purpose's draws: loadgen's generator (the same on every platform)
// on a stream of its own, with the shapes the workloads use.
class Stream {
 public:
  Stream(uint64_t seed, uint64_t purpose) : rng_(DeriveSeed(seed, purpose)) {}
  double Uniform() { return rng_.Uniform01(); }
  double Exponential(double mean) { return rng_.Exponential(mean); }
  int32_t LogNormal(double median, double sigma, int32_t lo, int32_t hi) {
    const double v = median * std::exp(sigma * rng_.Normal());
    return static_cast<int32_t>(std::clamp<double>(std::round(v), lo, hi));
  }
  int32_t Uniform(int32_t lo, int32_t hi) { return static_cast<int32_t>(rng_.UniformInt(lo, hi)); }
  int32_t Token(const Vocabulary& vocab) { return Uniform(vocab.first_id, vocab.vocab_size - 1); }

 private:
  loadgen::Rng rng_;
};

enum Purpose : uint64_t { kArrivals = 1, kSystem, kTurns, kLengths, kTokens, kGaps };

absl::Status Positive(const char* name, double value) {
  if (value > 0 && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(name, " must be positive, got ", value));
}

absl::Status CheckVocabulary(const Vocabulary& vocab) {
  if (vocab.first_id < 0 || vocab.vocab_size <= vocab.first_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("no token ids in [", vocab.first_id, ", ", vocab.vocab_size, ")"));
  }
  return absl::OkStatus();
}

// The tokens of trace block `id`: the same for the same id.
std::vector<int32_t> BlockTokens(uint64_t seed, uint64_t id, int32_t count,
                                 const Vocabulary& vocab) {
  Stream stream(DeriveSeed(seed, kTokens), id);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = stream.Token(vocab);
  return tokens;
}

}  // namespace

std::vector<int32_t> FreshTokens(uint64_t seed, int32_t count, const Vocabulary& vocab) {
  return BlockTokens(DeriveSeed(seed, 0x5eed), 0, count, vocab);
}

absl::StatusOr<std::vector<Session>> MakeChatSessions(const ChatSpec& spec,
                                                      const Vocabulary& vocab) {
  if (absl::Status s = CheckVocabulary(vocab); !s.ok()) return s;
  if (absl::Status s = Positive("--session_rate", spec.session_rate); !s.ok()) return s;
  if (spec.sessions < 1 || spec.system_prompts < 1 || spec.system_tokens < 0 ||
      spec.min_turns < 1 || spec.max_turns < spec.min_turns) {
    return absl::InvalidArgumentError(
        "--sessions, --system_prompts and --min_turns must be >= 1 and --max_turns >= --min_turns");
  }
  Stream arrivals(spec.seed, kArrivals), system(spec.seed, kSystem), turns(spec.seed, kTurns),
      lengths(spec.seed, kLengths), tokens(spec.seed, kTokens), gaps(spec.seed, kGaps);
  std::vector<std::vector<int32_t>> prompts(spec.system_prompts);
  for (int32_t i = 0; i < spec.system_prompts; ++i) {
    prompts[i] = BlockTokens(spec.seed, 1000 + i, spec.system_tokens, vocab);
  }
  std::vector<Session> sessions(spec.sessions);
  absl::Duration at;
  for (int32_t i = 0; i < spec.sessions; ++i) {
    Session& s = sessions[i];
    s.id = i;
    s.chat = true;
    at += absl::Seconds(arrivals.Exponential(1.0 / spec.session_rate));
    s.start = at;
    const int32_t n = turns.Uniform(spec.min_turns, spec.max_turns);
    for (int32_t t = 0; t < n; ++t) {
      Turn turn;
      if (t == 0) turn.tokens = prompts[system.Uniform(0, spec.system_prompts - 1)];
      const int32_t user = lengths.LogNormal(spec.user_tokens_median, 0.8, 4, spec.user_tokens_max);
      for (int32_t k = 0; k < user; ++k) turn.tokens.push_back(tokens.Token(vocab));
      turn.output_tokens =
          lengths.LogNormal(spec.output_tokens_median, 0.8, 4, spec.output_tokens_max);
      if (t > 0) turn.delay = absl::Seconds(gaps.Exponential(spec.think_mean_s));
      s.turns.push_back(std::move(turn));
    }
  }
  return sessions;
}

absl::StatusOr<std::vector<Session>> MakeTraceSessions(const TraceSpec& spec,
                                                       const Vocabulary& vocab) {
  if (absl::Status s = CheckVocabulary(vocab); !s.ok()) return s;
  if (absl::Status s = Positive("--session_rate", spec.session_rate); !s.ok()) return s;
  if (spec.sessions < 1 || spec.block_tokens < 1 || spec.max_prompt_tokens <= spec.block_tokens) {
    return absl::InvalidArgumentError(
        "--sessions and --block_tokens must be >= 1, --max_prompt_tokens above a block");
  }
  Stream arrivals(spec.seed, kArrivals), turns(spec.seed, kTurns), lengths(spec.seed, kLengths),
      gaps(spec.seed, kGaps);
  const std::vector<int32_t> head = BlockTokens(spec.seed, 0, spec.block_tokens, vocab);
  std::vector<Session> sessions(spec.sessions);
  absl::Duration at;
  uint64_t next_block = 1;
  for (int32_t i = 0; i < spec.sessions; ++i) {
    Session& s = sessions[i];
    s.id = i;
    at += absl::Seconds(arrivals.Exponential(1.0 / spec.session_rate));
    s.start = at;
    int32_t n = 1;
    if (turns.Uniform() >= spec.single_turn_share) {
      n = 2 + static_cast<int32_t>(turns.Exponential(std::max(spec.mean_extra_turns - 1, 0.01)));
    }
    std::vector<int32_t> prompt = head;
    absl::Duration due;
    for (int32_t t = 0; t < n; ++t) {
      int32_t add =
          t == 0 ? lengths.LogNormal(spec.first_tokens_median, 1.0, 1, spec.max_prompt_tokens)
                 : lengths.LogNormal(spec.append_tokens_median, 0.7, 1, spec.max_prompt_tokens);
      const int32_t room = spec.max_prompt_tokens - static_cast<int32_t>(prompt.size());
      if (t > 0 && add > room) break;  // The session ends at the longest prompt.
      add = std::min(add, room);
      // New whole blocks (their ids unique to this session), then the rest.
      for (int32_t left = add; left > 0; left -= spec.block_tokens) {
        const std::vector<int32_t> block =
            BlockTokens(spec.seed, next_block++, std::min(left, spec.block_tokens), vocab);
        prompt.insert(prompt.end(), block.begin(), block.end());
      }
      Turn turn;
      turn.tokens = prompt;
      turn.output_tokens =
          lengths.LogNormal(spec.output_tokens_median, 0.8, 4, spec.output_tokens_max);
      if (t > 0) due += absl::Seconds(gaps.Exponential(spec.turn_gap_mean_s));
      turn.delay = due;
      s.turns.push_back(std::move(turn));
      // The next turn starts on a block boundary, as the trace's do.
      prompt.resize(prompt.size() / spec.block_tokens * spec.block_tokens);
    }
  }
  return sessions;
}

double IdealHitRate(absl::Span<const std::vector<int32_t>> prompts, int32_t block_tokens,
                    absl::Span<const std::vector<int32_t>> cached_after) {
  absl::flat_hash_set<uint64_t> seen;
  int64_t total = 0, hit = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& prompt = prompts[i];
    total += static_cast<int64_t>(prompt.size());
    const size_t blocks = prompt.empty() ? 0 : (prompt.size() - 1) / block_tokens;
    uint64_t chain = 0;
    bool matching = true;
    for (size_t b = 0; b < blocks; ++b) {
      const auto first = prompt.begin() + static_cast<std::ptrdiff_t>(b * block_tokens);
      chain = absl::HashOf(chain, std::vector<int32_t>(first, first + block_tokens));
      if (matching && seen.contains(chain)) {
        hit += block_tokens;
      } else {
        matching = false;
      }
      seen.insert(chain);
    }
    if (i < cached_after.size()) {
      const std::vector<int32_t>& after = cached_after[i];
      chain = 0;
      for (size_t b = 0; (b + 1) * block_tokens <= after.size(); ++b) {
        const auto first = after.begin() + static_cast<std::ptrdiff_t>(b * block_tokens);
        chain = absl::HashOf(chain, std::vector<int32_t>(first, first + block_tokens));
        seen.insert(chain);
      }
    }
  }
  return total > 0 ? static_cast<double>(hit) / static_cast<double>(total) : 0.0;
}

}  // namespace trident::kvbench
