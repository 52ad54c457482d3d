// The worker's KV-transfer metrics (disaggregated serving), and how they are
// fed without touching the code that moves KV: MeteredKvSender wraps the
// prefill side's KvSender and records every transfer it opens; a
// PeriodicSampler reads the decode side's reservations into gauges.
//
// Every metric, its labels and what it means:
//
//   trident_worker_kv_transfers_total{lane, outcome}      counter
//       KV transfers this worker sent, by UCX lane and outcome: ok (every
//       layer written), error (a write failed, e.g. the peer died),
//       incomplete (ended before every layer was written: cancelled), or
//       open_error (the destination was rejected or unreachable; lane
//       "unknown").
//   trident_worker_kv_transfer_bytes_total{lane, role}    counter
//       KV bytes whose writes completed, role "send" (the prefill side; the
//       decode side of a one-sided put sees no bytes of its own).
//   trident_worker_kv_transfer_seconds{lane}              histogram
//       Open to the last layer's completion, for ok transfers (includes
//       connecting to a new peer).
//   trident_worker_kv_lane_info{lane}                     gauge, always 1
//       The lanes this worker's transfers have used, as UCX names them
//       ("tcp", "posix", "rc_mlx5", "cuda_ipc", ...). The first transfer to
//       each peer over a lane also logs it.
//   trident_worker_kv_reservations                        gauge
//       KV reservations held on this (decode) worker: reserved and not yet
//       handed to a decode, released or expired.
//   trident_worker_kv_reserved_blocks                     gauge
//       KV blocks those reservations hold.
//   trident_worker_kv_messages_dropped_total              counter
//       KV messages this (decode) worker received and dropped: late ones
//       of a transfer that ended (its sender died, or its reservation was
//       released or expired), ones that failed to arrive, invalid ones.

#ifndef TRIDENT_COMMON_TRANSPORT_KV_TRANSFER_METRICS_H_
#define TRIDENT_COMMON_TRANSPORT_KV_TRANSFER_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "common/transport/kv/kv_sender.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace trident::transport {

// How a transfer ended (the `outcome` label).
enum class KvTransferOutcome { kOk, kError, kIncomplete, kOpenError };

// "ok", "error", "incomplete", "open_error".
absl::string_view KvTransferOutcomeName(KvTransferOutcome outcome);

// Buckets of trident_worker_kv_transfer_seconds: 0.5 ms to 10 s.
std::vector<double> KvTransferSecondsBuckets();

// Thread-safe.
class KvTransferMetrics {
 public:
  // Registers the families in `registry`, which must outlive this.
  explicit KvTransferMetrics(prometheus::Registry& registry);

  KvTransferMetrics(const KvTransferMetrics&) = delete;
  KvTransferMetrics& operator=(const KvTransferMetrics&) = delete;

  // One transfer's end: the counters, and the histogram for kOk.
  void RecordTransfer(const std::string& lane, KvTransferOutcome outcome, int64_t bytes_sent,
                      absl::Duration duration);

  // Sets trident_worker_kv_lane_info{lane} to 1.
  void NoteLane(const std::string& lane);

  // The reservation gauges.
  void SetReservations(int32_t reservations, int32_t blocks);
  // The receiver's running count of dropped KV messages
  // (KvReceiver::dropped_messages()); the counter follows it.
  void SetDroppedMessages(int64_t total);

 private:
  prometheus::Family<prometheus::Counter>& transfers_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  prometheus::Family<prometheus::Gauge>& lane_info_;
  prometheus::Gauge& reservations_;
  prometheus::Gauge& reserved_blocks_;
  prometheus::Counter& dropped_messages_;
  int64_t dropped_seen_ = 0;  // Guarded by the caller (one sampler thread).
};

// A KvSender that records what another one sends in KvTransferMetrics. Each
// transfer is recorded when its KvTransfer is destroyed (the prefill service
// destroys it after every posted write finished). Thread-safe.
class MeteredKvSender final : public KvSender {
 public:
  // `inner`, `metrics` and `clock` must outlive this and every transfer it
  // opens.
  MeteredKvSender(KvSender* inner, KvTransferMetrics* metrics, const Clock* clock);

  int32_t num_layers() const override { return inner_->num_layers(); }
  absl::StatusOr<std::unique_ptr<KvTransfer>> Open(
      const trident::v1::KvDestination& destination) override;
  absl::Status Connect(const trident::v1::KvDestination& destination) override {
    return inner_->Connect(destination);
  }

 private:
  KvSender* const inner_;
  KvTransferMetrics* const metrics_;
  const Clock* const clock_;
  absl::Mutex mu_;
  // (peer worker id, lane) pairs already logged.
  absl::flat_hash_set<std::pair<std::string, std::string>> logged_ ABSL_GUARDED_BY(mu_);
};

// Calls `sample` on its own thread at once and then every `interval`, until
// destroyed (for gauges read from state no hook updates, e.g. the decode
// side's reservations). The destructor waits for a call in progress.
class PeriodicSampler {
 public:
  PeriodicSampler(absl::Duration interval, std::function<void()> sample);
  ~PeriodicSampler();

  PeriodicSampler(const PeriodicSampler&) = delete;
  PeriodicSampler& operator=(const PeriodicSampler&) = delete;

 private:
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_TRANSFER_METRICS_H_
