// The DRAM tier of the prefix cache across processes (CPU backend, fp32,
// UCX tcp and posix shared memory): two workers in role both and a CPU
// attention service with a block store.
//
//  * Worker A computes a prompt (nothing cached) and writes its cached
//    blocks through to the store.
//  * Worker B, which never saw the prompt, fetches those blocks from the
//    store instead of computing them: its usage reports them as cached and
//    as served from DRAM, and its greedy tokens equal A's.
//  * At the end the store holds no reservation and no pin (every put
//    written, every fetch released), and each worker's KV pool is all free.
//  * Disaggregated: a prefill worker behind a router fetches the prefix the
//    same way, and the router's usage says so.
//  * A sequence moved to the store's service for CPU attention reads its
//    prefix there in place, and copies only the rest.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/http/http_client.h"
#include "common/kv/block_hasher.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/disaggregated_call.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/service_process.h"
#include "trident/v1/attention.grpc.pb.h"
#include "trident/v1/generation.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident {
namespace {

using testing::IsOk;
using testing::RunfilePath;
using testing::ServiceProcess;
using testing::TestTmpPath;
namespace v1 = ::trident::v1;

constexpr int32_t kBlockSize = 16;
constexpr int32_t kPromptTokens = 100;
// Whole blocks of the prompt a cache may serve: (100 - 1) / 16.
constexpr int32_t kCachedBlocks = 6;

struct Param {
  const char* model;
  const char* transport;
};

std::string Name(const ::testing::TestParamInfo<Param>& info) {
  std::string name = absl::StrCat(info.param.model, "_", info.param.transport);
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

// The test's prompt; `variant` > 0 gives others sharing no block with it.
std::vector<int32_t> Prompt(int variant = 0) {
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < kPromptTokens; ++t) prompt.push_back(1 + (11 * t + 5 + variant) % 200);
  return prompt;
}

struct Result {
  grpc::Status status;
  std::vector<int32_t> tokens;
  v1::Usage usage;
};

Result Generate(const ServiceProcess& worker, const std::string& id, int variant = 0) {
  v1::GenerateRequest request;
  request.set_request_id(id);
  for (int32_t t : Prompt(variant)) request.mutable_token_ids()->add_ids(t);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(12);
  request.mutable_stop()->set_ignore_eos(true);
  // A router refuses at once (RESOURCE_EXHAUSTED) until its first load
  // reports arrive: try again.
  auto stub = v1::Generation::NewStub(worker.channel);
  Result r;
  for (int attempt = 0; attempt < 200; ++attempt) {
    r = Result();
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    auto reader = stub->Generate(&context, request);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      if (response.has_chunk()) {
        r.tokens.insert(r.tokens.end(), response.chunk().token_ids().begin(),
                        response.chunk().token_ids().end());
      }
      if (response.has_complete()) r.usage = response.complete().usage();
    }
    r.status = reader->Finish();
    if (r.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
  }
  return r;
}

// Reads `worker`'s load stream until its relay of the store's KV events
// (WorkerLoad.dram_kv_events) holds the keys of `prompt`'s first
// `blocks` blocks (hashed as every process hashes them, with the identity
// and block size the events carry), then two samples more (a router's
// stream, on the same ticker, has had them by then). False if it does not
// within 60 s.
bool WaitForRelayedPrompt(const ServiceProcess& worker, const std::vector<int32_t>& prompt,
                          size_t blocks) {
  v1::GetLoadRequest request;
  request.mutable_interval()->set_nanos(20'000'000);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = v1::WorkerControl::NewStub(worker.channel)->GetLoad(&context, request);
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> held;
  std::vector<kv::BlockKey> wanted;
  v1::WorkerLoad load;
  int after = -1;
  while (after < 2 && reader->Read(&load)) {
    const v1::KvEvents& e = load.dram_kv_events();
    if (wanted.empty() && e.block_size_tokens() > 0) {
      wanted = kv::BlockHasher(e.block_size_tokens(), e.cache_identity())
                   .PrefixKeys(/*cache_salt=*/"", prompt, blocks);
    }
    if (e.snapshot()) held.clear();
    for (int i = 0; i < e.key_hi_size(); ++i) {
      if (e.stored(i)) {
        held.insert({e.key_hi(i), e.key_lo(i)});
      } else {
        held.erase({e.key_hi(i), e.key_lo(i)});
      }
    }
    const bool all = !wanted.empty() &&
                     std::all_of(wanted.begin(), wanted.end(), [&held](const kv::BlockKey& k) {
                       return held.contains({k.hi, k.lo});
                     });
    if (after >= 0 || all) ++after;
  }
  context.TryCancel();
  reader->Finish();
  return after >= 2;
}

// The worker's count of idle checks that found its KV pool's books broken.
int64_t KvInvariantFailures(const ServiceProcess& worker) {
  v1::KvStats stats;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(v1::WorkerControl::NewStub(worker.channel)
                  ->GetKvStats(&context, v1::GetKvStatsRequest(), &stats)
                  .ok());
  return stats.kv_invariant_failures_total();
}

class KvTierTest : public ::testing::TestWithParam<Param> {
 protected:
  // A worker of `role` with the tier, on the store's service.
  // `offload_min_context`: its sequences move to the service once they
  // decode at this context (0: never).
  absl::StatusOr<ServiceProcess> StartTieredWorker(const std::string& role, const std::string& name,
                                                   int32_t offload_min_context = 0,
                                                   bool tier = true,
                                                   std::vector<std::string> extra = {}) {
    std::vector<std::string> argv =
        testing::SmallCpuWorkerArgv(RunfilePath("services/worker/worker"), model_dir_, role, name);
    argv.push_back(absl::StrCat("--ucx_transports=", GetParam().transport));
    argv.push_back(absl::StrCat("--attention_services=", attention_.address));
    argv.push_back(absl::StrCat("--kv_block_size=", kBlockSize));
    argv.push_back("--offload_low_watermark=0");
    argv.push_back(absl::StrCat("--offload_min_context_tokens=", offload_min_context));
    argv.push_back("--offload_pipeline=never");
    argv.push_back("--kv_tier_always_fetch");
    if (!tier) argv.push_back("--kv_tier=false");
    argv.insert(argv.end(), extra.begin(), extra.end());
    return testing::StartService(argv, TestTmpPath(absl::StrCat(name, ".log")));
  }

