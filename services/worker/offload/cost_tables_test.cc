#include "services/worker/offload/cost_tables.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/time/clock.h"
#include "common/transport/attention/fake_remote_attention.h"
#include "gtest/gtest.h"

namespace trident::worker {
namespace {

namespace attention = transport::attention;

constexpr int32_t kLayers = 2, kQHeads = 4, kKvHeads = 2, kHeadDim = 8;

// A service whose answers take a modelled time on a fake clock: a request
// costs `base` + `per_sequence` for each sequence after the first +
// `per_token` for each context token it reads. It answers as the fake
// service does (so the calls are checked), and the clock moves when the
// answer is waited for.
class TimedService final : public attention::RemoteAttention {
 public:
  TimedService(FakeClock* clock, absl::Duration base, absl::Duration per_sequence,
               absl::Duration per_token)
      : clock_(clock),
        base_(base),
        per_sequence_(per_sequence),
        per_token_(per_token),
        fake_(kLayers, kQHeads, kKvHeads, kHeadDim) {}

  attention::FakeRemoteAttention& fake() { return fake_; }

  absl::StatusOr<Ticket> Start(const attention::AttentionCall& call) override {
    absl::StatusOr<Ticket> ticket = fake_.Start(call);
    if (!ticket.ok()) return ticket;
    absl::Duration took = base_ + per_sequence_ * static_cast<int64_t>(call.handles.size() - 1);
    for (int32_t position : call.positions) took += per_token_ * (position + 1);
    absl::MutexLock lock(&mu_);
    took_[*ticket] = took;
    return ticket;
  }
  absl::StatusOr<Ticket> StartAppend(const attention::KvAppendCall& call) override {
    return fake_.StartAppend(call);
  }
  absl::Status Wait(Ticket ticket, absl::Duration timeout) override {
    {
      absl::MutexLock lock(&mu_);
      const auto it = took_.find(ticket);
      if (it != took_.end()) {
        clock_->Advance(it->second);
        took_.erase(it);
      }
    }
    return fake_.Wait(ticket, timeout);
  }

 private:
  FakeClock* const clock_;
  const absl::Duration base_, per_sequence_, per_token_;
  attention::FakeRemoteAttention fake_;
  absl::Mutex mu_;
  absl::flat_hash_map<Ticket, absl::Duration> took_ ABSL_GUARDED_BY(mu_);
};

ServiceProbe Probe(attention::RemoteAttention* channel, const Clock* clock) {
  return ServiceProbe{.channel = channel,
                      .num_q_heads = kQHeads,
                      .num_kv_heads = kKvHeads,
                      .head_dim = kHeadDim,
                      .num_layers = kLayers,
                      .dtype = attention::WireDType::kF32,
                      .max_context = 1024,
                      .clock = clock};
}

TEST(MeasureServiceCostsTest, SeparatesTheRoundTripContextAndPerSequenceCosts) {
  FakeClock clock;
  TimedService service(&clock, absl::Microseconds(40), absl::Microseconds(20),
                       absl::Nanoseconds(100));
  const uint64_t handle = service.fake().Admit();
  std::vector<uint64_t> batch;
  for (int i = 0; i < 16; ++i) batch.push_back(service.fake().Admit());
  absl::StatusOr<ServiceCosts> costs = MeasureServiceCosts(Probe(&service, &clock), handle, batch);
  ASSERT_TRUE(costs.ok()) << costs.status();
  // The round trip reads one token: 40.1 us.
  EXPECT_NEAR(costs->round_trip_seconds, 40.1e-6, 1e-9);
  // 16 one-token sequences: 40 + 15 x 20 + 16 x 0.1 us, less the round
  // trip, over the 15 after the first.
  EXPECT_NEAR(costs->per_sequence_seconds, (300 + 1.5) * 1e-6 / 15, 1e-9);
  // Above the round trip, 0.1 us a context token (the one token it already
  // counts aside).
  EXPECT_NEAR(costs->attention.At(1024), 102.3e-6, 1e-9);
  EXPECT_NEAR(costs->attention.At(256), 25.5e-6, 1e-9);
}

TEST(MeasureServiceCostsTest, WithoutABatchThePerSequenceCostIsZero) {
  FakeClock clock;
  TimedService service(&clock, absl::Microseconds(40), absl::Microseconds(20),
                       absl::Nanoseconds(100));
  const uint64_t handle = service.fake().Admit();
  absl::StatusOr<ServiceCosts> costs = MeasureServiceCosts(Probe(&service, &clock), handle);
  ASSERT_TRUE(costs.ok()) << costs.status();
  EXPECT_EQ(costs->per_sequence_seconds, 0);
  EXPECT_NEAR(costs->round_trip_seconds, 40.1e-6, 1e-9);
}

TEST(MeasureServiceCostsTest, ABatchOfOneIsRefused) {
  FakeClock clock;
  TimedService service(&clock, absl::Microseconds(40), absl::ZeroDuration(), absl::ZeroDuration());
  const uint64_t handle = service.fake().Admit();
  const std::vector<uint64_t> one = {service.fake().Admit()};
  EXPECT_EQ(MeasureServiceCosts(Probe(&service, &clock), handle, one).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MeasureServiceCostsTest, AServiceErrorIsReturned) {
  FakeClock clock;
  TimedService service(&clock, absl::Microseconds(40), absl::ZeroDuration(), absl::ZeroDuration());
  const uint64_t handle = service.fake().Admit();
  service.fake().Kill();
  EXPECT_EQ(MeasureServiceCosts(Probe(&service, &clock), handle).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace trident::worker
