#include "common/transport/kv/ucx_kv.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_layout.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "common/transport/kv/kv_staging.h"
#include "common/transport/kv/kv_writer.h"
#include "common/transport/kv/rendezvous_receiver.h"

namespace trident::transport {
namespace {

namespace v1 = ::trident::v1;

constexpr char kNeedsCopier[] =
    "KV messages into device memory need a KV copier (UcxKvOptions.copier)";

// A transfer from a registered pool: KvWriter's puts or messages.
class UcxTransfer final : public KvTransfer {
 public:
  explicit UcxTransfer(std::unique_ptr<KvWriter> writer) : writer_(std::move(writer)) {}
  void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                 std::function<void(absl::Status)> done) override {
    writer_->WriteLayer(layer, local_blocks, std::move(done));
  }
  int64_t bytes_sent() const override { return writer_->bytes_completed(); }
  int64_t message_bytes() const override {
    return writer_->mode() == KvWriteMode::kMessage ? writer_->bytes_posted() : 0;
  }
  int32_t messages() const override { return static_cast<int32_t>(writer_->messages_posted()); }
  std::string lane() const override { return writer_->lane(); }

 private:
  std::unique_ptr<KvWriter> writer_;
};

absl::Status ValidateReceiveOptions(const UcxKvOptions& options) {
  if (options.receive_threads < 0 || options.receive_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive_threads is ", options.receive_threads, "; must be 0 to 64"));
  }
  if (options.receive_buffers < 1 || options.receive_buffers > 1024 ||
      options.receive_buffer_bytes < 1 || options.receive_fetches < 1 ||
      options.direct_fetches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive_buffers is ", options.receive_buffers, ", receive_buffer_bytes ",
                     options.receive_buffer_bytes, ", receive_fetches ", options.receive_fetches,
                     " and direct_fetches ", options.direct_fetches,
                     "; need 1 to 1024 buffers of at least one byte and at least one fetch"));
  }
  return absl::OkStatus();
}

}  // namespace

UcxKv::UcxKv(const backend::KvMemory& memory, std::string owner_id, uint64_t incarnation,
             KvMessageSink* sink, std::unique_ptr<backend::KvCopier> copier, uint64_t message_bytes,
             uint64_t max_message_bytes, int max_direct_fetches)
    : memory_(memory),
      owner_id_(std::move(owner_id)),
      incarnation_(incarnation),
      sink_(sink),
      copier_(std::move(copier)),
      message_bytes_(message_bytes),
      max_message_bytes_(max_message_bytes),
      max_direct_fetches_(max_direct_fetches) {}

absl::StatusOr<std::unique_ptr<UcxKv>> UcxKv::Create(UcxWorker* ucx,
                                                     const backend::KvMemory& memory,
                                                     std::string owner_id, uint64_t incarnation,
                                                     UcxKvOptions options) {
  TRIDENT_RETURN_IF_ERROR(ValidateReceiveOptions(options));
  const bool staged = options.force_staging || (memory.device && !ucx->supports_cuda_memory());
  if (staged && options.copier == nullptr) {
    return absl::FailedPreconditionError(
        "the KV cache is in CUDA device memory and this UCX build has no CUDA support "
        "(ucx_info -d lists no cuda transport), and no KV copier was given to stage it "
        "through host memory");
  }
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<UcxLanes> lanes,
                           UcxLanes::Create(ucx, {.lanes = options.lanes}));
  const uint64_t message_bytes =
      staged ? KvMessageBytes(memory.spec.block_stride_bytes(), options.max_message_bytes) : 0;
  std::unique_ptr<UcxKv> kv(
      new UcxKv(memory, std::move(owner_id), incarnation, options.sink, std::move(options.copier),
                message_bytes, options.max_message_bytes, options.direct_fetches * options.lanes));
  kv->lanes_ = std::move(lanes);
  TRIDENT_RETURN_IF_ERROR(kv->SetUpPool(ucx, options, staged));
  TRIDENT_RETURN_IF_ERROR(kv->StartReceiving(options));
  return kv;
}

absl::Status UcxKv::SetUpPool(UcxWorker* ucx, const UcxKvOptions& options, bool staged) {
  if (staged) {
    TRIDENT_ASSIGN_OR_RETURN(
        staging_, StagingSlots::Create(*copier_, options.staging_bytes, options.staging_slot_bytes,
                                       message_bytes_));
    return absl::OkStatus();
  }
  TRIDENT_ASSIGN_OR_RETURN(region_,
                           ucx->Register(memory_.base, memory_.bytes,
                                         memory_.device ? MemoryKind::kCuda : MemoryKind::kHost));
  return absl::OkStatus();
}

