// How a prefill worker writes a sequence's KV into blocks a decode worker
// reserved (trident.v1.KvDestination). The UCX implementation posts
// one-sided puts (common/transport); tests use an in-process one.

#ifndef TRIDENT_SERVICES_WORKER_KV_SENDER_H_
#define TRIDENT_SERVICES_WORKER_KV_SENDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trident/v1/worker.pb.h"

namespace trident::worker {

// One sequence's transfer. Thread-compatible: one caller posts layers.
class KvTransfer {
 public:
  virtual ~KvTransfer() = default;
  // Posts layer `layer`'s K and V of local blocks `local_blocks` (token
  // order) into the destination's blocks; `done` runs once, on any thread,
  // when the writes completed or failed (UNAVAILABLE for a dead peer).
  virtual void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                         std::function<void(absl::Status)> done) = 0;
  virtual int64_t bytes_sent() const = 0;
  virtual int32_t messages() const = 0;
  // The transport lane, as the transport names it ("tcp", "posix", ...).
  virtual std::string lane() const = 0;
  // Bytes sent as messages, which the receiver counts before accepting the
  // commit (CommitKvRequest.message_bytes); 0 for one-sided writes.
  virtual int64_t message_bytes() const = 0;
};

class KvSender {
 public:
  virtual ~KvSender() = default;
  // Layers of this worker's model.
  virtual int32_t num_layers() const = 0;
  // Checks `destination` against this worker's KV layout and connects to its
  // endpoint. FAILED_PRECONDITION for a layout that does not match;
  // UNAVAILABLE when the endpoint cannot be reached.
  virtual absl::StatusOr<std::unique_ptr<KvTransfer>> Open(
      const trident::v1::KvDestination& destination) = 0;
  // Connects to `destination`'s endpoint ahead of Open (which connects if
  // this was not called), so that connection setup overlaps the prompt's
  // compute and has finished on both sides before any KV goes. Errors are
  // Open's. By default nothing: the transport has no connections.
  virtual absl::Status Connect(const trident::v1::KvDestination& destination) {
    return absl::OkStatus();
  }
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_KV_SENDER_H_
