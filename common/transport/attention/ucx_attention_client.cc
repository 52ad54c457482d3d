#include "common/transport/attention/ucx_attention_client.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"

namespace trident::transport::attention {
namespace {

absl::Status CheckCall(const AttentionCall& call) {
  if (call.handles.empty() || call.handles.size() != call.positions.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("an attention call needs one position per handle (", call.handles.size(),
                     " handles, ", call.positions.size(), " positions)"));
  }
  const bool f32 =
      call.q != nullptr && call.k != nullptr && call.v != nullptr && call.out != nullptr;
  const bool bf16 = call.qkv_bf16 != nullptr && call.out_bf16 != nullptr;
  if (f32 == bf16) {
    return absl::InvalidArgumentError(
        "an attention call needs either q, k, v and out or qkv_bf16 and out_bf16");
  }
  if (bf16 && call.dtype != WireDType::kBF16) {
    return absl::InvalidArgumentError("an attention call with bf16 rows must send bf16");
  }
  if (call.num_q_heads <= 0 || call.num_kv_heads <= 0 || call.head_dim <= 0 ||
      call.num_q_heads % call.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad attention shape: ", call.num_q_heads,
                                                   " q heads, ", call.num_kv_heads,
                                                   " kv heads, head_dim ", call.head_dim));
  }
  return absl::OkStatus();
}

absl::Status CheckAppend(const KvAppendCall& call) {
  if (call.handles.empty() || call.handles.size() != call.positions.size()) {
    return absl::InvalidArgumentError(absl::StrCat("an append needs one position per handle (",
                                                   call.handles.size(), " handles, ",
                                                   call.positions.size(), " positions)"));
  }
  const bool f32 = call.k != nullptr && call.v != nullptr;
  const bool bf16 = call.k_bf16 != nullptr && call.v_bf16 != nullptr;
  if (f32 == bf16 || call.num_kv_heads <= 0 || call.head_dim <= 0) {
    return absl::InvalidArgumentError(
        "an append needs a shape and either k and v or k_bf16 and v_bf16");
  }
  if (bf16 && call.dtype != WireDType::kBF16) {
    return absl::InvalidArgumentError("an append with bf16 rows must send bf16");
  }
  return absl::OkStatus();
}

// The request's data: the sequence table, then each sequence's [q | k | v]
// ([k | v] for an append: call.q null). With `bf16_rows` (an append whose
// rows are bf16 already), k and v come from its k_bf16 and v_bf16 as they
// are; with call.qkv_bf16, the whole rows do.
// Every byte is written (the buffer is not zero-filled first: a migration
// sends megabytes a request).
std::shared_ptr<uint64_t[]> PackRequest(MessageBuffers& buffers, const AttentionCall& call,
                                        const RequestHeader& header,
                                        const KvAppendCall* bf16_rows = nullptr) {
  const size_t bytes = RequestDataBytes(header);
  const size_t words = (bytes + 7) / 8;
  std::shared_ptr<uint64_t[]> buffer = buffers.Take(words);
  if (words > 0) buffer[words - 1] = 0;  // The padding past `bytes`.
  char* data = reinterpret_cast<char*>(buffer.get());
  auto* entries = reinterpret_cast<SequenceEntry*>(data);
  for (size_t i = 0; i < call.handles.size(); ++i) {
    entries[i] = SequenceEntry{.handle = call.handles[i], .position = call.positions[i]};
  }
  char* row = data + sizeof(SequenceEntry) * call.handles.size();
  const size_t element = WireElementSize(header.dtype);
  const size_t q_elems = static_cast<size_t>(call.num_q_heads) * call.head_dim;
  const size_t kv_elems = static_cast<size_t>(call.num_kv_heads) * call.head_dim;
  if (call.qkv_bf16 != nullptr) {
    const size_t row_bytes = (q_elems + 2 * kv_elems) * element;
    for (size_t i = 0; i < call.handles.size(); ++i) {
      std::memcpy(row + i * row_bytes, call.qkv_bf16 + i * call.qkv_bf16_stride, row_bytes);
    }
    return buffer;
  }
  for (size_t i = 0; i < call.handles.size(); ++i) {
    if (call.q != nullptr) {
      ToWire(header.dtype, call.q + i * call.q_stride, row, q_elems);
      row += q_elems * element;
    }
    if (bf16_rows != nullptr) {
      std::memcpy(row, bf16_rows->k_bf16 + i * bf16_rows->k_stride, kv_elems * element);
      row += kv_elems * element;
      std::memcpy(row, bf16_rows->v_bf16 + i * bf16_rows->v_stride, kv_elems * element);
      row += kv_elems * element;
      continue;
    }
    ToWire(header.dtype, call.k + i * call.k_stride, row, kv_elems);
    row += kv_elems * element;
    ToWire(header.dtype, call.v + i * call.v_stride, row, kv_elems);
    row += kv_elems * element;
  }
  return buffer;
}

}  // namespace