absl::Status UcxKv::StartReceiving(const UcxKvOptions& options) {
  // Rendezvous receive buffers (pinned for a pool on a GPU) for pools that
  // copy messages in; a host pool fetches straight into its blocks. Buffers
  // and fetches are per lane: each lane's worker fetches its own.
  if (backend::KvCopier* copier = copier_.get(); copier != nullptr) {
    const uint64_t buffer_bytes = options.receive_buffer_bytes;
    receiver_ = std::make_unique<RendezvousReceiver>(
        RendezvousReceiverOptions{.num_buffers = options.receive_buffers * options.lanes,
                                  .buffer_bytes = buffer_bytes,
                                  .num_threads = options.receive_threads,
                                  .max_fetches = options.receive_fetches * options.lanes},
        [copier, buffer_bytes] { return copier->AllocateHost(buffer_bytes); },
        [this](absl::string_view header, absl::string_view data) { CopyIn(header, data); },
        [this](const absl::Status& why) { Dropped(why); });
  }
  // Messages arrive on every lane; the handlers are thread-safe.
  const std::vector<UcxWorker*> workers = lanes_->workers();
  lane_messages_ = std::make_unique<std::atomic<int64_t>[]>(workers.size());
  for (size_t lane = 0; lane < workers.size(); ++lane) {
    std::atomic<int64_t>* count = &lane_messages_[lane];
    TRIDENT_RETURN_IF_ERROR(workers[lane]->SetMessageHandler(
        kKvMessageId,
        [this, count](absl::string_view header, absl::string_view data) {
          count->fetch_add(1, std::memory_order_relaxed);
          CopyIn(header, data);
        },
        [this, count](absl::string_view header, std::unique_ptr<IncomingMessage> message) {
          count->fetch_add(1, std::memory_order_relaxed);
          OnRendezvous(header, std::move(message));
        }));
  }
  return absl::OkStatus();
}

std::vector<int64_t> UcxKv::messages_by_lane() const {
  std::vector<int64_t> counts;
  for (int lane = 0; lane < lanes_->size(); ++lane) {
    counts.push_back(lane_messages_[lane].load(std::memory_order_relaxed));
  }
  return counts;
}

