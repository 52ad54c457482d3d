#include "common/transport/kv/transfer_metrics.h"

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/telemetry/collected_series.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace trident::transport {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;
namespace v1 = ::trident::v1;

using Series = ::trident::telemetry::CollectedSeries;

Series Find(prometheus::Registry& registry, const std::string& name,
            const prometheus::Labels& labels) {
  return ::trident::telemetry::FindSeries(registry, name, labels);
}

// Completions the fake transport has not delivered yet (shared with the
// test, so they can run after the transfer is gone).
using Pending = std::vector<std::function<void()>>;

// A transport whose writes complete when the test says: at once with
// `status` (advancing the clock by `layer_time` first), or later from
// `pending`.
class FakeTransfer final : public KvTransfer {
 public:
  FakeTransfer(FakeClock* clock, absl::Duration layer_time, std::vector<absl::Status> statuses,
               std::shared_ptr<Pending> pending, int64_t bytes_per_layer)
      : clock_(clock),
        layer_time_(layer_time),
        statuses_(std::move(statuses)),
        pending_(std::move(pending)),
        bytes_per_layer_(bytes_per_layer) {}
  void SendLayer(int32_t layer, absl::Span<const int32_t>,
                 std::function<void(absl::Status)> done) override {
    const absl::Status s =
        layer < static_cast<int32_t>(statuses_.size()) ? statuses_[layer] : absl::OkStatus();
    if (s.ok()) bytes_ += bytes_per_layer_;
    if (pending_ != nullptr) {
      pending_->push_back([done, s] { done(s); });
      return;
    }
    clock_->Advance(layer_time_);
    done(s);
  }
  int64_t bytes_sent() const override { return bytes_; }
  int32_t messages() const override { return 7; }
  std::string lane() const override { return "memcpy"; }
  int64_t message_bytes() const override { return 0; }

 private:
  FakeClock* const clock_;
  const absl::Duration layer_time_;
  const std::vector<absl::Status> statuses_;
  const std::shared_ptr<Pending> pending_;
  const int64_t bytes_per_layer_;
  int64_t bytes_ = 0;
};

class FakeSender final : public KvSender {
 public:
  explicit FakeSender(FakeClock* clock) : clock_(clock) {}
  int32_t num_layers() const override { return 3; }
  absl::StatusOr<std::unique_ptr<KvTransfer>> Open(const v1::KvDestination& d) override {
    clock_->Advance(connect_time);
    if (d.decode_address() == "unreachable:1") {
      return absl::UnavailableError("cannot reach unreachable:1");
    }
    return std::unique_ptr<KvTransfer>(
        new FakeTransfer(clock_, absl::Milliseconds(2), statuses, pending, 1000));
  }

  absl::Duration connect_time = absl::Milliseconds(1);
  std::vector<absl::Status> statuses;
  std::shared_ptr<Pending> pending;

 private:
  FakeClock* const clock_;
};

class TransferMetricsTest : public ::testing::Test {
 protected:
  TransferMetricsTest() {
    destination_.set_decode_worker_id("decode-1");
    destination_.set_decode_address("127.0.0.1:5");
  }

  // Opens a transfer through the metered sender and posts `layers` layers,
  // counting the callbacks and their errors.
  void Run(int layers) {
    auto transfer = metered_.Open(destination_);
    ASSERT_THAT(transfer.status(), IsOk());
    EXPECT_EQ((*transfer)->lane(), "memcpy");
    EXPECT_EQ((*transfer)->messages(), 7);
    for (int layer = 0; layer < layers; ++layer) {
      (*transfer)->SendLayer(layer, {}, [this](absl::Status s) {
        ++callbacks_;
        if (!s.ok()) ++callback_errors_;
      });
    }
  }

  double Transfers(const std::string& lane, const std::string& outcome) {
    return Find(registry_, "trident_worker_kv_transfers_total",
                {{"lane", lane}, {"outcome", outcome}})
        .value;
  }

  prometheus::Registry registry_;
  KvTransferMetrics metrics_{registry_};
  FakeClock clock_{absl::FromUnixSeconds(100)};
  FakeSender sender_{&clock_};
  MeteredKvSender metered_{&sender_, &metrics_, &clock_};
  v1::KvDestination destination_;
  int callbacks_ = 0;
  int callback_errors_ = 0;
};

TEST_F(TransferMetricsTest, ACompleteTransferCountsItsLaneBytesAndTime) {
  EXPECT_EQ(metered_.num_layers(), 3);
  Run(3);
  EXPECT_EQ(callbacks_, 3);
  EXPECT_EQ(callback_errors_, 0);
  EXPECT_EQ(Transfers("memcpy", "ok"), 1);
  EXPECT_EQ(Transfers("memcpy", "error"), 0);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_transfer_bytes_total",
                 {{"lane", "memcpy"}, {"role", "send"}})
                .value,
            3000);
  const Series seconds =
      Find(registry_, "trident_worker_kv_transfer_seconds", {{"lane", "memcpy"}});
  EXPECT_EQ(seconds.count, 1u);
  // 1 ms to connect, 3 layers of 2 ms.
  EXPECT_THAT(seconds.sum, DoubleNear(0.007, 1e-9));
  EXPECT_EQ(Find(registry_, "trident_worker_kv_lane_info", {{"lane", "memcpy"}}).value, 1);

  Run(3);
  EXPECT_EQ(Transfers("memcpy", "ok"), 2);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_transfer_seconds", {{"lane", "memcpy"}}).count, 2u);
}

