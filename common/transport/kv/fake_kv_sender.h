#ifndef TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_SENDER_H_
#define TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_SENDER_H_

// A KvSender for tests: sends from a host KV pool to FakeKvReceivers in this
// process, found by the destination's owner id, as the KV messages UcxKv
// sends (each layer's collated runs, split into messages of at most
// `max_message_bytes`), delivered at once on the caller's thread. As over
// UCX, a message the receiver drops does not fail its send: the receiver's
// byte count (CommitKvRequest.message_bytes) is what confirms delivery.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/kv_layout.h"
#include "common/transport/kv/fake_kv_receiver.h"
#include "common/transport/kv/kv_sender.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport {

// Thread-safe.
class FakeKvSender final : public KvSender {
 public:
  // Sends from `pool` (spec.TotalBytes() bytes laid out by `spec`; not
  // owned, must outlive this and its transfers).
  FakeKvSender(const kv::KvCacheSpec& spec, const uint8_t* pool,
               uint64_t max_message_bytes = uint64_t{4} << 20);

  // Makes `peer` (not owned) reachable under its owner id until RemovePeer.
  void AddPeer(FakeKvReceiver* peer) ABSL_LOCKS_EXCLUDED(mu_);
  // The peer dies: Open and Connect to it, and layers of transfers to it
  // sent from now on, fail with UNAVAILABLE.
  void RemovePeer(const std::string& owner_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The next Open or Connect returns `error`.
  void FailNext(absl::Status error) ABSL_LOCKS_EXCLUDED(mu_);

  int32_t num_layers() const override { return spec_.num_layers; }
  // UNAVAILABLE for an owner id with no peer; ValidateKvDestination's
  // errors for a destination this pool cannot write.
  absl::StatusOr<std::unique_ptr<KvTransfer>> Open(
      const trident::v1::KvDestination& destination) override ABSL_LOCKS_EXCLUDED(mu_);
  // UNAVAILABLE for an owner id with no peer.
  absl::Status Connect(const trident::v1::KvDestination& destination) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // Calls of Open and Connect so far.
  int opens() const ABSL_LOCKS_EXCLUDED(mu_);
  int connects() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Transfer;
  // The peer `owner_id`, or UNAVAILABLE; first the injected error, if any.
  absl::StatusOr<FakeKvReceiver*> Peer(const std::string& owner_id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<FakeKvReceiver*> PeerLocked(const std::string& owner_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const kv::KvCacheSpec spec_;
  const uint8_t* const pool_;
  const uint64_t message_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, FakeKvReceiver*> peers_ ABSL_GUARDED_BY(mu_);
  absl::Status next_error_ ABSL_GUARDED_BY(mu_);
  int opens_ ABSL_GUARDED_BY(mu_) = 0;
  int connects_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_SENDER_H_