  // Worker A computes the test's prompt (*first) and its cached blocks
  // reach the store.
  void ComputeOnA(Result* first) {
    *first = Generate(a_, "first");
    ASSERT_TRUE(first->status.ok()) << first->status.error_message();
    ASSERT_GE(StoreStatsOnce([](const v1::BlockStoreStats& s) {
                return s.blocks() >= kCachedBlocks;
              }).blocks(),
              kCachedBlocks);
  }

  // decode_: a decode worker without a tier.
  absl::Status StartDecodeWorker() {
    std::vector<std::string> argv = testing::SmallCpuWorkerArgv(
        RunfilePath("services/worker/worker"), model_dir_, "decode", "decode-0");
    argv.push_back(absl::StrCat("--ucx_transports=", GetParam().transport));
    argv.push_back(absl::StrCat("--kv_block_size=", kBlockSize));
    absl::StatusOr<ServiceProcess> decode =
        testing::StartService(argv, TestTmpPath("decode-0.log"));
    if (!decode.ok()) return decode.status();
    decode_ = *std::move(decode);
    return absl::OkStatus();
  }

  void SetUp() override {
    model_dir_ = TestTmpPath(GetParam().model);
    ASSERT_THAT(testing::EnsureFixtureModel(GetParam().model, model_dir_), IsOk());
    auto attention = testing::StartService(
        {RunfilePath("services/attention/attention"),
         absl::StrCat("--ucx_transports=", GetParam().transport), "--kv_budget_mb=16",
         "--kv_store_mb=8", "--threads=1", "--spin_window=0s",
         // Two lanes: fetches spread their gets over both.
         "--lanes=2"},
        TestTmpPath("attention.log"));
    ASSERT_THAT(attention.status(), IsOk());
    attention_ = *std::move(attention);
    stub_ = v1::Attention::NewStub(attention_.channel);
    for (auto [process, name] : {std::pair{&a_, "worker-a"}, std::pair{&b_, "worker-b"}}) {
      auto worker = StartTieredWorker("both", name);
      ASSERT_THAT(worker.status(), IsOk());
      *process = *std::move(worker);
    }
  }

  void TearDown() override {
    for (ServiceProcess* p : {&router_, &prefill_, &decode_, &a_, &b_, &c_, &attention_}) {
      testing::StopService(*p).IgnoreError();
    }
  }

  v1::BlockStoreStats StoreStats() {
    v1::AttentionStats stats;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    stub_->GetStats(&context, v1::GetAttentionStatsRequest(), &stats);
    return stats.block_store();
  }

