#ifndef TRIDENT_COMMON_TRANSPORT_KV_RENDEZVOUS_RECEIVER_H_
#define TRIDENT_COMMON_TRANSPORT_KV_RENDEZVOUS_RECEIVER_H_

// Receives messages sent by rendezvous (Endpoint::Send with `rendezvous`)
// for a consumer that copies them on (UcxKv's pools in GPU memory, or
// staged): each is fetched into one of a few receive buffers (reused, so
// page-faulted once; pinned for a GPU), then handed to the consumer on the
// receive threads while UCX fetches the next:
//
//   OnMessage (progress thread) -> waiting -> Fetch into a free buffer
//     -> fetched (progress thread) -> ready -> consume (a receive thread)
//     -> the buffer is free again
//
// At most `max_fetches` are fetched at once: UCX interleaves the fragments
// of concurrent fetches, so more would finish together in bursts instead of
// one after another, starving the copy stage. The rest wait, announced but
// not fetched, as they do while every buffer is busy.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/kv_copier.h"
#include "common/transport/ucx_worker.h"

namespace trident::transport {

struct RendezvousReceiverOptions {
  int num_buffers = 8;
  uint64_t buffer_bytes = uint64_t{4} << 20;
  // Threads that consume fetched messages; 0: the progress thread does.
  int num_threads = 2;
  int max_fetches = 4;
};

// Thread-safe.
class RendezvousReceiver {
 public:
  // Makes one receive buffer of `buffer_bytes`, on first use.
  using Allocate = std::function<absl::StatusOr<std::unique_ptr<backend::HostBuffer>>()>;
  // Takes one fetched message: `header` as announced, `data` in a receive
  // buffer, valid during the call only.
  using Consume = std::function<void(absl::string_view header, absl::string_view data)>;
  // Told of every message dropped: longer than a buffer, a buffer that
  // could not be allocated, a fetch that failed.
  using Dropped = std::function<void(const absl::Status& why)>;

  // Starts the receive threads. The callbacks may run on any of them and
  // on UCX's progress threads, until the destructor returns.
  RendezvousReceiver(RendezvousReceiverOptions options, Allocate allocate, Consume consume,
                     Dropped dropped);

  // Waits for fetches in flight (their buffers must outlive them), then
  // stops the threads; messages still waiting are dropped (releasing their
  // senders), those fetched are consumed first.
  ~RendezvousReceiver();

  RendezvousReceiver(const RendezvousReceiver&) = delete;
  RendezvousReceiver& operator=(const RendezvousReceiver&) = delete;

  // A rendezvous handler's work (on the progress thread): queues `message`
  // for a buffer, or drops it if it is longer than one.
  void OnMessage(absl::string_view header, std::unique_ptr<IncomingMessage> message)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Waiting {
    std::string header;
    std::unique_ptr<IncomingMessage> message;
  };
  struct Ready {
    int buffer;
    std::string header;
    size_t length;
  };

  // Starts fetching `message` into `buffer`.
  void Fetch(int buffer, std::string header, std::unique_ptr<IncomingMessage> message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fetch completed (progress thread).
  void Fetched(int buffer, const std::string& header, size_t length, absl::Status status)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Starts fetches while messages wait, buffers are free and fewer than
  // max_fetches run.
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A receive thread.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const RendezvousReceiverOptions options_;
  const Allocate allocate_;
  const Consume consume_;
  const Dropped dropped_;
  absl::Mutex mu_;
  // Allocated on first use, under mu_; read by whoever holds the buffer.
  std::vector<std::unique_ptr<backend::HostBuffer>> buffers_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  std::deque<Ready> ready_ ABSL_GUARDED_BY(mu_);
  int fetching_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // Started last in the constructor.
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_RENDEZVOUS_RECEIVER_H_
