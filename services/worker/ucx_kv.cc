#include "services/worker/ucx_kv.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_layout.h"
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
  return std::unique_ptr<UcxKv>(
      new UcxKv(ucx, memory, std::move(owner_id), incarnation, std::move(*region)));
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
  auto writer = transport::KvWriter::Create(memory_.spec, memory_.base, endpoint, destination);
  if (!writer.ok()) return writer.status();
  return std::unique_ptr<KvTransfer>(new UcxTransfer(std::move(*writer)));
}

}  // namespace trident::worker
