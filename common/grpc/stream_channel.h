// A server-streaming reactor fed from other threads: producers (an engine's
// token callbacks, completion callbacks) push messages into a Channel that
// outlives the reactor; the reactor writes them one at a time and finishes
// with the status given to Close once they are written. Cancellation by the
// client finishes it with CANCELLED and runs the reactor's on_cancel hook
// once; pushes after the end are dropped (Push returns false).

#ifndef TRIDENT_COMMON_GRPC_STREAM_CHANNEL_H_
#define TRIDENT_COMMON_GRPC_STREAM_CHANNEL_H_

#include <deque>
#include <functional>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/status.h"
#include "grpcpp/grpcpp.h"

namespace trident {

template <typename Response>
class ChannelReactor;

// Thread-safe.
template <typename Response>
class StreamChannel {
 public:
  // Queues `message`; false when the stream has ended (closed, cancelled or
  // done).
  bool Push(Response message) {
    absl::MutexLock lock(&mu_);
    if (closed_ || reactor_ == nullptr) return false;
    pending_.push_back(std::move(message));
    PumpLocked();
    return true;
  }

  // Ends the stream with `status` after the queued messages. Later calls are
  // ignored.
  void Close(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    final_ = ToGrpcStatus(status);
    PumpLocked();
  }

  bool ended() const {
    absl::MutexLock lock(&mu_);
    return closed_ || reactor_ == nullptr;
  }

 private:
  friend class ChannelReactor<Response>;

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (reactor_ == nullptr || writing_ || finished_) return;
    if (cancelled_) {
      finished_ = true;
      reactor_->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call"));
      return;
    }
    if (!pending_.empty()) {
      writing_ = true;
      reactor_->StartWrite(&pending_.front());
      return;
    }
    if (closed_) {
      finished_ = true;
      reactor_->Finish(final_);
    }
  }

  mutable absl::Mutex mu_;
  ChannelReactor<Response>* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<Response> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
};

// Owned by gRPC (deleted in OnDone).
template <typename Response>
class ChannelReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  // `on_cancel` runs once, on a gRPC thread, if the client cancels (or the
  // deadline passes) before the stream finished; `on_done` runs once when
  // the call is over, whatever ended it.
  ChannelReactor(std::function<void()> on_cancel, std::function<void()> on_done)
      : channel_(std::make_shared<StreamChannel<Response>>()),
        on_cancel_(std::move(on_cancel)),
        on_done_(std::move(on_done)) {
    absl::MutexLock lock(&channel_->mu_);
    channel_->reactor_ = this;
  }

  std::shared_ptr<StreamChannel<Response>> channel() const { return channel_; }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&channel_->mu_);
    channel_->writing_ = false;
    if (!channel_->pending_.empty()) channel_->pending_.pop_front();
    if (!ok) channel_->cancelled_ = true;
    channel_->PumpLocked();
  }

  void OnCancel() override {
    bool run_hook;
    {
      absl::MutexLock lock(&channel_->mu_);
      run_hook = !channel_->finished_;
      channel_->cancelled_ = true;
      channel_->PumpLocked();
    }
    if (run_hook && on_cancel_) on_cancel_();
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&channel_->mu_);
      channel_->reactor_ = nullptr;
    }
    if (on_done_) on_done_();
    delete this;
  }

 private:
  std::shared_ptr<StreamChannel<Response>> channel_;
  std::function<void()> on_cancel_;
  std::function<void()> on_done_;
};

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_STREAM_CHANNEL_H_
