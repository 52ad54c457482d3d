#include "common/transport/kv/fake_kv_sender.h"

#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status/status_macros.h"
#include "common/transport/kv/kv_writer.h"

namespace trident::transport {

namespace v1 = ::trident::v1;

// Thread-compatible, as KvTransfer is.
class FakeKvSender::Transfer final : public KvTransfer {
 public:
  Transfer(FakeKvSender* sender, v1::KvDestination destination)
      : sender_(sender), destination_(std::move(destination)) {}

  void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                 std::function<void(absl::Status)> done) override {
    if (absl::Status invalid = CheckLayerBlocks(sender_->spec_, destination_, layer, local_blocks);
        !invalid.ok()) {
      done(std::move(invalid));
      return;
    }
    absl::StatusOr<FakeKvReceiver*> peer;
    {
      absl::MutexLock lock(&sender_->mu_);
      peer = sender_->PeerLocked(destination_.endpoint().owner_id());
    }
    if (!peer.ok()) {
      done(peer.status());
      return;
    }
    const std::vector<KvPut> messages = SplitKvPuts(
        PlanLayerPuts(sender_->spec_, destination_, layer, local_blocks), sender_->message_bytes_);
    for (const KvPut& m : messages) {
      const absl::string_view data(
          reinterpret_cast<const char*>(sender_->pool_) + m.local_offset_bytes, m.length_bytes);
      // A dropped message is the receiver's to count, as over UCX.
      (*peer)->Deliver(destination_.reservation_id(), m.remote_address, data).IgnoreError();
      bytes_ += static_cast<int64_t>(m.length_bytes);
      ++messages_;
    }
    done(absl::OkStatus());
  }
  int64_t bytes_sent() const override { return bytes_; }
  int32_t messages() const override { return messages_; }
  std::string lane() const override { return "memcpy"; }
  int64_t message_bytes() const override { return bytes_; }

 private:
  FakeKvSender* const sender_;
  const v1::KvDestination destination_;
  int64_t bytes_ = 0;
  int32_t messages_ = 0;
};

FakeKvSender::FakeKvSender(const kv::KvCacheSpec& spec, const uint8_t* pool,
                           uint64_t max_message_bytes)
    : spec_(spec),
      pool_(pool),
      message_bytes_(KvMessageBytes(spec.block_stride_bytes(), max_message_bytes)) {}

void FakeKvSender::AddPeer(FakeKvReceiver* peer) {
  absl::MutexLock lock(&mu_);
  peers_[peer->owner_id()] = peer;
}

void FakeKvSender::RemovePeer(const std::string& owner_id) {
  absl::MutexLock lock(&mu_);
  peers_.erase(owner_id);
}

void FakeKvSender::FailNext(absl::Status error) {
  absl::MutexLock lock(&mu_);
  next_error_ = std::move(error);
}

absl::StatusOr<FakeKvReceiver*> FakeKvSender::PeerLocked(const std::string& owner_id) const {
  auto it = peers_.find(owner_id);
  if (it == peers_.end()) {
    return absl::UnavailableError(absl::StrCat("no KV peer '", owner_id, "' is reachable"));
  }
  return it->second;
}

absl::StatusOr<FakeKvReceiver*> FakeKvSender::Peer(const std::string& owner_id) {
  absl::MutexLock lock(&mu_);
  if (!next_error_.ok()) return std::exchange(next_error_, absl::OkStatus());
  return PeerLocked(owner_id);
}

absl::StatusOr<std::unique_ptr<KvTransfer>> FakeKvSender::Open(
    const v1::KvDestination& destination) {
  {
    absl::MutexLock lock(&mu_);
    ++opens_;
  }
  TRIDENT_RETURN_IF_ERROR(Peer(destination.endpoint().owner_id()).status());
  TRIDENT_RETURN_IF_ERROR(ValidateKvDestination(spec_, destination));
  return std::unique_ptr<KvTransfer>(new Transfer(this, destination));
}

absl::Status FakeKvSender::Connect(const v1::KvDestination& destination) {
  {
    absl::MutexLock lock(&mu_);
    ++connects_;
  }
  return Peer(destination.endpoint().owner_id()).status();
}

int FakeKvSender::opens() const {
  absl::MutexLock lock(&mu_);
  return opens_;
}

int FakeKvSender::connects() const {
  absl::MutexLock lock(&mu_);
  return connects_;
}

}  // namespace trident::transport