// The RemoteAttention of one service: its endpoints and the shared client.
class UcxAttentionClient::ServiceChannel final : public RemoteAttention {
 public:
  ServiceChannel(UcxAttentionClient* client, std::string service_id,
                 std::vector<std::shared_ptr<Endpoint>> endpoints)
      : client_(client), service_id_(std::move(service_id)), endpoints_(std::move(endpoints)) {}

  absl::StatusOr<Ticket> Start(const AttentionCall& call) override {
    TRIDENT_RETURN_IF_ERROR(CheckCall(call));
    return Send(call, 0);
  }

  absl::StatusOr<Ticket> StartAppend(const KvAppendCall& append) override {
    TRIDENT_RETURN_IF_ERROR(CheckAppend(append));
    const AttentionCall call{.layer = append.layer,
                             .num_q_heads = append.num_kv_heads,
                             .num_kv_heads = append.num_kv_heads,
                             .head_dim = append.head_dim,
                             .dtype = append.dtype,
                             .handles = append.handles,
                             .positions = append.positions,
                             .k = append.k,
                             .k_stride = append.k_stride,
                             .v = append.v,
                             .v_stride = append.v_stride};
    const uint8_t flags = append.write_key != 0 ? (kAppendOnly | kPromptWrite) : kAppendOnly;
    return Send(call, flags, append.k_bf16 != nullptr ? &append : nullptr, append.write_key);
  }

  absl::Status Wait(Ticket ticket, absl::Duration timeout) override {
    return client_->Wait(ticket, timeout);
  }

  absl::StatusOr<Ticket> StartBlockPut(const BlockPutCall& call) override {
    if (call.ticket == 0 || call.count < 1 || call.data == nullptr || call.bytes == 0) {
      return absl::InvalidArgumentError("a block put needs a ticket, a count and its bytes");
    }
    std::shared_ptr<uint64_t[]> data = client_->buffers_.Take((call.bytes + 7) / 8);
    std::memcpy(data.get(), call.data, call.bytes);
    return SendBlocks(/*put=*/true, call.ticket, call.first, call.count, std::move(data),
                      call.bytes, nullptr, 0);
  }

  absl::StatusOr<Ticket> StartBlockGet(const BlockGetCall& call) override {
    if (call.ticket == 0 || call.count < 1 || call.out == nullptr || call.bytes == 0) {
      return absl::InvalidArgumentError("a block get needs a ticket, a count and room");
    }
    return SendBlocks(/*put=*/false, call.ticket, call.first, call.count, nullptr, 0, call.out,
                      call.bytes);
  }

 private:
  // The lane for the next request; UNAVAILABLE when its endpoint failed.
  absl::StatusOr<int> NextLane() {
    const int lane =
        static_cast<int>(next_lane_.fetch_add(1, std::memory_order_relaxed) % endpoints_.size());
    if (endpoints_[lane]->failed()) {
      return absl::UnavailableError(
          absl::StrCat("attention service ", service_id_, " is unreachable"));
    }
    return lane;
  }

  absl::StatusOr<Ticket> SendBlocks(bool put, uint64_t ticket, int32_t first, int32_t count,
                                    std::shared_ptr<uint64_t[]> data, size_t bytes, char* out,
                                    size_t out_bytes) {
    TRIDENT_ASSIGN_OR_RETURN(const int lane, NextLane());
    RequestHeader header =
        BlockRequestHeader(put, ticket, first, count, client_->owner_incarnation_, lane);
    header.request_id = client_->AddBlockPending(out, out_bytes);
    const uint64_t request_id = header.request_id;
    UcxAttentionClient* client = client_;
    std::string service_id = service_id_;
    endpoints_[lane]->Send(
        kAttentionRequestMessageId, EncodeRequestHeader(header), data.get(), bytes,
        [client, request_id, data, service_id](absl::Status status) {
          if (!status.ok()) {
            client->Fail(request_id,
                         absl::UnavailableError(absl::StrCat("block request to ", service_id,
                                                             " failed: ", status.message())));
          }
        },
        /*rendezvous=*/bytes >= kRendezvousBytes);
    client_->requests_sent_.fetch_add(1, std::memory_order_relaxed);
    return request_id;
  }

