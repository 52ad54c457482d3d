// The receiving side of the KV data plane, as the decode worker's control
// plane sees it: ReserveKv describes this worker's KV pool to a prefill
// worker through it (endpoint, layout, regions), and the worker's metrics
// read what it dropped. What it receives goes into a KvMessageSink given
// at its creation (kv_message_sink.h). UcxKv (ucx_kv.h) is the
// implementation over UCX; FakeKvReceiver (fake_kv_receiver.h) receives in
// process from a FakeKvSender, for tests.

#ifndef TRIDENT_COMMON_TRANSPORT_KV_KV_RECEIVER_H_
#define TRIDENT_COMMON_TRANSPORT_KV_KV_RECEIVER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport {

// Thread-safe.
class KvReceiver {
 public:
  virtual ~KvReceiver() = default;

  // Fills `destination`'s endpoint, layout and regions: how a peer's
  // KvSender reaches this pool. The caller fills in the reservation (id,
  // blocks, lease, decode worker). Errors are the implementation's (UcxKv
  // has none).
  virtual absl::Status Describe(trident::v1::KvDestination* destination) const = 0;

  // KV messages received and dropped so far: late ones of transfers whose
  // reservation ended, ones that failed to arrive, invalid ones.
  virtual int64_t dropped_messages() const = 0;
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_KV_RECEIVER_H_