TEST_F(TransferMetricsTest, AFailedWriteIsAnErrorWithoutATime) {
  sender_.statuses = {absl::OkStatus(), absl::UnavailableError("peer died")};
  Run(3);
  EXPECT_EQ(callbacks_, 3);
  EXPECT_EQ(callback_errors_, 1);  // The status reaches the caller's callback.
  EXPECT_EQ(Transfers("memcpy", "error"), 1);
  EXPECT_EQ(Transfers("memcpy", "ok"), 0);
  // The layers that did complete count as bytes.
  EXPECT_EQ(Find(registry_, "trident_worker_kv_transfer_bytes_total",
                 {{"lane", "memcpy"}, {"role", "send"}})
                .value,
            2000);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_transfer_seconds", {{"lane", "memcpy"}}).count, 0u);
}

TEST_F(TransferMetricsTest, ATransferEndedBeforeEveryLayerIsIncomplete) {
  Run(1);  // Cancelled after one layer.
  EXPECT_EQ(Transfers("memcpy", "incomplete"), 1);
  EXPECT_EQ(Transfers("memcpy", "ok"), 0);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_transfer_seconds", {{"lane", "memcpy"}}).count, 0u);
}

TEST_F(TransferMetricsTest, CompletionsAfterTheTransferIsGoneAreSafe) {
  sender_.pending = std::make_shared<Pending>();
  Run(3);
  EXPECT_EQ(callbacks_, 0);
  // Recorded when destroyed: nothing had completed.
  EXPECT_EQ(Transfers("memcpy", "incomplete"), 1);
  for (auto& complete : *sender_.pending) complete();
  EXPECT_EQ(callbacks_, 3);
  EXPECT_EQ(Transfers("memcpy", "ok"), 0);
}

TEST_F(TransferMetricsTest, AnUnreachableDestinationIsAnOpenError) {
  destination_.set_decode_address("unreachable:1");
  auto transfer = metered_.Open(destination_);
  EXPECT_THAT(transfer.status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("unreachable:1")));
  EXPECT_EQ(Transfers("unknown", "open_error"), 1);
  EXPECT_FALSE(Find(registry_, "trident_worker_kv_lane_info", {{"lane", "memcpy"}}).found);
}

TEST_F(TransferMetricsTest, ReservationGaugesHoldTheLastSample) {
  EXPECT_EQ(Find(registry_, "trident_worker_kv_reservations", {}).value, 0);
  metrics_.SetReservations(4, 17);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_reservations", {}).value, 4);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_reserved_blocks", {}).value, 17);
  metrics_.SetReservations(0, 0);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_reservations", {}).value, 0);
}

TEST_F(TransferMetricsTest, DroppedMessagesCounterFollowsTheReceiversCount) {
  EXPECT_EQ(Find(registry_, "trident_worker_kv_messages_dropped_total", {}).value, 0);
  metrics_.SetDroppedMessages(3);
  metrics_.SetDroppedMessages(3);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_messages_dropped_total", {}).value, 3);
  metrics_.SetDroppedMessages(10);
  EXPECT_EQ(Find(registry_, "trident_worker_kv_messages_dropped_total", {}).value, 10);
}

TEST(PeriodicSamplerTest, SamplesAtOnceAndStopsWhenDestroyed) {
  absl::Notification sampled;
  int calls = 0;
  {
    // An hour's interval: only the first sample can happen, and the
    // destructor must not wait for the next one.
    PeriodicSampler sampler(absl::Hours(1), [&] {
      if (++calls == 1) sampled.Notify();
    });
    sampled.WaitForNotification();
  }
  EXPECT_EQ(calls, 1);
}

TEST(KvTransferOutcomeTest, Names) {
  EXPECT_EQ(KvTransferOutcomeName(KvTransferOutcome::kOk), "ok");
  EXPECT_EQ(KvTransferOutcomeName(KvTransferOutcome::kError), "error");
  EXPECT_EQ(KvTransferOutcomeName(KvTransferOutcome::kIncomplete), "incomplete");
  EXPECT_EQ(KvTransferOutcomeName(KvTransferOutcome::kOpenError), "open_error");
  const std::vector<double> b = KvTransferSecondsBuckets();
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
}

}  // namespace
}  // namespace trident::transport
