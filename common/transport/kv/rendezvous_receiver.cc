#include "common/transport/kv/rendezvous_receiver.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace trident::transport {

RendezvousReceiver::RendezvousReceiver(RendezvousReceiverOptions options, Allocate allocate,
                                       Consume consume, Dropped dropped)
    : options_(options),
      allocate_(std::move(allocate)),
      consume_(std::move(consume)),
      dropped_(std::move(dropped)) {
  buffers_.resize(options_.num_buffers);
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < options_.num_buffers; ++i) free_.push_back(i);
  }
  for (int i = 0; i < options_.num_threads; ++i) threads_.emplace_back([this] { Run(); });
}

RendezvousReceiver::~RendezvousReceiver() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    waiting_.clear();
    auto no_fetch = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return fetching_ == 0; };
    mu_.Await(absl::Condition(&no_fetch));
  }
  // They consume what is ready, then return.
  for (std::thread& thread : threads_) thread.join();
}

void RendezvousReceiver::OnMessage(absl::string_view header,
                                   std::unique_ptr<IncomingMessage> message) {
  if (message->length() > options_.buffer_bytes) {
    dropped_(absl::InvalidArgumentError(absl::StrCat("a KV message of ", message->length(),
                                                     " bytes exceeds the receive buffers' ",
                                                     options_.buffer_bytes, " bytes")));
    return;  // Dropping it releases the sender.
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  waiting_.push_back({std::string(header), std::move(message)});
  Pump();
}

void RendezvousReceiver::Fetch(int buffer, std::string header,
                               std::unique_ptr<IncomingMessage> message) {
  if (buffers_[buffer] == nullptr) {
    absl::StatusOr<std::unique_ptr<backend::HostBuffer>> allocated = allocate_();
    if (!allocated.ok()) {
      dropped_(allocated.status());
      free_.push_back(buffer);
      return;  // Dropping `message` releases its sender.
    }
    buffers_[buffer] = *std::move(allocated);
  }
  ++fetching_;
  const size_t length = message->length();
  IncomingMessage* raw = message.release();
  // `raw` lives until the fetch completes (its callback deletes it).
  raw->Receive(buffers_[buffer]->data(),
               [this, raw, buffer, header = std::move(header), length](absl::Status status) {
                 delete raw;
                 Fetched(buffer, header, length, std::move(status));
               });
}

void RendezvousReceiver::Fetched(int buffer, const std::string& header, size_t length,
                                 absl::Status status) {
  if (!status.ok()) dropped_(status);
  if (status.ok() && threads_.empty()) {
    consume_(header, absl::string_view(buffers_[buffer]->data(), length));
  }
  absl::MutexLock lock(&mu_);
  --fetching_;
  if (status.ok() && !threads_.empty()) {
    ready_.push_back({buffer, header, length});
  } else {
    free_.push_back(buffer);
  }
  Pump();
}

void RendezvousReceiver::Pump() {
  while (!stopping_ && !waiting_.empty() && !free_.empty() && fetching_ < options_.max_fetches) {
    Waiting next = std::move(waiting_.front());
    waiting_.pop_front();
    const int buffer = free_.back();
    free_.pop_back();
    Fetch(buffer, std::move(next.header), std::move(next.message));
  }
}

void RendezvousReceiver::Run() {
  while (true) {
    Ready item;
    {
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !ready_.empty();
      };
      absl::MutexLock lock(&mu_, absl::Condition(&has_work));
      if (ready_.empty()) return;  // Stopping.
      item = std::move(ready_.front());
      ready_.pop_front();
    }
    consume_(item.header, absl::string_view(buffers_[item.buffer]->data(), item.length));
    absl::MutexLock lock(&mu_);
    free_.push_back(item.buffer);
    Pump();
  }
}

}  // namespace trident::transport
