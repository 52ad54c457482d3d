#include "services/worker/offload/prompt_kv_sender.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc/tls.h"
#include "common/kv/kv_layout.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace trident::worker {

namespace v1 = ::trident::v1;
namespace attention = transport::attention;

// One prompt's writes into one service sequence, a layer at a time.
class PromptKvSender::Transfer final : public transport::KvTransfer {
 public:
  Transfer(PromptKvSender* sender, attention::RemoteAttention* channel,
           const v1::KvDestination& destination)
      : sender_(sender),
        channel_(channel),
        address_(destination.attention_address()),
        handle_(destination.attention_handle()),
        write_key_(destination.attention_write_key()),
        num_tokens_(destination.num_tokens()),
        first_token_(std::min(num_tokens_, destination.num_cached_blocks() *
                                               std::max(1, destination.layout().block_size_tokens()))),
        scratch_(sender->TakeScratch()) {}
  ~Transfer() override { sender_->ReturnScratch(std::move(scratch_)); }

  void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                 std::function<void(absl::Status)> done) override {
    const backend::KvMemory& memory = sender_->copier_->memory();
    // The service reads the tokens before first_token_ in place.
    const KvCopyRange range{.blocks = local_blocks,
                            .first = first_token_,
                            .last = num_tokens_,
                            .layer_begin = layer,
                            .layer_end = layer + 1,
                            .handle = handle_,
                            .write_key = write_key_};
    absl::Status status =
        sender_->copier_->Copy(range, *channel_, sender_->options_.write_timeout, *scratch_);
    const int32_t tokens = num_tokens_ - first_token_;
    messages_ += (tokens + ServiceKvCopier::kChunkTokens - 1) / ServiceKvCopier::kChunkTokens;
    if (status.ok()) {
      bytes_sent_ +=
          int64_t{tokens} * 2 * memory.spec.num_kv_heads * memory.spec.head_dim *
          static_cast<int64_t>(attention::WireElementSize(sender_->copier_->wire_dtype()));
    } else if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
      sender_->Disconnected(address_);
    }
    done(status);
  }
  int64_t bytes_sent() const override { return bytes_sent_; }
  int32_t messages() const override { return messages_; }
  std::string lane() const override { return "attention"; }
  int64_t message_bytes() const override { return 0; }

 private:
  PromptKvSender* const sender_;
  attention::RemoteAttention* const channel_;
  const std::string address_;
  const uint64_t handle_;
  const uint64_t write_key_;
  const int32_t num_tokens_;
  const int32_t first_token_;
  std::unique_ptr<ServiceKvCopier::Scratch> scratch_;
  int64_t bytes_sent_ = 0;
  int32_t messages_ = 0;
};

absl::StatusOr<std::unique_ptr<PromptKvSender>> PromptKvSender::Create(
    PromptKvSenderOptions options, transport::KvSender* base, transport::UcxWorker* ucx,
    const backend::ModelBackend& backend, SharedAttentionClient shared) {
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<ServiceKvCopier> copier,
                           ServiceKvCopier::Create(backend));
  auto sender = std::unique_ptr<PromptKvSender>(
      new PromptKvSender(std::move(options), base, std::move(copier)));
  if (shared.client != nullptr) {
    sender->client_ = shared.client;
    sender->endpoint_ = std::move(shared.endpoint);
    return sender;
  }
  TRIDENT_ASSIGN_OR_RETURN(sender->lanes_, transport::UcxLanes::Create(ucx, {.lanes = 1}));
  TRIDENT_ASSIGN_OR_RETURN(
      sender->own_client_,
      attention::UcxAttentionClient::Create(sender->lanes_.get(), sender->options_.incarnation));
  sender->client_ = sender->own_client_.get();
  sender->endpoint_.set_owner_id(sender->options_.worker_id);
  sender->endpoint_.set_incarnation(sender->options_.incarnation);
  sender->endpoint_.set_memory_type(v1::MEMORY_TYPE_HOST);
  sender->lanes_->DescribeAddresses(&sender->endpoint_);
  return sender;
}

PromptKvSender::PromptKvSender(PromptKvSenderOptions options, transport::KvSender* base,
                               std::unique_ptr<ServiceKvCopier> copier)
    : options_(std::move(options)), base_(base), copier_(std::move(copier)) {}

