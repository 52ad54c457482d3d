#include "common/transport/kv/fake_kv_receiver.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/transport/kv/kv_writer.h"

namespace trident::transport {

namespace v1 = ::trident::v1;

FakeKvReceiver::FakeKvReceiver(std::string owner_id, uint64_t incarnation,
                               const kv::KvCacheSpec& spec, KvMessageSink* sink)
    : owner_id_(std::move(owner_id)),
      incarnation_(incarnation),
      spec_(spec),
      sink_(sink),
      pool_(spec.TotalBytes()) {}

absl::Status FakeKvReceiver::Describe(v1::KvDestination* d) const {
  v1::TransportEndpoint* e = d->mutable_endpoint();
  e->set_owner_id(owner_id_);
  e->set_incarnation(incarnation_);
  e->set_lane("memcpy");
  e->set_memory_type(v1::MEMORY_TYPE_HOST);
  *d->mutable_layout() = kv::ToProto(spec_);
  v1::KvRegion* r = d->add_regions();
  r->set_base_address(reinterpret_cast<uint64_t>(pool_.data()));
  r->set_length_bytes(pool_.size());
  r->set_rkey(std::string(kMessagesOnlyRkey));
  r->set_memory_type(v1::MEMORY_TYPE_HOST);
  r->set_first_layer(0);
  r->set_num_layers(spec_.num_layers);
  return absl::OkStatus();
}

absl::Status FakeKvReceiver::Deliver(uint64_t reservation_id, uint64_t remote_address,
                                     absl::string_view data) {
  const uint64_t base = reinterpret_cast<uint64_t>(pool_.data());
  const uint64_t offset = remote_address - base;
  absl::Status status;
  if (remote_address < base || offset > pool_.size() || data.size() > pool_.size() - offset) {
    status = absl::InvalidArgumentError(
        absl::StrCat("a KV message of ", data.size(), " bytes outside the pool"));
  } else if (sink_ == nullptr) {
    status = absl::FailedPreconditionError("no reservations accept KV messages");
  } else {
    status = sink_->WriteMessage(
        reservation_id, [&](absl::Span<const int32_t> blocks) -> absl::StatusOr<int64_t> {
          TRIDENT_RETURN_IF_ERROR(CheckKvWriteRange(spec_, offset, data.size(), blocks));
          std::memcpy(pool_.data() + offset, data.data(), data.size());
          return static_cast<int64_t>(data.size());
        });
  }
  if (!status.ok()) ++dropped_;
  return status;
}

}  // namespace trident::transport
