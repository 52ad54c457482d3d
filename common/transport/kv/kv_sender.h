// The sending side of the KV data plane: how a prefill worker writes a
// sequence's KV, layer by layer, into blocks a decode worker reserved for it
// (a trident.v1.KvDestination from Decode.ReserveKv). UcxKv (ucx_kv.h) is
// the implementation over UCX; MeteredKvSender (transfer_metrics.h) wraps
// any KvSender with metrics; FakeKvSender (fake_kv_sender.h) copies in
// process into a FakeKvReceiver, for tests.
//
//   KvSender::Connect(destination)   optional, ahead of the prompt's compute
//   KvSender::Open(destination)  ->  KvTransfer
//   KvTransfer::SendLayer(l, ...)    for each layer, as it is computed
//   (every `done` ran)           ->  CommitKv over the control plane, which
//                                    carries KvTransfer::message_bytes()
//
// Implementations are thread-safe; a KvTransfer is thread-compatible.

#ifndef TRIDENT_COMMON_TRANSPORT_KV_KV_SENDER_H_
#define TRIDENT_COMMON_TRANSPORT_KV_KV_SENDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport {

// One sequence's transfer. Thread-compatible: one caller posts layers.
class KvTransfer {
 public:
  virtual ~KvTransfer() = default;
  // Posts layer `layer`'s K and V of local blocks `local_blocks` (token
  // order) into the destination's blocks; `done` runs once, on any thread,
  // when the writes completed or failed (UNAVAILABLE for a dead peer).
  virtual void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                         std::function<void(absl::Status)> done) = 0;
  // Bytes whose writes completed, and writes (puts or messages) posted.
  virtual int64_t bytes_sent() const = 0;
  virtual int32_t messages() const = 0;
  // The transport lane, as the transport names it ("tcp", "posix", ...).
  virtual std::string lane() const = 0;
  // Bytes sent as messages, which the receiver counts before accepting the
  // commit (CommitKvRequest.message_bytes); 0 for one-sided writes.
  virtual int64_t message_bytes() const = 0;
};

// Thread-safe: several transfers may be opened and run at once.
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

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_KV_SENDER_H_
