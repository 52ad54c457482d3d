#include "bench/kvbench/driver.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident::kvbench {
namespace {

namespace v1 = ::trident::v1;

// One turn: a greedy streaming Generate of exactly `output_tokens`.
RequestResult Generate(v1::Generation::Stub& stub, const std::vector<int32_t>& prompt,
                       int32_t output_tokens, absl::Duration timeout) {
  RequestResult r;
  r.prompt = prompt;
  r.wanted_tokens = output_tokens;
  v1::GenerateRequest request;
  for (int32_t t : prompt) request.mutable_token_ids()->add_ids(t);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(output_tokens);
  request.mutable_stop()->set_ignore_eos(true);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const absl::Time sent = absl::Now();
  absl::Time first, last;
  auto reader = stub.Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.has_chunk() && response.chunk().token_ids_size() > 0) {
      last = absl::Now();
      if (r.output.empty()) first = last;
      r.output.insert(r.output.end(), response.chunk().token_ids().begin(),
                      response.chunk().token_ids().end());
    }
    if (response.has_complete()) {
      r.cached_tokens = response.complete().usage().cached_tokens();
      r.dram_cached_tokens = response.complete().usage().dram_cached_tokens();
    }
  }
  const grpc::Status status = reader->Finish();
  r.e2e = absl::Now() - sent;
  r.ok = status.ok() && static_cast<int32_t>(r.output.size()) == output_tokens;
  if (!status.ok()) r.error = status.error_message();
  if (!r.output.empty()) r.ttft = first - sent;
  if (r.output.size() > 1) r.tpot = (last - first) / static_cast<double>(r.output.size() - 1);
  return r;
}

// Runs one session's turns in order.
void RunSession(const Session& session, absl::Time start, v1::Generation::Stub& stub,
                const DriverOptions& options, std::vector<RequestResult>* out) {
  std::vector<int32_t> history;
  const absl::Time session_start = start + session.start;
  absl::Time previous_end = session_start;
  for (size_t t = 0; t < session.turns.size(); ++t) {
    const Turn& turn = session.turns[t];
    const absl::Time due = session.chat ? previous_end + turn.delay : session_start + turn.delay;
    if (due > start + options.max_run) return;
    absl::SleepFor(due - absl::Now());
    std::vector<int32_t> prompt = session.chat ? history : turn.tokens;
    if (session.chat) prompt.insert(prompt.end(), turn.tokens.begin(), turn.tokens.end());
    const absl::Time sent = absl::Now();
    RequestResult r = Generate(stub, prompt, turn.output_tokens, options.request_timeout);
    r.session = session.id;
    r.turn = static_cast<int32_t>(t);
    r.send_offset = sent - start;
    r.send_lag = std::max(absl::ZeroDuration(), sent - due);
    previous_end = absl::Now();
    const bool ok = r.ok;
    if (session.chat) {
      history = r.prompt;
      history.insert(history.end(), r.output.begin(), r.output.end());
    }
    out->push_back(std::move(r));
    if (!ok) return;  // A conversation does not go on past a failed turn.
  }
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - static_cast<double>(lo));
}

}  // namespace

struct Generator::Stub {
  std::unique_ptr<v1::Generation::Stub> stub;
};

Generator::Generator(const std::string& target)
    : stub_(new Stub{v1::Generation::NewStub(
          grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))}) {}

Generator::~Generator() = default;

RequestResult Generator::GenerateOnce(const std::vector<int32_t>& prompt, int32_t output_tokens,
                                      absl::Duration timeout) {
  return Generate(*stub_->stub, prompt, output_tokens, timeout);
}

absl::StatusOr<Vocabulary> FetchVocabulary(const std::string& target) {
  auto stub = v1::Generation::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  context.set_wait_for_ready(true);
  v1::ModelInfoResponse info;
  const grpc::Status status = stub->ModelInfo(&context, v1::ModelInfoRequest(), &info);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("ModelInfo from ", target, ": ",
                                               status.error_message()));
  }
  Vocabulary vocab;
  vocab.vocab_size = info.vocab_size();
  // Stay clear of the special tokens, which sit at either end of the ids.
  const int32_t margin = std::min(256, info.vocab_size() / 8);
  vocab.first_id = std::min(16, margin);
  vocab.vocab_size = std::max(vocab.first_id + 1, info.vocab_size() - margin);
  return vocab;
}

