// A discrete-event simulation of 2 prefill and 2 decode workers whose true
// costs have the cost models' forms, under open-loop Poisson arrivals at
// twice the cluster's capacity, run once with admission on and once with it
// off. The router side is the real AdmissionController fed the way the
// router feeds it: load reports every 50 ms, measured prefill and transfer
// times, MarkPrefillDone on transfer end, Release on completion.
//
// What a request experiences:
//   TTFT = prefill queueing + prefill compute + KV transfer + a fixed
//          overhead no cost model sees (RPC hops, the wait for a step
//          boundary, the first token's way back), measured at the router as
//          it does (ObserveTtft);
//   TPOT = (finish - first token) / (output tokens - 1), where the decode
//          worker runs continuous batching: a step takes
//          c0 + c1 * batch + c2 * context_tokens, every running sequence
//          gains a token per step, and a sequence joins at a step boundary
//          once blocks for its prompt + max output are free.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <iostream>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "gtest/gtest.h"
#include "services/router/admission/admission_controller.h"

namespace trident::router::admission {
namespace {

constexpr uint64_t kSeed = 424242;

// True costs.
constexpr double kPrefillFixed = 0.020;      // s
constexpr double kPrefillPerToken = 40e-6;   // s/token (25,000 tokens/s)
constexpr double kDecodeFixed = 0.015;       // s
constexpr double kDecodePerSequence = 3e-4;  // s
constexpr double kDecodePerContext = 5e-7;   // s/token
constexpr int64_t kBytesPerToken = 131072;   // Llama-3-8B-like KV.
constexpr double kLinkBytesPerSecond = 20e9;
constexpr double kTransferLatency = 0.002;
constexpr double kNoise = 0.03;          // Relative standard deviation of every duration.
constexpr double kTtftOverhead = 0.012;  // s, unmodeled, on every request.
constexpr int32_t kKvBlocksPerDecodeWorker = 4000;
constexpr int32_t kBlockTokens = 16;

// A workload: request sizes (uniform) and every request's targets.
struct Workload {
  const char* name;
  int64_t prompt_min, prompt_max;
  int64_t max_output_min, max_output_max;
  double ttft_target;  // s
  double tpot_target;  // s
  // > 0: prompts are lognormal (ln-space mean and deviation), clipped to
  // [prompt_min, prompt_max], instead of uniform.
  double prompt_log_mean = 0;
  double prompt_log_sigma = 0;
};

// Chat-like: decode bounds the cluster.
constexpr Workload kDecodeBound{"decode-bound", 128, 1024, 32, 256, 1.0, 0.050};
// Long prompts, short answers: prefill bounds the cluster.
constexpr Workload kPrefillBound{"prefill-bound", 2048, 8192, 8, 32, 1.5, 0.100};
// ShareGPT-like prompts (median ~150 tokens, a long tail to 4k) at light
// load, TTFT 300 ms: every request can meet its targets.
constexpr Workload kLightChat{"light-chat", 4, 4096, 32, 256, 0.300, 0.050, 5.0, 1.2};

constexpr double kArrivalSeconds = 60;

// A burst at the start of a run: until `until` seconds, arrivals come at
// `rate` and every duration is `slowdown` times its true cost (the workers
// contend with something else).
struct Burst {
  double until = 0;
  double slowdown = 1;
  double rate = 0;
};
constexpr double kReportInterval = 0.050;

struct Req {
  int64_t prompt = 0;
  int64_t max_output = 0;
  int64_t output = 0;  // Actual, in [max_output / 2, max_output].
  double arrival = 0;
  bool admitted = false;
  bool probe = false;
  int reason = -1;  // Rejected: the RejectReason.
  AdmissionId id = 0;
  int prefill = -1;
  int decode = -1;
  int64_t generated = 0;
  double first_token = -1;
  double finish = -1;
};

struct PrefillWorker {
  std::string id;
  std::deque<int> queue;
  int current = -1;
  double current_start = 0;
  double current_end = 0;
  double tokens_per_second = 0;  // EWMA, as workers report it.
};

struct DecodeWorker {
  std::string id;
  std::vector<int> batch;
  std::deque<int> waiting;
  bool stepping = false;
  int64_t used_blocks = 0;
  int32_t last_batch = 0;
  int64_t last_context = 0;
  double last_step = 0;
};

enum class EventType { kArrival, kPrefillDone, kTransferDone, kFirstToken, kDecodeStep, kReport };

struct Event {
  double time;
  uint64_t order;  // FIFO among equal times.
  EventType type;
  int index;  // Request or worker.
  bool operator>(const Event& other) const {
    return time != other.time ? time > other.time : order > other.order;
  }
};

struct Result {
  int arrived = 0;
  int admitted = 0;
  int completed = 0;
  int met_slo = 0;
  double attainment() const { return completed > 0 ? double(met_slo) / completed : 0; }
  double goodput_per_second = 0;
  double mean_ttft = 0;
  double mean_tpot = 0;
  int rejected_by_reason[5] = {};
  int probes = 0;                        // Admitted as idle probes.
  absl::Duration admit_wall_per_call;    // Real time, for information only.
  std::vector<std::string> rejected_at;  // The first few rejections: "time/prompt tokens".
};

int64_t Blocks(int64_t tokens) { return (tokens + kBlockTokens - 1) / kBlockTokens; }

// Requests per second the cluster completes within the targets, from the
// true costs at the workload's means: each decode worker at the largest
// batch whose step meets the TPOT target, each prefill worker busy all the
// time; the smaller side bounds.
double Capacity(const Workload& w) {
  const double mean_prompt =
      w.prompt_log_sigma > 0
          ? std::exp(w.prompt_log_mean + w.prompt_log_sigma * w.prompt_log_sigma / 2)
          : (w.prompt_min + w.prompt_max) / 2.0;
  const double mean_output = 0.75 * (w.max_output_min + w.max_output_max) / 2.0;
  const double mean_context = mean_prompt + mean_output / 2;
  const double per_sequence = kDecodePerSequence + kDecodePerContext * mean_context;
  const double batch = std::floor((w.tpot_target - kDecodeFixed) / per_sequence);
  const double decode_tokens_per_second = batch / (kDecodeFixed + per_sequence * batch);
  const double decode = 2 * decode_tokens_per_second / mean_output;
  const double prefill = 2 / (kPrefillFixed + kPrefillPerToken * mean_prompt);
  std::cout << "capacity: decode " << decode << " req/s (batch " << batch << "), prefill "
            << prefill << " req/s\n";
  return std::min(decode, prefill);
}

class Simulation {
 public:
  Simulation(const Workload& workload, bool admission_on, double arrival_rate, uint64_t seed,
             bool learn_ttft_overhead = true, const Burst& burst = {}, bool probes = true)
      : workload_(workload),
        rng_(seed),
        clock_(absl::FromUnixSeconds(1'700'000'000)),
        start_(clock_.Now()),
        controller_(Options(admission_on, learn_ttft_overhead, probes),
                    QosConfig::SingleDefaultClass(), &clock_),
        arrival_rate_(arrival_rate),
        burst_(burst) {
    for (int i = 0; i < 2; ++i) prefill_.push_back(PrefillWorker{.id = absl::StrCat("p", i)});
    for (int i = 0; i < 2; ++i) decode_.push_back(DecodeWorker{.id = absl::StrCat("d", i)});
  }

  Result Run() {
    Push(Exponential(), EventType::kArrival, 0);
    for (int i = 0; i < 4; ++i) Push(i * kReportInterval / 4, EventType::kReport, i);
    while (!events_.empty()) {
      const Event event = events_.top();
      events_.pop();
      now_ = event.time;
      clock_.SetTime(start_ + absl::Seconds(now_));
      switch (event.type) {
        case EventType::kArrival:
          OnArrival();
          break;
        case EventType::kPrefillDone:
          OnPrefillDone(event.index);
          break;
        case EventType::kTransferDone:
          OnTransferDone(event.index);
          break;
        case EventType::kFirstToken:
          controller_.MarkPrefillDone(requests_[event.index].id);
          controller_.ObserveTtft(requests_[event.index].id,
                                  absl::Seconds(now_ - requests_[event.index].arrival));
          break;
        case EventType::kDecodeStep:
          OnDecodeStep(event.index);
          break;
        case EventType::kReport:
          OnReport(event.index);
          break;
      }
    }
    return Summarize(0, kArrivalSeconds);
  }

  // Over the requests that arrived in [from, to).
  Result Summarize(double from, double to) const {
    Result result;
    double ttft_sum = 0;
    double tpot_sum = 0;
    for (const Req& req : requests_) {
      if (req.arrival < from || req.arrival >= to) continue;
      ++result.arrived;
      if (!req.admitted) {
        if (req.reason >= 0) ++result.rejected_by_reason[req.reason];
        continue;
      }
      ++result.admitted;
      result.probes += req.probe;
      if (req.finish < 0) continue;
      ++result.completed;
      const double ttft = req.first_token - req.arrival;
      const double tpot = (req.finish - req.first_token) / double(req.output - 1);
      ttft_sum += ttft;
      tpot_sum += tpot;
      if (ttft <= workload_.ttft_target && tpot <= workload_.tpot_target) ++result.met_slo;
    }
    result.mean_ttft = result.completed ? ttft_sum / result.completed : 0;
    result.mean_tpot = result.completed ? tpot_sum / result.completed : 0;
    result.goodput_per_second = result.met_slo / (to - from);
    result.admit_wall_per_call = admit_wall_ / std::max(result.arrived, 1);
    result.rejected_at = rejected_at_;
    return result;
  }

 private:
  static AdmissionOptions Options(bool admission_on, bool learn_ttft_overhead, bool probes) {
    AdmissionOptions options;
    options.enabled = admission_on;
    options.learn_ttft_overhead = learn_ttft_overhead;
    if (!probes) options.idle_probe_interval = absl::ZeroDuration();
    options.kv_block_size_tokens = kBlockTokens;
    options.transfer_model.bytes_per_token = kBytesPerToken;
    // Priors left at their defaults, all wrong for these workers: the
    // controller has to learn the costs.
    return options;
  }

  void Push(double time, EventType type, int index) {
    events_.push(Event{time, next_order_++, type, index});
  }
  bool InBurst() const { return now_ < burst_.until; }
  double Exponential() {
    return std::exponential_distribution<double>(InBurst() ? burst_.rate : arrival_rate_)(rng_);
  }
  double Noisy(double seconds) {
    return seconds * (InBurst() ? burst_.slowdown : 1.0) *
           std::max(0.5, std::normal_distribution<double>(1.0, kNoise)(rng_));
  }
  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  int64_t Prompt() {
    if (workload_.prompt_log_sigma <= 0) return Uniform(workload_.prompt_min, workload_.prompt_max);
    const double x = std::lognormal_distribution<double>(workload_.prompt_log_mean,
                                                         workload_.prompt_log_sigma)(rng_);
    return std::clamp<int64_t>(static_cast<int64_t>(x), workload_.prompt_min, workload_.prompt_max);
  }

  void OnArrival() {
    Req req;
    req.arrival = now_;
    req.prompt = Prompt();
    req.max_output = Uniform(workload_.max_output_min, workload_.max_output_max);
    req.output = Uniform(req.max_output / 2, req.max_output);
    AdmissionRequest request;
    request.prompt_tokens = req.prompt;
    request.max_output_tokens = req.max_output;
    request.ttft = absl::Seconds(workload_.ttft_target);
    request.tpot = absl::Seconds(workload_.tpot_target);
    const absl::Time before = absl::Now();
    const absl::StatusOr<AdmissionDecision> decision = controller_.Admit(request);
    admit_wall_ += absl::Now() - before;
    EXPECT_TRUE(decision.ok()) << decision.status();
    const int index = static_cast<int>(requests_.size());
    if (decision.ok() && decision->admitted) {
      req.admitted = true;
      req.probe = decision->probe;
      req.id = decision->id;
      req.prefill = decision->prefill_worker_id == "p0" ? 0 : 1;
      req.decode = decision->decode_worker_id == "d0" ? 0 : 1;
      requests_.push_back(req);
      PrefillWorker& p = prefill_[req.prefill];
      p.queue.push_back(index);
      if (p.current < 0) StartPrefill(req.prefill);
    } else {
      if (decision.ok()) req.reason = static_cast<int>(decision->reason);
      if (decision.ok() && rejected_at_.size() < 8) {
        rejected_at_.push_back(absl::StrFormat("%.2fs/%d", now_, req.prompt));
      }
      requests_.push_back(req);
    }
    if (now_ < kArrivalSeconds) Push(now_ + Exponential(), EventType::kArrival, 0);
  }

  void StartPrefill(int w) {
    PrefillWorker& p = prefill_[w];
    if (p.queue.empty()) return;
    p.current = p.queue.front();
    p.queue.pop_front();
    const Req& req = requests_[p.current];
    p.current_start = now_;
    p.current_end = now_ + Noisy(kPrefillFixed + kPrefillPerToken * req.prompt);
    Push(p.current_end, EventType::kPrefillDone, w);
  }

  void OnPrefillDone(int w) {
    PrefillWorker& p = prefill_[w];
    const int index = p.current;
    const Req& req = requests_[index];
    const double compute = now_ - p.current_start;
    controller_.ObservePrefill(p.id, req.prompt, absl::Seconds(compute));
    const double tps = req.prompt / compute;
    p.tokens_per_second = p.tokens_per_second == 0 ? tps : 0.8 * p.tokens_per_second + 0.2 * tps;
    const double transfer =
        Noisy(kTransferLatency + double(req.prompt) * kBytesPerToken / kLinkBytesPerSecond);
    Push(now_ + transfer, EventType::kTransferDone, index);
    transfer_started_.resize(requests_.size());
    transfer_started_[index] = now_;
    p.current = -1;
    StartPrefill(w);
  }

  void OnTransferDone(int index) {
    Req& req = requests_[index];
    controller_.ObserveTransfer(req.prompt * kBytesPerToken,
                                absl::Seconds(now_ - transfer_started_[index]));
    // The first token reaches the router after the unmodeled overhead; it
    // tells admission then (the real router's flight does the same).
    req.first_token = now_ + Noisy(kTtftOverhead);
    Push(req.first_token, EventType::kFirstToken, index);
    req.generated = 1;
    DecodeWorker& d = decode_[req.decode];
    d.waiting.push_back(index);
    if (!d.stepping) StartStep(req.decode);
  }

  // Joins waiting sequences that fit and starts the next step, if any.
  void StartStep(int w) {
    DecodeWorker& d = decode_[w];
    while (!d.waiting.empty()) {
      const Req& req = requests_[d.waiting.front()];
      const int64_t blocks = Blocks(req.prompt + req.max_output);
      if (d.used_blocks + blocks > kKvBlocksPerDecodeWorker) break;
      d.used_blocks += blocks;
      d.batch.push_back(d.waiting.front());
      d.waiting.pop_front();
    }
    if (d.batch.empty()) {
      d.stepping = false;
      return;
    }
    int64_t context = 0;
    for (int index : d.batch) context += requests_[index].prompt + requests_[index].generated;
    const int32_t batch = static_cast<int32_t>(d.batch.size());
    const double step =
        Noisy(kDecodeFixed + kDecodePerSequence * batch + kDecodePerContext * context);
    d.stepping = true;
    d.last_batch = batch;
    d.last_context = context;
    d.last_step = step;
    Push(now_ + step, EventType::kDecodeStep, w);
  }

  void OnDecodeStep(int w) {
    DecodeWorker& d = decode_[w];
    std::vector<int> still_running;
    for (int index : d.batch) {
      Req& req = requests_[index];
      ++req.generated;
      if (req.generated >= req.output) {
        req.finish = now_;
        d.used_blocks -= Blocks(req.prompt + req.max_output);
        controller_.Release(req.id);
      } else {
        still_running.push_back(index);
      }
    }
    d.batch.swap(still_running);
    StartStep(w);
  }

  void OnReport(int w) {
    WorkerLoadReport report;
    if (w < 2) {
      const PrefillWorker& p = prefill_[w];
      report.worker_id = p.id;
      report.role = WorkerRole::kPrefill;
      int64_t queued = 0;
      for (int index : p.queue) queued += requests_[index].prompt;
      if (p.current >= 0) {
        const double left = (p.current_end - now_) / (p.current_end - p.current_start);
        queued += static_cast<int64_t>(requests_[p.current].prompt * std::clamp(left, 0.0, 1.0));
      }
      report.queued_prefill_tokens = queued;
      report.waiting_sequences = static_cast<int32_t>(p.queue.size()) + (p.current >= 0);
      report.prefill_tokens_per_second = p.tokens_per_second;
    } else {
      const DecodeWorker& d = decode_[w - 2];
      report.worker_id = d.id;
      report.role = WorkerRole::kDecode;
      report.kv_blocks_total = kKvBlocksPerDecodeWorker;
      report.kv_blocks_free = static_cast<int32_t>(kKvBlocksPerDecodeWorker - d.used_blocks);
      if (d.stepping) {
        report.running_sequences = d.last_batch;
        report.batch_context_tokens = d.last_context;
        report.decode_step_time = absl::Seconds(d.last_step);
      }
    }
    EXPECT_TRUE(controller_.UpdateLoad(report).ok());
    // Keep reporting while work remains.
    if (now_ < kArrivalSeconds || controller_.num_in_flight() > 0) {
      Push(now_ + kReportInterval, EventType::kReport, w);
    }
  }

  const Workload workload_;
  std::mt19937_64 rng_;
  FakeClock clock_;
  const absl::Time start_;
  AdmissionController controller_;
  const double arrival_rate_;
  const Burst burst_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t next_order_ = 0;
  double now_ = 0;
  std::vector<Req> requests_;
  std::vector<double> transfer_started_;
  std::vector<PrefillWorker> prefill_;
  std::vector<DecodeWorker> decode_;
  std::vector<std::string> rejected_at_;  // The first few: "time/prompt".
  absl::Duration admit_wall_;
};

void Print(const char* name, const Result& r) {
  std::cout << name << ": arrived " << r.arrived << ", admitted " << r.admitted << ", completed "
            << r.completed << ", met SLO " << r.met_slo << " (attainment " << 100 * r.attainment()
            << "% of admitted), goodput " << r.goodput_per_second << " req/s, mean TTFT "
            << r.mean_ttft << " s, mean TPOT " << 1000 * r.mean_tpot << " ms; rejected ttft "
            << r.rejected_by_reason[int(RejectReason::kTtft)] << ", tpot "
            << r.rejected_by_reason[int(RejectReason::kTpot)] << ", kv_capacity "
            << r.rejected_by_reason[int(RejectReason::kKvCapacity)] << ", no_workers "
            << r.rejected_by_reason[int(RejectReason::kNoWorkers)] << "; probes " << r.probes
            << "; Admit() " << absl::FormatDuration(r.admit_wall_per_call) << " per call\n";
  if (!r.rejected_at.empty()) {
    std::cout << "  first rejections (arrival/prompt tokens): " << absl::StrJoin(r.rejected_at, " ")
              << "\n";
  }
}

void RunAndCompare(const Workload& workload) {
  const double capacity = Capacity(workload);
  const double rate = 2 * capacity;
  std::cout << workload.name << ": seed " << kSeed << ", Poisson arrivals at " << rate
            << " req/s for " << kArrivalSeconds << " s (2x capacity " << capacity
            << " req/s); targets TTFT " << workload.ttft_target << " s, TPOT "
            << 1000 * workload.tpot_target << " ms\n";

  const Result on = Simulation(workload, /*admission_on=*/true, rate, kSeed).Run();
  const Result off = Simulation(workload, /*admission_on=*/false, rate, kSeed).Run();
  Print("admission on ", on);
  Print("admission off", off);

  EXPECT_EQ(on.completed, on.admitted);
  EXPECT_EQ(off.completed, off.admitted);
  EXPECT_EQ(off.admitted, off.arrived);
  // Overloaded twice over, admission must turn work away...
  EXPECT_LT(on.admitted, 0.8 * on.arrived);
  // ...and what it admits meets its targets.
  EXPECT_GE(on.attainment(), 0.95);
  EXPECT_LE(off.attainment(), 0.5);
  EXPECT_GT(on.goodput_per_second, 2 * off.goodput_per_second);
}

// Below saturation every request can meet its targets (checked with
// admission off), so every refusal is a false one. With the TTFT overhead
// learned apart from the factor, admission refuses (almost) none; taken as
// a factor, the overhead learned on short prompts prices the long ones out.
TEST(AdmissionSimulationTest, LightLoadRefusesNothingItCanServe) {
  const double capacity = Capacity(kLightChat);
  for (const double fraction : {0.3, 0.6}) {
    const double rate = fraction * capacity;
    std::cout << kLightChat.name << ": seed " << kSeed << ", Poisson arrivals at " << rate
              << " req/s (" << fraction << " of capacity) for " << kArrivalSeconds
              << " s; targets TTFT " << kLightChat.ttft_target << " s, TPOT "
              << 1000 * kLightChat.tpot_target << " ms; unmodeled TTFT overhead "
              << 1000 * kTtftOverhead << " ms\n";
    const Result off = Simulation(kLightChat, /*admission_on=*/false, rate, kSeed).Run();
    const Result before =
        Simulation(kLightChat, true, rate, kSeed, /*learn_ttft_overhead=*/false).Run();
    const Result after = Simulation(kLightChat, true, rate, kSeed).Run();
    Print("admission off                 ", off);
    Print("overhead as a factor (before) ", before);
    Print("overhead learned (after)      ", after);
    auto refused = [](const Result& r) { return 1.0 - double(r.admitted) / r.arrived; };
    std::cout << "false rejections: before " << 100 * refused(before) << "%, after "
              << 100 * refused(after) << "%\n";
    // Everything admitted without admission meets its targets (nearly: a
    // long prompt behind another can miss at 0.6), so refusals are false
    // ones but for a few such.
    EXPECT_GE(off.attainment(), 0.99);
    EXPECT_LE(refused(after), 0.005);
    EXPECT_LT(refused(after), refused(before) / 3);
    EXPECT_GE(after.attainment(), 0.99);
  }
}

// A burst at twice capacity on workers slowed down 4x, then light load on
// workers at full speed. What admission learned in the burst (decode steps
// of large, slow batches; TTFT factors and overhead) must not refuse the
// light load after it: with no admitted request there would be no outcome
// to correct it. Outcomes age out (calibration_max_age) and an idle pair is
// probed (idle_probe_interval); without probes the decode model, fitted to
// the burst alone, prices every request past its TPOT target for good.
TEST(AdmissionSimulationTest, ABurstOnSlowedWorkersDoesNotShutOutTheLightLoadAfterIt) {
  const double capacity = Capacity(kLightChat);
  const Burst burst{.until = 10, .slowdown = 4, .rate = 2 * capacity};
  const double rate = 0.3 * capacity;
  constexpr double kFrom = 25;  // The burst's outcomes aged out, its queues drained.
  std::cout << kLightChat.name << ": seed " << kSeed << ", " << burst.rate
            << " req/s on workers slowed " << burst.slowdown << "x for " << burst.until
            << " s, then " << rate << " req/s; counted from " << kFrom << " s\n";
  Simulation with(kLightChat, true, rate, kSeed, true, burst, /*probes=*/true);
  Simulation without(kLightChat, true, rate, kSeed, true, burst, /*probes=*/false);
  with.Run();
  without.Run();
  const Result after = with.Summarize(kFrom, kArrivalSeconds);
  const Result locked = without.Summarize(kFrom, kArrivalSeconds);
  Print("burst           ", with.Summarize(0, burst.until));
  Print("recovery        ", with.Summarize(burst.until, kFrom));
  Print("after, probes   ", after);
  Print("after, no probes", locked);
  auto refused = [](const Result& r) { return 1.0 - double(r.admitted) / r.arrived; };
  EXPECT_GT(after.arrived, 100);
  EXPECT_LE(refused(after), 0.01);
  EXPECT_GE(after.attainment(), 0.99);
  EXPECT_GE(refused(locked), 0.5);
}

TEST(AdmissionSimulationTest, DecodeBoundOverloadKeepsSloAttainment) {
  RunAndCompare(kDecodeBound);
}

TEST(AdmissionSimulationTest, PrefillBoundOverloadKeepsSloAttainment) {
  RunAndCompare(kPrefillBound);
}

}  // namespace
}  // namespace trident::router::admission
