#include "services/worker/load_streams.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc/reactors.h"
#include "common/grpc/status.h"
#include "common/kv/kv_events_proto.h"
#include "common/status/error_details.h"
#include "common/time/proto_time.h"

namespace trident::worker {

using ::trident::v1::WorkerLoad;

class LoadStreams::Stream final : public grpc::ServerWriteReactor<WorkerLoad> {
 public:
  Stream(LoadStreams* owner, absl::Duration interval) : owner_(owner), interval_(interval) {}

  // Under owner_->mu_: writes `sample` if the previous write is done and the
  // stream is due (or `force`); returns when to look at it again: its due
  // time, or shortly if a write to a slow reader is overdue.
  absl::Time MaybeWrite(const WorkerLoad& sample, absl::Time now, bool force)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    if (finishing_) return absl::InfiniteFuture();
    if (!writing_ && (force || now >= next_due_)) {
      message_ = sample;
      AddKvEvents(now);
      writing_ = true;
      next_due_ = now + interval_;
      StartWrite(&message_);
    }
    if (writing_ && next_due_ <= now) return now + absl::Milliseconds(10);
    return next_due_;
  }

  // Under owner_->mu_.
  void End(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    if (finishing_) return;
    finishing_ = true;
    end_status_ = status;
    if (!writing_) Finish(status);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&owner_->mu_);
    writing_ = false;
    if (!ok && !finishing_) {
      finishing_ = true;
      end_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the load stream's reader is gone");
    }
    if (finishing_) Finish(end_status_);
  }

  void OnCancel() override {
    absl::MutexLock lock(&owner_->mu_);
    End(grpc::Status(grpc::StatusCode::CANCELLED, "GetLoad cancelled"));
  }

  void OnDone() override {
    owner_->Remove(this);
    delete this;
  }

 private:
  // The cache's events since this stream's last sample, or a snapshot (the
  // first sample, and every snapshot_interval).
  void AddKvEvents(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(owner_->mu_) {
    const KvEventsSource& source = owner_->kv_events_;
    if (source.log == nullptr) return;
    if (now - last_snapshot_ >= source.snapshot_interval) {
      kv_cursor_ = 0;
      dram_cursor_ = 0;
    }
    const kv::KvEventBatch batch = source.log->ReadSince(&kv_cursor_);
    if (batch.snapshot) last_snapshot_ = now;
    kv::KvEventsToProto(batch, source.cache_identity, source.block_size_tokens, "gpu",
                        message_.mutable_kv_events());
    if (source.dram_log == nullptr) return;
    kv::KvEventsToProto(source.dram_log->ReadSince(&dram_cursor_), source.cache_identity,
                        source.block_size_tokens, "dram", message_.mutable_dram_kv_events());
  }

  uint64_t kv_cursor_ = 0;
  uint64_t dram_cursor_ = 0;
  absl::Time last_snapshot_ = absl::InfinitePast();
  LoadStreams* const owner_;
  const absl::Duration interval_;
  absl::Time next_due_ = absl::InfinitePast();
  bool writing_ = false;
  bool finishing_ = false;
  grpc::Status end_status_;
  WorkerLoad message_;
};

LoadStreams::LoadStreams(Sampler sample, KvEventsSource kv_events)
    : sample_(std::move(sample)), kv_events_(std::move(kv_events)) {
  ticker_ = std::thread([this] { Tick(); });
}

LoadStreams::~LoadStreams() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (Stream* s : streams_) {
      s->End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is shutting down"));
    }
    auto all_done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_.empty(); };
    mu_.Await(absl::Condition(&all_done));
  }
  ticker_.join();
}

grpc::ServerWriteReactor<WorkerLoad>* LoadStreams::Open(
    grpc::CallbackServerContext* context, const trident::v1::GetLoadRequest* request) {
  absl::Duration interval = absl::Milliseconds(100);
  if (request->has_interval()) {
    interval = DurationFromProto(request->interval());
    if (interval < absl::Milliseconds(10) || interval > absl::Seconds(60)) {
      return new FinishedWriteReactor<WorkerLoad>(InvalidArgumentForField(
          "interval",
          absl::StrCat("must be within [10ms, 60s], got ", absl::FormatDuration(interval))));
    }
  }
  const WorkerLoad first = sample_();
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return new FinishedWriteReactor<WorkerLoad>(
        absl::UnavailableError("the worker is shutting down"));
  }
  auto* stream = new Stream(this, interval);
  streams_.insert(stream);
  stream->MaybeWrite(first, absl::Now(), /*force=*/true);
  wake_ = true;  // The ticker recomputes its wait with this stream's due time.
  return stream;
}

void LoadStreams::Remove(Stream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

int LoadStreams::open_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(streams_.size());
}

void LoadStreams::Tick() {
  absl::Time next = absl::InfiniteFuture();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Sleeps until the earliest stream is due, a stream opens, or stop.
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || wake_; };
      mu_.AwaitWithDeadline(absl::Condition(&woken), next);
      if (stopping_) return;
      wake_ = false;
      next = absl::InfiniteFuture();
      if (streams_.empty()) continue;
    }
    const WorkerLoad sample = sample_();
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (Stream* s : streams_) next = std::min(next, s->MaybeWrite(sample, now, false));
  }
}

}  // namespace trident::worker