  // Polls the service (another process) until `done` holds of its store.
  template <typename Done>
  v1::BlockStoreStats StoreStatsOnce(Done done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    v1::BlockStoreStats stats = StoreStats();
    while (!done(stats) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
      stats = StoreStats();
    }
    return stats;
  }

  std::string model_dir_;
  ServiceProcess attention_, a_, b_, c_, prefill_, decode_, router_;
  std::unique_ptr<v1::Attention::Stub> stub_;
};

TEST_P(KvTierTest, AnotherWorkerFetchesThePrefixFromTheStore) {
  const Result first = Generate(a_, "first");
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.usage.cached_tokens(), 0);
  ASSERT_EQ(first.tokens.size(), 12u);

  // A's prompt blocks reach the store (written through in the background).
  const v1::BlockStoreStats written =
      StoreStatsOnce([](const v1::BlockStoreStats& s) { return s.blocks() >= kCachedBlocks; });
  ASSERT_GE(written.blocks(), kCachedBlocks);

  const Result second = Generate(b_, "second");
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.usage.cached_tokens(), kCachedBlocks * kBlockSize);
  EXPECT_EQ(second.usage.dram_cached_tokens(), kCachedBlocks * kBlockSize);

  const v1::BlockStoreStats end = StoreStatsOnce([](const v1::BlockStoreStats& s) {
    return s.pinned_blocks() == 0 && s.reserved_blocks() == 0;
  });
  EXPECT_EQ(end.pinned_blocks(), 0);
  EXPECT_EQ(end.reserved_blocks(), 0);
  EXPECT_EQ(end.invariant_violation(), "");
  EXPECT_GE(end.blocks_read_total(), kCachedBlocks);
  EXPECT_EQ(end.bytes(), end.blocks() * (written.bytes() / written.blocks()));
  EXPECT_TRUE(testing::AllKvBlocksFree(a_.channel));
  EXPECT_TRUE(testing::AllKvBlocksFree(b_.channel));
  EXPECT_EQ(KvInvariantFailures(a_), 0);
  EXPECT_EQ(KvInvariantFailures(b_), 0);
  std::cout << GetParam().model << " over " << GetParam().transport << ": worker B fetched "
            << second.usage.dram_cached_tokens() << " of " << kPromptTokens
            << " prompt tokens from the store (" << end.blocks_read_total()
            << " blocks read); tokens equal worker A's, which computed them\n";
}

// A sequence that moves to the store's service (CPU attention) reads its
// cached prefix there in place: only the tokens after it are copied, the
// tokens are those of a worker that never moved, and the borrow ends with
// the sequence.
TEST_P(KvTierTest, AMovedSequenceReadsItsPrefixInPlaceInTheStore) {
  if (std::string(GetParam().model) != "llama3-tiny") {
    GTEST_SKIP() << "one model per transport is enough here";
  }
  Result first;
  ASSERT_NO_FATAL_FAILURE(ComputeOnA(&first));
  auto mover = StartTieredWorker("both", "worker-c", /*offload_min_context=*/1);
  ASSERT_THAT(mover.status(), IsOk());
  c_ = *std::move(mover);
  const ServiceProcess& c = c_;
  const Result moved = Generate(c, "moved");
  ASSERT_TRUE(moved.status.ok()) << moved.status.error_message();
  EXPECT_EQ(moved.tokens, first.tokens);
  absl::StatusOr<http::HttpResponse> metrics =
      http::Get(absl::StrCat("http://127.0.0.1:", c.metrics_port, "/metrics"), absl::Seconds(5));
  ASSERT_THAT(metrics.status(), IsOk());
  EXPECT_THAT(metrics->body,
              ::testing::HasSubstr("trident_worker_offload_decisions_total{decision=\"moved\"} 1"));
  // The 6 cached blocks were read in place; the prompt's last 4 tokens (and
  // any decoded before the move) were copied.
  EXPECT_THAT(metrics->body, ::testing::HasSubstr(absl::StrCat(
                                 "trident_worker_offload_moved_tokens_total{how=\"in_place\"} ",
                                 kCachedBlocks * kBlockSize, "\n")));
  EXPECT_THAT(metrics->body, ::testing::ContainsRegex(
                                 "trident_worker_offload_moved_tokens_total\\{how=\"copied\"\\} "
                                 "[1-9]"));
  const v1::BlockStoreStats end = StoreStatsOnce(
      [](const v1::BlockStoreStats& s) { return s.borrows() == 0 && s.pinned_blocks() == 0; });
  EXPECT_EQ(end.borrows(), 0);
  EXPECT_EQ(end.pinned_blocks(), 0);
  EXPECT_EQ(end.invariant_violation(), "");
  EXPECT_TRUE(testing::AllKvBlocksFree(c.channel));
  std::cout << "over " << GetParam().transport << ": the moved sequence read "
            << kCachedBlocks * kBlockSize << " prefix tokens in place at the store's service\n";
}

