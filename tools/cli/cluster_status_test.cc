#include "tools/cli/cluster_status.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A process whose pid and gRPC port are `port` and metrics port `port + 1`.
ProcessRecord Process(const std::string& name, const std::string& component, int port,
                      const std::string& role = "") {
  return {.name = name,
          .component = component,
          .pid = port,
          .grpc_port = port,
          .metrics_port = port + 1,
          .role = role};
}

ClusterState State() {
  ClusterState state{.host = "127.0.0.1"};
  state.processes = {Process("worker-0", "worker", 7, "prefill"),
                     Process("worker-1", "worker", 9, "both"), Process("router", "router", 11)};
  return state;
}

std::vector<ProcessStatus> Statuses(const ClusterState& state) {
  std::vector<ProcessStatus> statuses;
  for (const ProcessRecord& r : state.processes) {
    statuses.push_back({.record = r, .running = true, .health = "SERVING"});
  }
  return statuses;
}

// The line of `text` that starts with `name`.
std::string LineOf(const std::string& text, const std::string& name, size_t from = 0) {
  const size_t begin = text.find("\n" + name + " ", from);
  if (begin == std::string::npos) return "";
  return text.substr(begin + 1, text.find('\n', begin + 1) - begin - 1);
}

TEST(FormatStatusTest, ShowsEveryProcessThenEachWorkersRoleSequencesAndKvCache) {
  const ClusterState state = State();
  std::vector<ProcessStatus> statuses = Statuses(state);
  statuses[0].load = WorkerLoadSummary{.worker_id = "worker-0",
                                       .role = "prefill",
                                       .state = "serving",
                                       .running_sequences = 0,
                                       .waiting_sequences = 4,
                                       .kv_cache_usage_ratio = 0.125};
  statuses[1].load = WorkerLoadSummary{.worker_id = "worker-1",
                                       .role = "both",
                                       .pending_role = "decode",
                                       .state = "draining",
                                       .running_sequences = 3,
                                       .cpu_attention_sequences = 2};
  // worker-0's prefix cache found 100 of 800 prompt tokens; worker-1's KV
  // stats could not be read.
  trident::v1::KvStats kv;
  kv.set_blocks_cached(42);
  kv.set_prefix_cache_queries_total(800);
  kv.set_prefix_cache_hits_total(100);
  statuses[0].kv_stats = kv;
  const std::string text = FormatStatus(state, statuses);

  EXPECT_THAT(LineOf(text, "router"), HasSubstr("127.0.0.1:11"));
  EXPECT_THAT(LineOf(text, "router"), HasSubstr("http://127.0.0.1:12/metrics"));
  EXPECT_THAT(LineOf(text, "router"), HasSubstr("SERVING"));
  const size_t workers = text.find("\nWORKER ");
  ASSERT_NE(workers, std::string::npos) << text;
  EXPECT_THAT(text.substr(workers), HasSubstr("RUNNING"));
  EXPECT_THAT(text.substr(workers), Not(HasSubstr("router")));
  EXPECT_THAT(LineOf(text, "WORKER", workers - 1),
              testing::MatchesRegex("WORKER .* KV CACHE +ON CPU +PREFIX HIT +CACHED"));
  EXPECT_THAT(LineOf(text, "worker-0", workers),
              testing::MatchesRegex("worker-0 +prefill +serving +0 +4 +12.5% +0 +12.5% +42"));
  EXPECT_THAT(LineOf(text, "worker-1", workers),
              testing::MatchesRegex("worker-1 +both->decode +draining +3 +0 +0.0% +2 +- +-"));
}

