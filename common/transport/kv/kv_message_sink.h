// Where the receiving side of the KV data plane puts the KV messages it
// takes (KvWriteMode::kMessage, kv_writer.h), as the transport sees the
// decode side's reservations: a message names a reservation id and a byte
// range of the pool; the sink says whether that reservation still takes
// writes and which blocks are its, and counts the bytes for the commit that
// follows (CommitKvRequest.message_bytes). The decode worker's reservation
// store implements it (services/worker/kv_handoff/kv_reservations.h);
// tests use FakeKvMessageSink (fake_kv_message_sink.h).
//
// A receiver calls either WriteMessage (the bytes are at hand: copy them in
// inside `write`) or BeginMessage ... EndMessage (the bytes arrive later,
// e.g. a UCX fetch straight into the blocks), for each message:
//
//   WriteMessage(id, write)          write(blocks) runs once if `id` takes
//                                    writes; returns the bytes it wrote
//   BeginMessage(id, check) ... EndMessage(id, wrote)
//                                    check(blocks) under the sink's lock;
//                                    the reservation stays pinned (its
//                                    blocks are not reused) until EndMessage
//
// Implementations are thread-safe: messages of several lanes and receive
// threads arrive at once.

#ifndef TRIDENT_COMMON_TRANSPORT_KV_KV_MESSAGE_SINK_H_
#define TRIDENT_COMMON_TRANSPORT_KV_KV_MESSAGE_SINK_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace trident::transport {

class KvMessageSink {
 public:
  virtual ~KvMessageSink() = default;

  // Runs `write` with reservation `id`'s blocks (token order) if it still
  // accepts writes, with the reservation pinned: if it ends meanwhile, its
  // blocks go back to the pool only once `write` returns, so a late copy
  // never lands in blocks given to another sequence. `write` may run
  // without the sink's lock (several messages copy in at once) and returns
  // the bytes it wrote, counted towards the reservation, or an error if the
  // write does not belong to those blocks (then returned). NOT_FOUND when
  // the reservation accepts no writes (unknown, ended, committed): the
  // receiver drops the message.
  virtual absl::Status WriteMessage(
      uint64_t id, absl::FunctionRef<absl::StatusOr<int64_t>(absl::Span<const int32_t>)> write) = 0;

  // WriteMessage in two halves, for a write that completes later: checks the
  // reservation as WriteMessage does, runs `check` with its blocks (an error
  // from it is returned and nothing is pinned) and pins the reservation.
  // Every OK BeginMessage needs exactly one EndMessage.
  virtual absl::Status BeginMessage(
      uint64_t id, absl::FunctionRef<absl::Status(absl::Span<const int32_t>)> check) = 0;

  // Unpins reservation `id` and counts `wrote` bytes (an error: none).
  // REQUIRES: an OK BeginMessage(id) not yet ended.
  virtual void EndMessage(uint64_t id, const absl::StatusOr<int64_t>& wrote) = 0;
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_KV_MESSAGE_SINK_H_
