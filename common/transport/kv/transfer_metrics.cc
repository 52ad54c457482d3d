#include "common/transport/kv/transfer_metrics.h"

#include <utility>

#include "common/logging/log.h"

namespace trident::transport {
namespace {

constexpr char kUnknownLane[] = "unknown";

// Wraps a transfer: counts its layers' completions and records the transfer
// in the metrics when destroyed.
class MeteredTransfer final : public KvTransfer {
 public:
  MeteredTransfer(std::unique_ptr<KvTransfer> inner, KvTransferMetrics* metrics, const Clock* clock,
                  absl::Time opened, int32_t num_layers)
      : inner_(std::move(inner)),
        metrics_(metrics),
        clock_(clock),
        opened_(opened),
        num_layers_(num_layers),
        state_(std::make_shared<State>()) {}

  ~MeteredTransfer() override {
    KvTransferOutcome outcome;
    absl::Time end;
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->failed > 0) {
        outcome = KvTransferOutcome::kError;
      } else if (state_->completed == num_layers_ && state_->posted == num_layers_) {
        outcome = KvTransferOutcome::kOk;
      } else {
        outcome = KvTransferOutcome::kIncomplete;
      }
      end = state_->completed + state_->failed > 0 ? state_->last_done : clock_->Now();
    }
    metrics_->RecordTransfer(inner_->lane(), outcome, inner_->bytes_sent(), end - opened_);
  }

  void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                 std::function<void(absl::Status)> done) override {
    {
      absl::MutexLock lock(&state_->mu);
      ++state_->posted;
    }
    // The callback may run after this transfer is gone: it holds the state
    // and the clock (which outlives every transfer), never `this`.
    inner_->SendLayer(layer, local_blocks,
                      [state = state_, clock = clock_, done = std::move(done)](absl::Status s) {
                        {
                          absl::MutexLock lock(&state->mu);
                          if (s.ok()) {
                            ++state->completed;
                          } else {
                            ++state->failed;
                          }
                          state->last_done = clock->Now();
                        }
                        done(std::move(s));
                      });
  }
  int64_t bytes_sent() const override { return inner_->bytes_sent(); }
  int32_t messages() const override { return inner_->messages(); }
  std::string lane() const override { return inner_->lane(); }
  int64_t message_bytes() const override { return inner_->message_bytes(); }

 private:
  struct State {
    absl::Mutex mu;
    int32_t posted ABSL_GUARDED_BY(mu) = 0;
    int32_t completed ABSL_GUARDED_BY(mu) = 0;
    int32_t failed ABSL_GUARDED_BY(mu) = 0;
    absl::Time last_done ABSL_GUARDED_BY(mu);
  };

  const std::unique_ptr<KvTransfer> inner_;
  KvTransferMetrics* const metrics_;
  const Clock* const clock_;
  const absl::Time opened_;
  const int32_t num_layers_;
  const std::shared_ptr<State> state_;
};

}  // namespace

absl::string_view KvTransferOutcomeName(KvTransferOutcome outcome) {
  switch (outcome) {
    case KvTransferOutcome::kOk:
      return "ok";
    case KvTransferOutcome::kError:
      return "error";
    case KvTransferOutcome::kIncomplete:
      return "incomplete";
    case KvTransferOutcome::kOpenError:
      return "open_error";
  }
  return "error";
}

std::vector<double> KvTransferSecondsBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