UcxKv::~UcxKv() {
  // Later messages are dropped (an empty handler) once this returns.
  if (lanes_ != nullptr && lane_messages_ != nullptr) {
    for (UcxWorker* worker : lanes_->workers()) {
      worker->SetMessageHandler(kKvMessageId, [](absl::string_view, absl::string_view) {})
          .IgnoreError();
    }
  }
  receiver_.reset();
  {
    absl::MutexLock lock(&direct_mu_);
    direct_waiting_.clear();  // Releases their senders.
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(direct_mu_) { return direct_fetches_ == 0; };
    direct_mu_.Await(absl::Condition(&idle));
  }
  region_.reset();
  lanes_.reset();  // Nothing of the lanes' own workers runs any more.
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> UcxKv::Locate(absl::string_view header_bytes,
                                                            uint64_t length) const {
  TRIDENT_ASSIGN_OR_RETURN(const KvMessageHeader header, KvMessageHeader::Decode(header_bytes));
  const uint64_t base = reinterpret_cast<uint64_t>(memory_.base);
  const uint64_t offset = header.remote_address - base;
  if (header.remote_address < base || offset > memory_.bytes || length > memory_.bytes - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV message of ", length, " bytes outside the registered KV pool"));
  }
  return std::make_pair(header.reservation_id, offset);
}

void UcxKv::OnRendezvous(absl::string_view header, std::unique_ptr<IncomingMessage> message) {
  if (memory_.device || staged()) {
    if (receiver_ == nullptr) {
      Dropped(absl::FailedPreconditionError(kNeedsCopier));
      return;
    }
    receiver_->OnMessage(header, std::move(message));
    return;
  }
  absl::MutexLock lock(&direct_mu_);
  if (direct_fetches_ >= max_direct_fetches_) {
    direct_waiting_.emplace_back(std::string(header), std::move(message));
    return;
  }
  StartDirectFetch(header, std::move(message));
}

void UcxKv::StartDirectFetch(absl::string_view header, std::unique_ptr<IncomingMessage> message) {
  // A host pool: fetch straight into the reserved blocks, the reservation
  // pinned until the fetch ends. Dropping `message` releases its sender.
  const uint64_t length = message->length();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> where = Locate(header, length);
  if (!where.ok()) {
    Dropped(where.status());
    return;
  }
  const auto [reservation, offset] = *where;
  if (sink_ == nullptr) {
    Dropped(absl::FailedPreconditionError("no reservations accept KV messages"));
    return;
  }
  if (absl::Status pinned = sink_->BeginMessage(reservation,
                                                [&](absl::Span<const int32_t> blocks) {
                                                  return CheckKvWriteRange(memory_.spec, offset,
                                                                           length, blocks);
                                                });
      !pinned.ok()) {
    Dropped(pinned);
    return;
  }
  ++direct_fetches_;
  message->Receive(static_cast<char*>(memory_.base) + offset,
                   [this, reservation = reservation, length](absl::Status status) {
                     if (!status.ok()) Dropped(status);
                     EndDirectFetch(reservation, status.ok() ? absl::StatusOr<int64_t>(length)
                                                             : absl::StatusOr<int64_t>(status));
                   });
}

void UcxKv::EndDirectFetch(uint64_t reservation, const absl::StatusOr<int64_t>& wrote) {
  sink_->EndMessage(reservation, wrote);
  absl::MutexLock lock(&direct_mu_);
  --direct_fetches_;
  while (!direct_waiting_.empty() && direct_fetches_ < max_direct_fetches_) {
    auto next = std::move(direct_waiting_.front());
    direct_waiting_.pop_front();
    StartDirectFetch(next.first, std::move(next.second));
  }
}

void UcxKv::CopyIn(absl::string_view header_bytes, absl::string_view data) {
  // Device memory (or a staged pool) goes through the copier; a host pool
  // takes a plain memcpy.
  const bool copy_in = memory_.device || staged();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> where = Locate(header_bytes, data.size());
  absl::Status status = where.status();
  if (status.ok() && copy_in && copier_ == nullptr) {
    status = absl::FailedPreconditionError(kNeedsCopier);
  }
  if (status.ok() && sink_ == nullptr) {
    status = absl::FailedPreconditionError("no reservations accept KV messages");
  }
  if (status.ok()) {
    const auto [reservation, offset] = *where;
    status = sink_->WriteMessage(
        reservation, [&](absl::Span<const int32_t> blocks) -> absl::StatusOr<int64_t> {
          TRIDENT_RETURN_IF_ERROR(CheckKvWriteRange(memory_.spec, offset, data.size(), blocks));
          if (copy_in) {
            // Returns once the bytes are on the device, so that the count
            // (and the commit waiting for it) follows them.
            const backend::KvRange range{.offset_bytes = offset, .length_bytes = data.size()};
            TRIDENT_RETURN_IF_ERROR(copier_->CopyFromHost(data.data(), {&range, 1}));
          } else {
            std::memcpy(static_cast<char*>(memory_.base) + offset, data.data(), data.size());
          }
          return static_cast<int64_t>(data.size());
        });
  }
  if (!status.ok()) Dropped(status);
}

void UcxKv::Dropped(const absl::Status& why) {
  const int64_t dropped = ++dropped_messages_;
  // Late messages of a dead or aborted transfer are expected; say so once in
  // a while, not per message.
  if (dropped == 1 || dropped % 1000 == 0) {
    TRIDENT_LOG(WARNING) << "dropped KV message (" << dropped << " so far): " << why;
  }
}

absl::Status UcxKv::Describe(v1::KvDestination* d) const {
  v1::TransportEndpoint* e = d->mutable_endpoint();
  e->set_owner_id(owner_id_);
  e->set_incarnation(incarnation_);
  lanes_->DescribeAddresses(e);
  // Peers reach staged device memory through host buffers.
  e->set_memory_type(memory_.device && !staged() ? v1::MEMORY_TYPE_CUDA : v1::MEMORY_TYPE_HOST);
  *d->mutable_layout() = kv::ToProto(memory_.spec);
  v1::KvRegion* r = d->add_regions();
  r->set_base_address(reinterpret_cast<uint64_t>(memory_.base));
  r->set_length_bytes(memory_.bytes);
  r->set_rkey(staged() ? std::string(kMessagesOnlyRkey) : region_->packed_rkey());
  r->set_memory_type(memory_.device ? v1::MEMORY_TYPE_CUDA : v1::MEMORY_TYPE_HOST);
  r->set_first_layer(0);
  r->set_num_layers(memory_.spec.num_layers);
  return absl::OkStatus();
}

absl::Status UcxKv::Connect(const v1::KvDestination& destination) {
  return lanes_->EndpointsTo(destination.endpoint()).status();
}

absl::StatusOr<std::unique_ptr<KvTransfer>> UcxKv::Open(const v1::KvDestination& destination) {
  TRIDENT_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Endpoint>> endpoints,
                           lanes_->EndpointsTo(destination.endpoint()));
  if (staged()) {
    TRIDENT_RETURN_IF_ERROR(ValidateKvDestination(memory_.spec, destination));
    return std::unique_ptr<KvTransfer>(new StagedKvTransfer(
        memory_.spec, copier_.get(), staging_, std::move(endpoints), destination, message_bytes_));
  }
  std::shared_ptr<Endpoint> main = endpoints.front();
  endpoints.erase(endpoints.begin());
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<KvWriter> writer,
                           KvWriter::Create(memory_.spec, memory_.base, main, destination,
                                            WriteModeFor(destination, main->lane()),
                                            max_message_bytes_, std::move(endpoints)));
  return std::unique_ptr<KvTransfer>(new UcxTransfer(std::move(writer)));
}

}  // namespace trident::transport
