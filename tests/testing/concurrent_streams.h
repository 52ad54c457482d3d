// Concurrent Generate streams through a router for fault tests: what each
// stream received, in order, with a hook that runs mid-way (once every
// stream has some tokens), and a checker that compares a faulted run with
// an unfaulted one (Jepsen's lost / duplicated / unexpected, per token).

#ifndef TRIDENT_TESTS_TESTING_CONCURRENT_STREAMS_H_
#define TRIDENT_TESTS_TESTING_CONCURRENT_STREAMS_H_

#include <algorithm>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "tests/testing/service_process.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident::testing {

// One client stream's record.
struct StreamRecord {
  std::vector<int32_t> tokens;
  int completions = 0;
  trident::v1::GenerateComplete complete;
  grpc::Status status;
  bool done = false;
};

// Stream i of a fault run: a prompt of 24 + 3i tokens, `max_tokens`
// tokens, greedy when i is even, else seeded sampling with penalties.
inline trident::v1::GenerateRequest FaultStreamRequest(int i, int max_tokens) {
  trident::v1::GenerateRequest request;
  for (int t = 0; t < 24 + 3 * i; ++t) request.mutable_token_ids()->add_ids((t * 31 + i) % 250);
  trident::v1::SamplingParams& s = *request.mutable_sampling();
  s.set_max_tokens(max_tokens);
  if (i % 2 == 0) {
    s.set_temperature(0);
  } else {
    s.set_temperature(0.9f);
    s.set_top_k(40);
    s.set_seed(1000 + i);
    s.set_presence_penalty(0.4f);
    s.set_frequency_penalty(0.2f);
  }
  request.mutable_stop()->set_ignore_eos(true);
  return request;
}

// Until the router has its workers' load it refuses requests at once
// (RESOURCE_EXHAUSTED): sends one-token generations until one gets
// through, for up to 30 s; returns its status.
inline grpc::Status AwaitRouterServing(const ServiceProcess& router) {
  auto stub = trident::v1::Generation::NewStub(router.channel);
  trident::v1::GenerateRequest probe = FaultStreamRequest(0, 1);
  grpc::Status status;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    grpc::ClientContext context;
    auto reader = stub->Generate(&context, probe);
    trident::v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    status = reader->Finish();
  } while (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && absl::Now() < deadline);
  return status;
}

// Runs `n` streams at once (FaultStreamRequest first .. first + n - 1), one
// client thread each; `mid_way` runs once every stream has `tokens_before`
// tokens (or ended), or, with tokens_before < 0, before any stream starts.
inline std::vector<StreamRecord> RunConcurrentStreams(const ServiceProcess& router, int n,
                                                      int max_tokens, int tokens_before,
                                                      const std::function<void()>& mid_way,
                                                      int first = 0) {
  std::vector<StreamRecord> streams(static_cast<size_t>(n));
  absl::Mutex mu;
  std::vector<std::thread> threads;
  auto stub = trident::v1::Generation::NewStub(router.channel);
  if (tokens_before < 0) mid_way();
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      StreamRecord& record = streams[static_cast<size_t>(i)];
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      auto reader = stub->Generate(&context, FaultStreamRequest(first + i, max_tokens));
      trident::v1::GenerateResponse response;
      while (reader->Read(&response)) {
        absl::MutexLock lock(&mu);
        if (response.has_chunk()) {
          for (int32_t t : response.chunk().token_ids()) record.tokens.push_back(t);
        } else if (response.has_complete()) {
          ++record.completions;
          record.complete = response.complete();
        }
      }
      const grpc::Status status = reader->Finish();
      absl::MutexLock lock(&mu);
      record.status = status;
      record.done = true;
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      for (const StreamRecord& s : streams) {
        if (!s.done && static_cast<int>(s.tokens.size()) < tokens_before) return false;
      }
      return true;
    };
    mu.Await(absl::Condition(&ready));
  }
  if (tokens_before >= 0) mid_way();
  for (std::thread& t : threads) t.join();
  return streams;
}

// A faulted stream against its unfaulted reference.
struct StreamCheck {
  // Exactly one terminal state: OK with one completion.
  bool one_terminal_state = false;
  // Reference tokens missing at the end, tokens beyond the reference, and
  // positions where the two differ.
  int lost = 0;
  int duplicated = 0;
  int mismatched = 0;
  bool ok() const { return one_terminal_state && lost == 0 && duplicated == 0 && mismatched == 0; }
};

inline StreamCheck CheckStream(const StreamRecord& got, const StreamRecord& reference) {
  StreamCheck c;
  c.one_terminal_state = got.status.ok() && got.completions == 1;
  const size_t common = std::min(got.tokens.size(), reference.tokens.size());
  for (size_t i = 0; i < common; ++i) c.mismatched += got.tokens[i] != reference.tokens[i] ? 1 : 0;
  if (got.tokens.size() < reference.tokens.size()) {
    c.lost = static_cast<int>(reference.tokens.size() - got.tokens.size());
  } else {
    c.duplicated = static_cast<int>(got.tokens.size() - reference.tokens.size());
  }
  return c;
}

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_CONCURRENT_STREAMS_H_