// A prompt placed at the store's service (CPU attention from its first
// token) is read there in place as far as the store holds it: its prefill
// worker writes only the rest, and the tokens are the colocated worker's.
TEST_P(KvTierTest, APlacedPromptIsWrittenOnlyPastThePrefixTheStoreHolds) {
  if (std::string(GetParam().model) != "llama3-tiny") {
    GTEST_SKIP() << "one model per transport is enough here";
  }
  Result first;
  ASSERT_NO_FATAL_FAILURE(ComputeOnA(&first));
  auto prefill = StartTieredWorker("prefill", "prefill-0");
  ASSERT_THAT(prefill.status(), IsOk());
  prefill_ = *std::move(prefill);
  auto decode = StartTieredWorker("decode", "decode-placing", /*offload_min_context=*/1);
  ASSERT_THAT(decode.status(), IsOk());
  decode_ = *std::move(decode);
  testing::DisaggregatedContexts contexts;
  contexts.allow_cpu_attention = true;
  contexts.reserve_with_prompt = true;
  const testing::DisaggregatedResult r =
      testing::GenerateDisaggregated(prefill_, decode_, "placed", Prompt(), 12, &contexts);
  ASSERT_TRUE(r.ok()) << r.reserve_status.error_message() << " / "
                      << r.prefill_status.error_message() << " / "
                      << r.decode_status.error_message();
  EXPECT_TRUE(r.placed_on_cpu);
  EXPECT_EQ(r.cached_blocks, kCachedBlocks);
  EXPECT_EQ(r.tokens, first.tokens);
  const v1::BlockStoreStats end = StoreStatsOnce(
      [](const v1::BlockStoreStats& s) { return s.borrows() == 0 && s.pinned_blocks() == 0; });
  EXPECT_EQ(end.borrows(), 0);
  EXPECT_EQ(end.invariant_violation(), "");
  std::cout << "over " << GetParam().transport << ": the placed prompt's first "
            << r.cached_blocks * kBlockSize << " tokens were read in place\n";
}

// The router learns what the store holds through the tiered worker's load
// stream: a prompt only the store holds goes to the prefill worker that can
// fetch it, not to the one without a tier, three prompts out of three.
TEST_P(KvTierTest, TheRouterSendsAPromptOnlyTheStoreHoldsToAWorkerThatCanFetchIt) {
  if (std::string(GetParam().model) != "llama3-tiny") {
    GTEST_SKIP() << "one model per transport is enough here";
  }
  // Fetching pays here whatever this machine measures (on it, fetching a
  // tiny model's KV may well lose to computing it, and the router would
  // then rightly prefer neither).
  auto tiered =
      StartTieredWorker("prefill", "prefill-tiered", 0, true, {"--testonly_dram_hit_value=1"});
  ASSERT_THAT(tiered.status(), IsOk());
  prefill_ = *std::move(tiered);
  auto untiered = StartTieredWorker("prefill", "prefill-untiered", 0, /*tier=*/false);
  ASSERT_THAT(untiered.status(), IsOk());
  c_ = *std::move(untiered);
  ASSERT_THAT(StartDecodeWorker(), IsOk());
  // A fresh router for each prompt: one that served the first would have
  // learned the worker's TTFT with the fetch in it (its TTFT scale), which
  // this test's fixed hit value leaves out.
  int fetched = 0;
  for (int variant = 1; variant <= 3; ++variant) {
    SCOPED_TRACE(absl::StrCat("prompt ", variant));
    const Result computed = Generate(a_, absl::StrCat("computed-", variant), variant);
    ASSERT_TRUE(computed.status.ok()) << computed.status.error_message();
    ASSERT_TRUE(WaitForRelayedPrompt(prefill_, Prompt(variant), kCachedBlocks));
    auto router = testing::StartService(
        {RunfilePath("services/router/router"), absl::StrCat("--model=", model_dir_),
         absl::StrCat("--prefill_workers=", prefill_.address, ",", c_.address),
         absl::StrCat("--decode_workers=", decode_.address), "--load_interval_ms=20"},
        TestTmpPath(absl::StrCat("router-", variant, ".log")));
    ASSERT_THAT(router.status(), IsOk());
    router_ = *std::move(router);
    // Both prefill workers' first load reports (the tiered one's carries
    // the store's keys) have reached the router.
    ASSERT_TRUE(testing::RouterKnowsWorkers(router_, {"prefill-tiered", "prefill-untiered"}));
    const Result routed = Generate(router_, absl::StrCat("routed-", variant), variant);
    ASSERT_TRUE(routed.status.ok()) << routed.status.error_message();
    EXPECT_EQ(routed.tokens, computed.tokens);
    EXPECT_EQ(routed.usage.dram_cached_tokens(), kCachedBlocks * kBlockSize);
    if (routed.usage.dram_cached_tokens() == kCachedBlocks * kBlockSize) ++fetched;
    absl::StatusOr<http::HttpResponse> metrics = http::Get(
        absl::StrCat("http://127.0.0.1:", router_.metrics_port, "/metrics"), absl::Seconds(5));
    ASSERT_THAT(metrics.status(), IsOk());
    EXPECT_THAT(metrics->body, ::testing::HasSubstr(
                                   "trident_router_routing_decisions_total{reason=\"prefix\"} 1"));
    ASSERT_THAT(testing::StopService(router_), IsOk());
  }
  std::cout << "over " << GetParam().transport << ": " << fetched
            << " of 3 prompts only the store held went to the worker that fetched them\n";
}