KvTransferMetrics::KvTransferMetrics(prometheus::Registry& r)
    : transfers_(prometheus::BuildCounter()
                     .Name("trident_worker_kv_transfers_total")
                     .Help("KV transfers sent, by lane and outcome (ok, error, incomplete, "
                           "open_error).")
                     .Register(r)),
      bytes_(prometheus::BuildCounter()
                 .Name("trident_worker_kv_transfer_bytes_total")
                 .Help("KV bytes whose writes completed, by lane and role (send).")
                 .Register(r)),
      seconds_(prometheus::BuildHistogram()
                   .Name("trident_worker_kv_transfer_seconds")
                   .Help("KV transfer time, open to the last layer's completion, of ok "
                         "transfers, by lane.")
                   .Register(r)),
      lane_info_(prometheus::BuildGauge()
                     .Name("trident_worker_kv_lane_info")
                     .Help("1 for each transport lane this worker's KV transfers used.")
                     .Register(r)),
      reservations_(prometheus::BuildGauge()
                        .Name("trident_worker_kv_reservations")
                        .Help("KV reservations held on this decode worker.")
                        .Register(r)
                        .Add({})),
      reserved_blocks_(prometheus::BuildGauge()
                           .Name("trident_worker_kv_reserved_blocks")
                           .Help("KV blocks held by reservations on this decode worker.")
                           .Register(r)
                           .Add({})),
      dropped_messages_(prometheus::BuildCounter()
                            .Name("trident_worker_kv_messages_dropped_total")
                            .Help("KV messages received and dropped: late ones of an ended "
                                  "transfer, ones that failed to arrive, invalid ones.")
                            .Register(r)
                            .Add({})) {}

void KvTransferMetrics::RecordTransfer(const std::string& lane, KvTransferOutcome outcome,
                                       int64_t bytes_sent, absl::Duration duration) {
  transfers_.Add({{"lane", lane}, {"outcome", std::string(KvTransferOutcomeName(outcome))}})
      .Increment();
  if (bytes_sent > 0) {
    bytes_.Add({{"lane", lane}, {"role", "send"}}).Increment(static_cast<double>(bytes_sent));
  }
  if (outcome == KvTransferOutcome::kOk) {
    seconds_.Add({{"lane", lane}}, KvTransferSecondsBuckets())
        .Observe(absl::ToDoubleSeconds(duration));
  }
}

void KvTransferMetrics::NoteLane(const std::string& lane) {
  lane_info_.Add({{"lane", lane}}).Set(1);
}

void KvTransferMetrics::SetReservations(int32_t reservations, int32_t blocks) {
  reservations_.Set(reservations);
  reserved_blocks_.Set(blocks);
}

void KvTransferMetrics::SetDroppedMessages(int64_t total) {
  if (total > dropped_seen_) {
    dropped_messages_.Increment(static_cast<double>(total - dropped_seen_));
    dropped_seen_ = total;
  }
}

MeteredKvSender::MeteredKvSender(KvSender* inner, KvTransferMetrics* metrics, const Clock* clock)
    : inner_(inner), metrics_(metrics), clock_(clock) {}

absl::StatusOr<std::unique_ptr<KvTransfer>> MeteredKvSender::Open(
    const trident::v1::KvDestination& destination) {
  const absl::Time opened = clock_->Now();
  absl::StatusOr<std::unique_ptr<KvTransfer>> inner = inner_->Open(destination);
  if (!inner.ok()) {
    metrics_->RecordTransfer(kUnknownLane, KvTransferOutcome::kOpenError, 0,
                             clock_->Now() - opened);
    return inner.status();
  }
  const std::string lane = (*inner)->lane();
  metrics_->NoteLane(lane);
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = logged_.emplace(destination.decode_worker_id(), lane).second;
  }
  if (first) {
    TRIDENT_LOG(INFO) << "KV transfers to decode worker " << destination.decode_worker_id() << " ("
                      << destination.decode_address() << ") use transport lane '" << lane << "'";
  }
  return std::unique_ptr<KvTransfer>(
      new MeteredTransfer(*std::move(inner), metrics_, clock_, opened, inner_->num_layers()));
}

PeriodicSampler::PeriodicSampler(absl::Duration interval, std::function<void()> sample) {
  thread_ = std::thread([this, interval, sample = std::move(sample)] {
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    do {
      mu_.Unlock();
      sample();
      mu_.Lock();
    } while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), interval));
  });
}

PeriodicSampler::~PeriodicSampler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

}  // namespace trident::transport