TEST(FormatStatusTest, AWorkerWhosePrefixCacheWasNeverQueriedShowsNoHitRate) {
  const ClusterState state = State();
  std::vector<ProcessStatus> statuses = Statuses(state);
  statuses[0].load = WorkerLoadSummary{.worker_id = "worker-0", .role = "prefill"};
  trident::v1::KvStats kv;
  kv.set_blocks_cached(0);
  statuses[0].kv_stats = kv;
  const std::string text = FormatStatus(state, statuses);
  const size_t workers = text.find("\nWORKER ");
  ASSERT_NE(workers, std::string::npos) << text;
  EXPECT_THAT(LineOf(text, "worker-0", workers), testing::MatchesRegex(".* +0.0% +0 +- +0"));
  kv.set_prefix_cache_queries_total(3);
  kv.set_prefix_cache_hits_total(3);
  statuses[0].kv_stats = kv;
  EXPECT_THAT(LineOf(FormatStatus(state, statuses), "worker-0", workers),
              testing::MatchesRegex(".* +0.0% +0 +100.0% +0"));
}

TEST(FormatStatusTest, ShowsWhatEachAttentionServiceHolds) {
  ClusterState state{.host = "127.0.0.1"};
  state.processes = {Process("attention-0", "attention", 7), Process("attention-1", "attention", 9),
                     Process("attention-2", "attention", 11)};
  std::vector<ProcessStatus> statuses = Statuses(state);
  trident::v1::AttentionStats stats;
  stats.set_numa_node(1);
  stats.set_isa(trident::v1::ISA_AVX512_BF16);
  stats.set_threads(16);
  stats.set_sequences(3);
  stats.set_held_tokens(12345);
  stats.set_held_bytes(int64_t{96} << 20);
  stats.set_capacity_bytes(int64_t{1024} << 20);
  stats.set_sessions(2);
  stats.set_attention_requests_total(4200);
  // attention-2 runs without a block store.
  statuses[2].attention = stats;
  trident::v1::BlockStoreStats* store = stats.mutable_block_store();
  store->set_blocks(1234);
  store->set_bytes(int64_t{7} << 19);  // 3.5 MiB
  store->set_capacity_bytes(int64_t{64} << 20);
  store->set_lookups_total(56);
  store->set_blocks_matched_total(240);
  store->set_blocks_read_total(200);
  statuses[0].attention = stats;
  const std::string text = FormatStatus(state, statuses);
  const size_t table = text.find("\nATTENTION ");
  ASSERT_NE(table, std::string::npos) << text;
  EXPECT_THAT(
      LineOf(text, "attention-0", table),
      testing::MatchesRegex("attention-0 +1 avx512_bf16 +16 +3 +12345 +96.0/1024.0 +2 +4200"));
  EXPECT_THAT(LineOf(text, "attention-1", table), HasSubstr("stats unknown"));
  const size_t stores = text.find("\nBLOCK STORE ");
  ASSERT_NE(stores, std::string::npos) << text;
  EXPECT_GT(stores, table);
  EXPECT_THAT(LineOf(text, "BLOCK STORE", stores - 1),
              testing::MatchesRegex("BLOCK STORE +BLOCKS +MiB/BUDGET +HIT BLOCKS/LOOKUPS"));
  EXPECT_THAT(LineOf(text, "attention-0", stores),
              testing::MatchesRegex("attention-0 +1234 +3.5/64.0 +240/56"));
  // Unknown stats show once, in the ATTENTION table.
  EXPECT_EQ(LineOf(text, "attention-1", stores), "");
  EXPECT_THAT(LineOf(text, "attention-2", stores), testing::MatchesRegex("attention-2 +off"));
}

TEST(FormatStatusTest, AWorkerWithoutLoadShowsItsStartRoleAndWhy) {
  const ClusterState state = State();
  std::vector<ProcessStatus> statuses = Statuses(state);
  statuses[0].load_error = "DEADLINE_EXCEEDED: slow";
  statuses[1].running = false;
  statuses[1].health = "DOWN";
  const std::string text = FormatStatus(state, statuses);
  const size_t workers = text.find("\nWORKER ");
  ASSERT_NE(workers, std::string::npos) << text;
  EXPECT_THAT(LineOf(text, "worker-0", workers), HasSubstr("prefill?"));
  EXPECT_THAT(LineOf(text, "worker-0", workers), HasSubstr("DEADLINE_EXCEEDED: slow"));
  EXPECT_THAT(LineOf(text, "worker-1", workers), HasSubstr("not running"));
}