TEST_P(KvTierTest, APrefillWorkerBehindTheRouterFetchesThePrefixToo) {
  if (std::string(GetParam().model) != "llama3-tiny") {
    GTEST_SKIP() << "one model per transport is enough here";
  }
  Result first;
  ASSERT_NO_FATAL_FAILURE(ComputeOnA(&first));
  auto prefill = StartTieredWorker("prefill", "prefill-0");
  ASSERT_THAT(prefill.status(), IsOk());
  prefill_ = *std::move(prefill);
  ASSERT_THAT(StartDecodeWorker(), IsOk());
  auto router = testing::StartService(
      {RunfilePath("services/router/router"), absl::StrCat("--model=", model_dir_),
       absl::StrCat("--prefill_workers=", prefill_.address),
       absl::StrCat("--decode_workers=", decode_.address), "--load_interval_ms=20",
       "--admission=false"},
      TestTmpPath("router.log"));
  ASSERT_THAT(router.status(), IsOk());
  router_ = *std::move(router);
  // Until both workers' first load reports arrive the router has nowhere
  // to send it.
  ASSERT_TRUE(testing::RouterKnowsWorkers(router_, {"prefill-0", "decode-0"}));
  const Result routed = Generate(router_, "routed");
  ASSERT_TRUE(routed.status.ok()) << routed.status.error_message();
  EXPECT_EQ(routed.tokens, first.tokens);
  EXPECT_EQ(routed.usage.cached_tokens(), kCachedBlocks * kBlockSize);
  EXPECT_EQ(routed.usage.dram_cached_tokens(), kCachedBlocks * kBlockSize);
  EXPECT_TRUE(testing::AllKvBlocksFree(prefill_.channel));
  EXPECT_TRUE(testing::AllKvBlocksFree(decode_.channel));
  EXPECT_EQ(KvInvariantFailures(prefill_), 0);
  EXPECT_EQ(KvInvariantFailures(decode_), 0);
  const v1::BlockStoreStats store = StoreStatsOnce([](const v1::BlockStoreStats& s) {
    return s.pinned_blocks() == 0 && s.reserved_blocks() == 0;
  });
  EXPECT_EQ(store.pinned_blocks(), 0);
  EXPECT_EQ(store.reserved_blocks(), 0);
  EXPECT_EQ(store.invariant_violation(), "");
  std::cout << "through the router over " << GetParam().transport << ": the prefill worker fetched "
            << routed.usage.dram_cached_tokens() << " of " << kPromptTokens
            << " prompt tokens from the store\n";
}

INSTANTIATE_TEST_SUITE_P(ModelsAndTransports, KvTierTest,
                         ::testing::Values(Param{"llama3-tiny", "tcp"},
                                           Param{"llama3-tiny", "posix"},
                                           Param{"qwen2-tiny", "tcp"}, Param{"qwen2-tiny", "posix"},
                                           Param{"mistral-tiny", "tcp"},
                                           Param{"mistral-tiny", "posix"}),
                         Name);

}  // namespace
}  // namespace trident
