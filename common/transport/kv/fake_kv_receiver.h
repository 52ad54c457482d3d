#ifndef TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_RECEIVER_H_
#define TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_RECEIVER_H_

// A KvReceiver for tests: a KV pool in host memory of its own that takes
// KV messages in process (from a FakeKvSender, or a test calling Deliver)
// the way UcxKv takes them over UCX: each message is checked against its
// reservation in the KvMessageSink, then copied into the pool.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/kv/kv_layout.h"
#include "common/transport/kv/kv_message_sink.h"
#include "common/transport/kv/kv_receiver.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport {

// Thread-safe (Deliver and Describe); the pool's bytes are the test's to
// read and write while nothing is delivered.
class FakeKvReceiver final : public KvReceiver {
 public:
  // A zeroed pool laid out by `spec`, described as owned by `owner_id` in
  // `incarnation`. Messages go to `sink` (not owned; must outlive this;
  // null: every message is dropped).
  FakeKvReceiver(std::string owner_id, uint64_t incarnation, const kv::KvCacheSpec& spec,
                 KvMessageSink* sink);

  // The endpoint (owner id, incarnation, lane "memcpy"), the pool's layout
  // and one host region over the whole pool that takes messages only
  // (kMessagesOnlyRkey). Always OK.
  absl::Status Describe(trident::v1::KvDestination* destination) const override;
  int64_t dropped_messages() const override { return dropped_.load(); }

  // Takes one KV message of reservation `reservation_id` for the pool bytes
  // at `remote_address` (an address inside the described region), as
  // UcxKv's receive path does: the write must cover whole blocks of one
  // layer, each of the reservation's (CheckKvWriteRange). Returns what
  // KvMessageSink::WriteMessage returns, or INVALID_ARGUMENT for a range
  // outside the pool; the message is then dropped (counted).
  absl::Status Deliver(uint64_t reservation_id, uint64_t remote_address, absl::string_view data);

  const std::string& owner_id() const { return owner_id_; }
  const kv::KvCacheSpec& spec() const { return spec_; }
  std::vector<uint8_t>& pool() { return pool_; }

 private:
  const std::string owner_id_;
  const uint64_t incarnation_;
  const kv::KvCacheSpec spec_;
  KvMessageSink* const sink_;
  std::vector<uint8_t> pool_;
  std::atomic<int64_t> dropped_{0};
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_RECEIVER_H_