int32_t PromptKvSender::num_layers() const { return copier_->memory().spec.num_layers; }

absl::StatusOr<std::unique_ptr<transport::KvTransfer>> PromptKvSender::Open(
    const v1::KvDestination& destination) {
  if (!destination.cpu_resident()) {
    if (base_ == nullptr) {
      return absl::FailedPreconditionError("this worker has no KV transport to a decode worker");
    }
    return base_->Open(destination);
  }
  TRIDENT_ASSIGN_OR_RETURN(attention::RemoteAttention * channel, ChannelFor(destination));
  return std::make_unique<Transfer>(this, channel, destination);
}

absl::Status PromptKvSender::Connect(const v1::KvDestination& destination) {
  if (!destination.cpu_resident()) {
    return base_ == nullptr ? absl::OkStatus() : base_->Connect(destination);
  }
  return ChannelFor(destination).status();
}

absl::StatusOr<attention::RemoteAttention*> PromptKvSender::ChannelFor(
    const v1::KvDestination& destination) {
  if (destination.attention_address().empty() || destination.attention_handle() == 0 ||
      destination.attention_write_key() == 0) {
    return absl::FailedPreconditionError(
        "a CPU-placed KV destination needs attention_address, attention_handle and "
        "attention_write_key");
  }
  const kv::KvCacheSpec& spec = copier_->memory().spec;
  const v1::KvLayout& layout = destination.layout();
  if (layout.num_layers() != spec.num_layers || layout.num_kv_heads() != spec.num_kv_heads ||
      layout.head_dim() != spec.head_dim) {
    return absl::FailedPreconditionError(
        absl::StrCat("the attention service's sequence has ", layout.num_layers(), " layers of ",
                     layout.num_kv_heads(), " KV heads of ", layout.head_dim(), "; this model has ",
                     spec.num_layers, " of ", spec.num_kv_heads, " of ", spec.head_dim));
  }
  const std::string& address = destination.attention_address();
  const uint64_t incarnation = destination.endpoint().incarnation();
  v1::Attention::Stub* stub;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Service>& service = services_[address];
    if (service == nullptr) {
      service = std::make_unique<Service>();
      service->stub = v1::Attention::NewStub(CreateClusterChannel(address));
    }
    if (service->connected && service->incarnation == incarnation) {
      return service->channels.back().get();
    }
    stub = service->stub.get();
  }
  // Connect outside the lock (two transfers may both connect: it is
  // idempotent).
  TRIDENT_ASSIGN_OR_RETURN(AttentionSession session,
                           OpenAttentionSession(*stub, endpoint_, *client_, options_.rpc_timeout));
  const v1::ConnectResponse& response = session.response;
  if (incarnation != 0 && response.server().incarnation() != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("attention service at ", address, " restarted (incarnation ",
                     response.server().incarnation(), ", the destination names ", incarnation,
                     "): the sequence is gone"));
  }
  absl::MutexLock lock(&mu_);
  Service& service = *services_[address];
  service.channels.push_back(std::move(session.channel));
  service.incarnation = response.server().incarnation();
  service.connected = true;
  TRIDENT_LOG(INFO) << "writing CPU-placed prompts to attention service "
                    << response.server().owner_id() << " at " << address;
  return service.channels.back().get();
}

void PromptKvSender::Disconnected(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = services_.find(address);
  if (it != services_.end()) it->second->connected = false;
}

std::unique_ptr<ServiceKvCopier::Scratch> PromptKvSender::TakeScratch() {
  absl::MutexLock lock(&mu_);
  if (scratch_.empty()) return std::make_unique<ServiceKvCopier::Scratch>();
  std::unique_ptr<ServiceKvCopier::Scratch> scratch = std::move(scratch_.back());
  scratch_.pop_back();
  return scratch;
}

void PromptKvSender::ReturnScratch(std::unique_ptr<ServiceKvCopier::Scratch> scratch) {
  absl::MutexLock lock(&mu_);
  // A few are enough: one per transfer running at once.
  if (scratch_.size() < 4) scratch_.push_back(std::move(scratch));
}

}  // namespace trident::worker