absl::StatusOr<std::vector<RequestResult>> RunSessions(const std::vector<Session>& sessions,
                                                       const DriverOptions& options) {
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs;
  for (int i = 0; i < 4; ++i) {
    grpc::ChannelArguments args;
    args.SetInt("trident.kvbench.channel", i);  // One connection each.
    stubs.push_back(v1::Generation::NewStub(
        grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args)));
  }
  const absl::Time start = absl::Now();
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  std::vector<RequestResult> results;
  std::vector<std::thread> threads;
  for (int32_t i = 0; i < std::max(1, options.threads); ++i) {
    threads.emplace_back([&, i] {
      v1::Generation::Stub& stub = *stubs[i % stubs.size()];
      for (size_t s = next++; s < sessions.size(); s = next++) {
        std::vector<RequestResult> out;
        RunSession(sessions[s], start, stub, options, &out);
        absl::MutexLock lock(&mu);
        for (RequestResult& r : out) results.push_back(std::move(r));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::sort(results.begin(), results.end(), [](const RequestResult& a, const RequestResult& b) {
    return a.send_offset < b.send_offset;
  });
  return results;
}

RunSummary Summarize(const std::vector<RequestResult>& results, const DriverOptions& options,
                     int32_t block_tokens) {
  RunSummary s;
  std::vector<double> ttft, tpot, lag;
  std::vector<std::vector<int32_t>> prompts, after;
  absl::Duration first = absl::InfiniteDuration(), last = absl::ZeroDuration();
  int64_t good = 0, completed = 0, dram = 0;
  for (const RequestResult& r : results) {
    ++s.requests;
    prompts.push_back(r.prompt);
    after.push_back(r.prompt);
    after.back().insert(after.back().end(), r.output.begin(), r.output.end());
    first = std::min(first, r.send_offset);
    last = std::max(last, r.send_offset + r.e2e);
    lag.push_back(absl::ToDoubleMilliseconds(r.send_lag));
    if (!r.ok) {
      if (s.failed++ == 0) s.first_error = r.error.empty() ? "too few tokens" : r.error;
      continue;
    }
    ++completed;
    s.prompt_tokens += static_cast<int64_t>(r.prompt.size());
    s.cached_tokens += r.cached_tokens;
    dram += r.dram_cached_tokens;
    ttft.push_back(absl::ToDoubleMilliseconds(r.ttft));
    if (r.output.size() > 1) tpot.push_back(absl::ToDoubleMilliseconds(r.tpot));
    if (r.ttft <= options.ttft_slo && r.tpot <= options.tpot_slo) ++good;
  }
  s.window_s = s.requests > 0 ? absl::ToDoubleSeconds(last - first) : 0;
  s.ttft_p50_ms = Percentile(ttft, 0.5);
  s.ttft_p90_ms = Percentile(ttft, 0.9);
  s.ttft_p99_ms = Percentile(ttft, 0.99);
  s.tpot_p50_ms = Percentile(tpot, 0.5);
  s.tpot_p90_ms = Percentile(tpot, 0.9);
  s.send_lag_p99_ms = Percentile(lag, 0.99);
  if (s.window_s > 0) {
    s.goodput_rps = static_cast<double>(good) / s.window_s;
    s.throughput_rps = static_cast<double>(completed) / s.window_s;
  }
  if (s.prompt_tokens > 0) {
    s.hit_rate = static_cast<double>(s.cached_tokens) / static_cast<double>(s.prompt_tokens);
    s.dram_hit_rate = static_cast<double>(dram) / static_cast<double>(s.prompt_tokens);
  }
  s.ideal_hit_rate = IdealHitRate(prompts, block_tokens, after);
  return s;
}

nlohmann::json RunSummary::ToJson() const {
  return {{"requests", requests},         {"failed", failed},
          {"window_s", window_s},         {"ttft_p50_ms", ttft_p50_ms},
          {"ttft_p90_ms", ttft_p90_ms},   {"ttft_p99_ms", ttft_p99_ms},
          {"tpot_p50_ms", tpot_p50_ms},   {"tpot_p90_ms", tpot_p90_ms},
          {"goodput_rps", goodput_rps},   {"throughput_rps", throughput_rps},
          {"hit_rate", hit_rate},         {"dram_hit_rate", dram_hit_rate},
          {"ideal_hit_rate", ideal_hit_rate}, {"prompt_tokens", prompt_tokens},
          {"cached_tokens", cached_tokens}, {"send_lag_p99_ms", send_lag_p99_ms}};
}

std::string RunSummary::Format() const {
  return absl::StrFormat(
      "requests %d (failed %d) over %.1f s; TTFT p50/p90/p99 %.1f/%.1f/%.1f ms; TPOT p50/p90 "
      "%.2f/%.2f ms; goodput %.2f req/s of %.2f; token hit rate %.3f (dram %.3f; ideal %.3f); "
      "send lag p99 %.1f ms%s",
      requests, failed, window_s, ttft_p50_ms, ttft_p90_ms, ttft_p99_ms, tpot_p50_ms, tpot_p90_ms,
      goodput_rps, throughput_rps, hit_rate, dram_hit_rate, ideal_hit_rate, send_lag_p99_ms,
      first_error.empty() ? "" : absl::StrCat("; first failure: ", first_error));
}

}  // namespace trident::kvbench