TEST(FormatStatusTest, NoWorkerTableWithoutWorkers) {
  ClusterState state{.host = "127.0.0.1"};
  state.processes = {Process("controller", "controller", 1)};
  EXPECT_THAT(FormatStatus(state, Statuses(state)), Not(HasSubstr("WORKER")));
}

TEST(FormatStatusTest, ShowsTheControllersMembersPressureAndLastDecision) {
  ClusterState state{.host = "127.0.0.1"};
  state.processes = {Process("controller", "controller", 1)};
  std::vector<ProcessStatus> statuses = Statuses(state);
  trident::v1::ControllerStatus controller;
  controller.set_controller_incarnation(12);
  controller.set_prometheus_url("http://127.0.0.1:9090");
  controller.mutable_decision_interval()->set_seconds(10);
  controller.set_flips_total(1);
  trident::v1::RoleDecision* d = controller.add_decisions();
  d->set_flip(true);
  d->set_reason("decode_pressure");
  d->set_worker_id("worker-0");
  d->set_from_role(trident::v1::ROLE_PREFILL);
  d->set_to_role(trident::v1::ROLE_DECODE);
  d->set_detail("decode needs a worker");
  d->mutable_prefill()->set_observed(0.2);
  d->mutable_decode()->set_observed(1.5);
  d->mutable_decode()->set_forecast(1.6);
  d->mutable_decode()->set_dominant("tpot_p90");
  d->mutable_decode()->set_workers(1);
  trident::v1::Topology topology;
  trident::v1::WorkerEntry* w = topology.add_workers();
  w->mutable_registration()->set_worker_id("worker-0");
  w->set_role(trident::v1::ROLE_PREFILL);
  w->set_pending_role(trident::v1::ROLE_DECODE);
  w->set_state(trident::v1::SERVING_STATE_DRAINING);
  statuses[0].controller = controller;
  statuses[0].topology = topology;
  const std::string text = FormatStatus(state, statuses);
  EXPECT_THAT(text,
              HasSubstr("incarnation 12, decisions every 10s from http://127.0.0.1:9090, 1 flip"));
  EXPECT_THAT(text, HasSubstr("member worker-0     prefill->decode  draining"));
  EXPECT_THAT(text, HasSubstr("decode 1.50 (forecast 1.60, tpot_p90, 1 worker)"));
  EXPECT_THAT(text, HasSubstr("flip worker-0 prefill->decode (decode_pressure): decode needs"));
  statuses[0].controller.reset();
  statuses[0].controller_error = "GetStatus: connection refused";
  EXPECT_THAT(FormatStatus(state, statuses),
              HasSubstr("status unknown: GetStatus: connection refused"));
}

TEST(AllServingTest, NeedsEveryProcessRunningAndServing) {
  const ClusterState state = State();
  std::vector<ProcessStatus> statuses = Statuses(state);
  EXPECT_TRUE(AllServing(statuses));
  statuses[2].health = "NOT_SERVING";
  EXPECT_FALSE(AllServing(statuses));
  EXPECT_FALSE(AllServing({}));
}

TEST(CheckStatusTest, AProcessThatIsGoneIsDownWithNoLoad) {
  ClusterState state{.host = "127.0.0.1"};
  // pid_max is at most 2^22 on Linux, so no process has this pid.
  state.processes = {{.name = "worker-0", .component = "worker", .pid = 1 << 30, .role = "decode"}};
  const std::vector<ProcessStatus> statuses = CheckStatus(state);
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_FALSE(statuses[0].running);
  EXPECT_EQ(statuses[0].health, "DOWN");
  EXPECT_FALSE(statuses[0].load.has_value());
}

}  // namespace
}  // namespace trident::cli