  absl::StatusOr<Ticket> Send(const AttentionCall& call, uint8_t flags,
                              const KvAppendCall* bf16_rows = nullptr, uint64_t write_key = 0) {
    TRIDENT_ASSIGN_OR_RETURN(const int lane, NextLane());
    const std::shared_ptr<Endpoint>& endpoint = endpoints_[lane];
    RequestHeader header{.dtype = call.dtype,
                         .flags = flags,
                         .owner_incarnation = client_->owner_incarnation_,
                         .layer = call.layer,
                         .num_sequences = static_cast<int32_t>(call.handles.size()),
                         .num_q_heads = call.num_q_heads,
                         .num_kv_heads = call.num_kv_heads,
                         .head_dim = call.head_dim,
                         .lane = lane,
                         .write_key = write_key};
    std::shared_ptr<uint64_t[]> data = PackRequest(client_->buffers_, call, header, bf16_rows);
    header.request_id = client_->AddPending(call);
    const uint64_t request_id = header.request_id;
    UcxAttentionClient* client = client_;
    std::string service_id = service_id_;
    const size_t bytes = RequestDataBytes(header);
    endpoint->Send(
        kAttentionRequestMessageId, EncodeRequestHeader(header), data.get(), bytes,
        [client, request_id, data, service_id](absl::Status status) {
          if (!status.ok()) {
            client->Fail(request_id,
                         absl::UnavailableError(absl::StrCat("attention request to ", service_id,
                                                             " failed: ", status.message())));
          }
        },
        /*rendezvous=*/bytes >= kRendezvousBytes);
    client_->requests_sent_.fetch_add(1, std::memory_order_relaxed);
    return request_id;
  }

  UcxAttentionClient* const client_;
  const std::string service_id_;
  const std::vector<std::shared_ptr<Endpoint>> endpoints_;
  std::atomic<uint64_t> next_lane_{0};
};

absl::StatusOr<std::unique_ptr<UcxAttentionClient>> UcxAttentionClient::Create(
    UcxLanes* lanes, uint64_t owner_incarnation) {
  auto client =
      std::unique_ptr<UcxAttentionClient>(new UcxAttentionClient(lanes, owner_incarnation));
  UcxAttentionClient* raw = client.get();
  for (UcxWorker* worker : lanes->workers()) {
    TRIDENT_RETURN_IF_ERROR(worker->SetMessageHandler(
        kAttentionReplyMessageId,
        [raw](absl::string_view header, absl::string_view data) { raw->OnReply(header, data); }));
  }
  return client;
}

UcxAttentionClient::~UcxAttentionClient() {
  for (UcxWorker* worker : lanes_->workers()) {
    worker->SetMessageHandler(kAttentionReplyMessageId, [](absl::string_view, absl::string_view) {})
        .IgnoreError();
  }
  absl::MutexLock lock(&mu_);
  closed_ = true;
  for (auto& [id, pending] : pending_) {
    if (pending.done) continue;
    pending.done = true;
    pending.status = absl::UnavailableError("the attention client was shut down");
  }
}

absl::StatusOr<std::unique_ptr<RemoteAttention>> UcxAttentionClient::ForService(
    const trident::v1::TransportEndpoint& service) {
  TRIDENT_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Endpoint>> endpoints,
                           lanes_->EndpointsTo(service));
  return std::make_unique<ServiceChannel>(this, service.owner_id(), std::move(endpoints));
}

uint64_t UcxAttentionClient::AddPending(const AttentionCall& call) {
  const uint64_t id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  Pending& pending = pending_[id];
  pending.out = call.out;
  pending.out_stride = call.out_stride;
  pending.out_bf16 = call.out_bf16;
  pending.out_bf16_stride = call.out_bf16_stride;
  pending.num_sequences = static_cast<int32_t>(call.handles.size());
  pending.row_elements = int64_t{call.num_q_heads} * call.head_dim;
  pending.dtype = call.dtype;
  if (closed_) {
    pending.done = true;
    pending.status = absl::UnavailableError("the attention client was shut down");
  }
  return id;
}

