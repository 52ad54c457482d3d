#include "services/worker/ucx_kv.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_layout.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "common/transport/kv_writer.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

class UcxTransfer final : public KvTransfer {
 public:
  explicit UcxTransfer(std::unique_ptr<transport::KvWriter> writer) : writer_(std::move(writer)) {}
  void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                 std::function<void(absl::Status)> done) override {
    writer_->WriteLayer(layer, local_blocks, std::move(done));
  }
  int64_t bytes_sent() const override { return writer_->bytes_completed(); }
  int64_t message_bytes() const override {
    return writer_->mode() == transport::KvWriteMode::kMessage ? writer_->bytes_posted() : 0;
  }
  int32_t messages() const override { return static_cast<int32_t>(writer_->messages_posted()); }
  std::string lane() const override { return writer_->lane(); }

 private:
  std::unique_ptr<transport::KvWriter> writer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<UcxKv>> UcxKv::Create(transport::UcxWorker* ucx,
                                                     const backend::KvMemory& memory,
                                                     std::string owner_id, uint64_t incarnation) {
  if (memory.device && !ucx->supports_cuda_memory()) {
    return absl::FailedPreconditionError(
        "the KV cache is in CUDA device memory and this UCX build has no CUDA support "
        "(ucx_info -d lists no cuda transport); pinned-host staging is not built yet");
  }
  auto region =
      ucx->Register(memory.base, memory.bytes,
                    memory.device ? transport::MemoryKind::kCuda : transport::MemoryKind::kHost);
  if (!region.ok()) return region.status();
  std::unique_ptr<UcxKv> kv(
      new UcxKv(ucx, memory, std::move(owner_id), incarnation, std::move(*region)));
  UcxKv* raw = kv.get();
  TRIDENT_RETURN_IF_ERROR(ucx->SetMessageHandler(
      transport::kKvMessageId,
      [raw](absl::string_view header, absl::string_view data) { raw->OnMessage(header, data); }));
  return kv;
}

UcxKv::~UcxKv() {
  // Later messages are dropped by UCX (no handler) once this returns.
  ucx_->SetMessageHandler(transport::kKvMessageId, [](absl::string_view, absl::string_view) {})
      .IgnoreError();
}

void UcxKv::AcceptMessagesFor(KvReservations* reservations) {
  absl::MutexLock lock(&sink_mu_);
  sink_ = reservations;
}

void UcxKv::OnMessage(absl::string_view header_bytes, absl::string_view data) {
  absl::StatusOr<transport::KvMessageHeader> header =
      transport::KvMessageHeader::Decode(header_bytes);
  absl::Status status = header.status();
  if (status.ok()) {
    const uint64_t base = reinterpret_cast<uint64_t>(memory_.base);
    const uint64_t offset = header->remote_address - base;
    if (memory_.device) {
      status = absl::FailedPreconditionError("KV messages into device memory are not supported");
    } else if (header->remote_address < base || offset > memory_.bytes ||
               data.size() > memory_.bytes - offset) {
      status = absl::InvalidArgumentError(
          absl::StrCat("a KV message of ", data.size(), " bytes outside the registered KV pool"));
    } else {
      absl::ReaderMutexLock lock(&sink_mu_);
      if (sink_ == nullptr) {
        status = absl::FailedPreconditionError("no reservations accept KV messages");
      } else {
        status = sink_->WriteMessage(
            header->reservation_id,
            [&](absl::Span<const int32_t> blocks) -> absl::StatusOr<int64_t> {
              TRIDENT_RETURN_IF_ERROR(
                  transport::CheckKvWriteRange(memory_.spec, offset, data.size(), blocks));
              std::memcpy(static_cast<char*>(memory_.base) + offset, data.data(), data.size());
              return static_cast<int64_t>(data.size());
            });
      }
    }
  }
  if (!status.ok()) {
    const int64_t dropped = ++dropped_messages_;
    // Late messages of a dead or aborted transfer are expected; say so once
    // in a while, not per message.
    if (dropped == 1 || dropped % 1000 == 0) {
      TRIDENT_LOG(WARNING) << "dropped KV message (" << dropped << " so far): " << status;
    }
  }
}

absl::Status UcxKv::Describe(v1::KvDestination* d) const {
  v1::TransportEndpoint* e = d->mutable_endpoint();
  e->set_owner_id(owner_id_);
  e->set_incarnation(incarnation_);
  e->set_ucx_worker_address(ucx_->address());
  e->set_memory_type(memory_.device ? v1::MEMORY_TYPE_CUDA : v1::MEMORY_TYPE_HOST);
  *d->mutable_layout() = kv::ToProto(memory_.spec);
  v1::KvRegion* r = d->add_regions();
  r->set_base_address(reinterpret_cast<uint64_t>(memory_.base));
  r->set_length_bytes(memory_.bytes);
  r->set_rkey(region_->packed_rkey());
  r->set_memory_type(e->memory_type());
  r->set_first_layer(0);
  r->set_num_layers(memory_.spec.num_layers);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvTransfer>> UcxKv::Open(const v1::KvDestination& destination) {
  const auto key =
      std::make_pair(destination.endpoint().owner_id(), destination.endpoint().incarnation());
  std::shared_ptr<transport::Endpoint> endpoint;
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(key);
    if (it != endpoints_.end() && !it->second->failed()) endpoint = it->second;
  }
  if (endpoint == nullptr) {
    auto connected = ucx_->Connect(destination.endpoint().ucx_worker_address(),
                                   destination.endpoint().owner_id());
    if (!connected.ok()) return connected.status();
    endpoint = std::move(*connected);
    absl::MutexLock lock(&mu_);
    endpoints_[key] = endpoint;
  }
  auto writer = transport::KvWriter::Create(memory_.spec, memory_.base, endpoint, destination,
                                            transport::WriteModeForLane(endpoint->lane()));
  if (!writer.ok()) return writer.status();
  return std::unique_ptr<KvTransfer>(new UcxTransfer(std::move(*writer)));
}

}  // namespace trident::worker