uint64_t UcxAttentionClient::AddBlockPending(char* out, size_t bytes) {
  const uint64_t id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  Pending& pending = pending_[id];
  pending.blocks = true;
  pending.block_out = out;
  pending.block_bytes = bytes;
  if (closed_) {
    pending.done = true;
    pending.status = absl::UnavailableError("the attention client was shut down");
  }
  return id;
}

void UcxAttentionClient::TakeBlockReply(const ReplyHeader& h, absl::string_view data,
                                        Pending& pending) {
  if (!pending.blocks) {
    bad_replies_.fetch_add(1, std::memory_order_relaxed);
    pending.status = absl::InternalError("a block reply for an attention request");
    return;
  }
  const bool put = (h.flags & kAppendOnly) != 0;
  if (put != (pending.block_out == nullptr) || data.size() != pending.block_bytes) {
    bad_replies_.fetch_add(1, std::memory_order_relaxed);
    pending.status = absl::InternalError(absl::StrCat(
        "a block reply of ", data.size(), " bytes for a request of ", pending.block_bytes));
    return;
  }
  if (!put) std::memcpy(pending.block_out, data.data(), data.size());
  pending.status = absl::OkStatus();
}

void UcxAttentionClient::Fail(uint64_t request_id, absl::Status status) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(request_id);
  if (it == pending_.end() || it->second.done) return;
  it->second.done = true;
  it->second.status = std::move(status);
}

void UcxAttentionClient::OnReply(absl::string_view header, absl::string_view data) {
  absl::StatusOr<ReplyView> reply = DecodeReply(header, data.size());
  if (!reply.ok()) {
    bad_replies_.fetch_add(1, std::memory_order_relaxed);
    TRIDENT_LOG(WARNING) << "dropped an attention reply: " << reply.status();
    return;
  }
  const ReplyHeader& h = reply->header;
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(h.request_id);
  if (it == pending_.end() || it->second.done) return;  // Given up on, or failed first.
  Pending& pending = it->second;
  pending.done = true;
  if (h.status_code != 0) {
    pending.status = absl::Status(static_cast<absl::StatusCode>(h.status_code),
                                  absl::StrCat("attention service: ", reply->error));
    return;
  }
  if ((h.flags & kBlocks) != 0 || pending.blocks) {
    TakeBlockReply(h, data, pending);
    return;
  }
  const bool has_out = pending.out != nullptr || pending.out_bf16 != nullptr;
  if ((h.flags & kAppendOnly) != 0 || !has_out) {
    pending.status = ((h.flags & kAppendOnly) != 0) == !has_out
                         ? absl::OkStatus()
                         : absl::InternalError("an append's reply for an attention request");
    return;
  }
  if (h.num_sequences != pending.num_sequences ||
      int64_t{h.num_q_heads} * h.head_dim != pending.row_elements || h.dtype != pending.dtype) {
    bad_replies_.fetch_add(1, std::memory_order_relaxed);
    pending.status = absl::InternalError("the attention reply's shape does not match its request");
    return;
  }
  const size_t row_bytes = static_cast<size_t>(pending.row_elements) * WireElementSize(h.dtype);
  if (pending.out_bf16 != nullptr) {
    for (int32_t i = 0; i < h.num_sequences; ++i) {
      std::memcpy(pending.out_bf16 + i * pending.out_bf16_stride, data.data() + i * row_bytes,
                  row_bytes);
    }
    pending.status = absl::OkStatus();
    return;
  }
  for (int32_t i = 0; i < h.num_sequences; ++i) {
    FromWire(h.dtype, data.data() + i * row_bytes, pending.out + i * pending.out_stride,
             static_cast<size_t>(pending.row_elements));
  }
  pending.status = absl::OkStatus();
}

absl::Status UcxAttentionClient::Wait(uint64_t request_id, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(request_id);
  if (it == pending_.end()) {
    return absl::NotFoundError(absl::StrCat("no attention request ", request_id, " is pending"));
  }
  // The entry stays put (a node map) while the wait lets other threads add
  // theirs, but `it` may not survive a rehash: erase by key.
  const Pending* pending = &it->second;
  mu_.AwaitWithTimeout(absl::Condition(&pending->done), timeout);
  absl::Status status =
      pending->done
          ? pending->status
          : absl::DeadlineExceededError(absl::StrCat("the attention service did not answer within ",
                                                     absl::FormatDuration(timeout)));
  pending_.erase(request_id);
  return status;
}

}  // namespace trident::transport::attention
