#include "common/transport/ucx_worker_core.h"

#include <poll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/logging/log.h"

namespace trident::transport::internal {
namespace {

// ucs errors that mean the peer (or our endpoint to it) is gone, as opposed
// to a bug in how we called UCX.
bool IsPeerFailure(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CANCELED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_SHMEM_SEGMENT:
    case UCS_ERR_NO_DEVICE:
      return true;
    default:
      return false;
  }
}

absl::Status OperationStatus(const EndpointState& ep, absl::string_view operation,
                             ucs_status_t status) {
  if (status == UCS_OK) return absl::OkStatus();
  const std::string message = absl::StrCat(
      "UCX ", operation, " to peer ", ep.peer_id,
      " failed: ", status == UCS_ERR_CANCELED ? "endpoint closed" : ucs_status_string(status));
  if (IsPeerFailure(status)) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

absl::Status FailedEndpointStatus(const EndpointState& ep, absl::string_view operation) {
  return absl::UnavailableError(
      absl::StrCat("UCX ", operation, " to peer ", ep.peer_id, " not posted: ", ep.failure));
}

// The transport name of the lane that carries RMA writes, from
// ucp_ep_print_info's description, whose lane lines look like
//   #  lane[0]:  0:tcp/lo.0 md[0]  -> md[0]/tcp/sysdev[255] am am_bw#0 keepalive
//   #  lane[1]:  1:rc_mlx5/mlx5_0:1.0 md[1] -> md[1]/ib/sysdev[255] rma_bw#0
// Prefers an rma_bw lane, then an rma lane, then the active-message lane
// (over which UCX emulates RMA when no lane can reach registered memory).
std::string LaneFromEndpointInfo(absl::string_view info) {
  std::string best;
  int best_rank = 100;
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    const size_t lane_pos = line.find("lane[");
    if (lane_pos == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(lane_pos);
    const size_t colon = rest.find("]:");
    if (colon == absl::string_view::npos) continue;
    rest = absl::StripLeadingAsciiWhitespace(rest.substr(colon + 2));
    const size_t index_colon = rest.find(':');
    const size_t slash = rest.find('/');
    if (index_colon == absl::string_view::npos || slash == absl::string_view::npos ||
        slash < index_colon) {
      continue;
    }
    const std::string name(rest.substr(index_colon + 1, slash - index_colon - 1));
    const size_t arrow = rest.find("->");
    const absl::string_view flags =
        arrow == absl::string_view::npos ? absl::string_view() : rest.substr(arrow);
    int rank = 4;
    if (absl::StrContains(flags, " rma_bw")) {
      rank = 0;
    } else if (absl::StrContains(flags, " rma")) {
      rank = 1;
    } else if (absl::StrContains(flags, " am_bw")) {
      rank = 2;
    } else if (absl::StrContains(flags, " am")) {
      rank = 3;
    }
    if (rank < best_rank && !name.empty()) {
      best_rank = rank;
      best = name;
    }
  }
  return best;
}

}  // namespace

template <typename Body>
void WorkerCore::OnLiveEndpoint(std::unique_ptr<Op> op, Body body) {
  Op* raw = op.release();
  const bool posted = Post([this, raw, body = std::move(body)]() mutable {
    std::unique_ptr<Op> op(raw);
    EndpointState& ep = *op->endpoint;
    if (ep.ep == nullptr) {
      absl::Status failed = FailedEndpointStatus(ep, op->operation);
      Complete(std::move(op), std::move(failed));
      return;
    }
    body(std::move(op), ep);
  });
  if (!posted) std::unique_ptr<Op>(raw)->Finish(ShutDownError());
}

WorkerCore::~WorkerCore() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

void WorkerCore::Shutdown() {
  TRIDENT_CHECK(!OnProgressThread()) << "a UcxWorker must not be destroyed on its own "
                                        "progress thread (from a completion callback)";
  {
    absl::MutexLock lock(&mu_);
    stop_requested_ = true;
  }
  Wake();
  thread_.join();
}

bool WorkerCore::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!accepting_) return false;
    tasks_.push_back(std::move(task));
  }
  Wake();
  return true;
}

absl::Status WorkerCore::RunSync(absl::FunctionRef<void()> fn) {
  if (OnProgressThread()) {
    if (ucx_destroyed_) return ShutDownError();
    fn();
    return absl::OkStatus();
  }
  absl::Notification done;
  if (!Post([&fn, &done] {
        fn();
        done.Notify();
      })) {
    // Shutdown releases what is left; wait for it so that, e.g., a region
    // is deregistered before its destructor returns.
    stopped_.WaitForNotification();
    return ShutDownError();
  }
  done.WaitForNotification();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MemoryRegion>> WorkerCore::Register(void* base, size_t length,
                                                                   MemoryKind kind) {
  if (base == nullptr || length == 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot register ", length, " bytes at address ",
                                                   reinterpret_cast<uintptr_t>(base), " with UCX"));
  }
  if (kind == MemoryKind::kCuda && !supports_cuda_) {
    return absl::FailedPreconditionError(
        "cannot register CUDA memory: this UCX has no CUDA support (ucp_context_query "
        "lists no UCS_MEMORY_TYPE_CUDA); stage through pinned host memory");
  }
  auto state = std::make_shared<MemoryRegionState>();
  std::string packed;
  absl::Status status;
  absl::Status run = RunSync([&] {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address = base;
    params.length = length;
    params.memory_type = kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    ucs_status_t st = ucp_mem_map(context_, &params, &state->memh);
    if (st != UCS_OK) {
      state->memh = nullptr;
      status = absl::InternalError(absl::StrCat("ucp_mem_map of ", length, " bytes at address ",
                                                reinterpret_cast<uintptr_t>(base),
                                                " failed: ", ucs_status_string(st)));
      return;
    }
    void* buffer = nullptr;
    size_t size = 0;
    st = ucp_rkey_pack(context_, state->memh, &buffer, &size);
    if (st != UCS_OK) {
      ucp_mem_unmap(context_, state->memh);
      state->memh = nullptr;
      status = absl::InternalError(absl::StrCat("ucp_rkey_pack failed: ", ucs_status_string(st)));
      return;
    }
    packed.assign(static_cast<const char*>(buffer), size);
    ucp_rkey_buffer_release(buffer);
    regions_.insert(state);
  });
  if (!run.ok()) return run;
  if (!status.ok()) return status;
  return std::unique_ptr<MemoryRegion>(new MemoryRegion(shared_from_this(), std::move(state), base,
                                                        length, kind, std::move(packed)));
}

absl::StatusOr<std::shared_ptr<Endpoint>> WorkerCore::Connect(const std::string& peer_address,
                                                              std::string peer_id) {
  if (peer_address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("empty UCX worker address for peer ", peer_id));
  }
  auto state = std::make_shared<EndpointState>();
  state->peer_id = peer_id;
  state->core = this;
  std::string lane;
  absl::Status status;
  absl::Status run = RunSync([&] {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &WorkerCore::OnEndpointError;
    params.err_handler.arg = state.get();
    const ucs_status_t st = ucp_ep_create(worker_, &params, &state->ep);
    if (st != UCS_OK) {
      state->ep = nullptr;
      status = absl::UnavailableError(absl::StrCat("ucp_ep_create to peer ", peer_id,
                                                   " failed (transports '", options_.transports,
                                                   "'): ", ucs_status_string(st)));
      return;
    }
    lane = DescribeLane(state->ep);
    endpoints_.emplace(state.get(), state);
  });
  if (!run.ok()) return run;
  if (!status.ok()) return status;
  return std::shared_ptr<Endpoint>(
      new Endpoint(shared_from_this(), std::move(state), std::move(peer_id), std::move(lane)));
}

absl::StatusOr<std::shared_ptr<RemoteKey>> WorkerCore::UnpackRkey(
    const std::shared_ptr<EndpointState>& endpoint, const std::string& packed) {
  if (packed.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty packed rkey for peer ", endpoint->peer_id));
  }
  auto state = std::make_shared<RemoteKeyState>();
  state->endpoint = endpoint.get();
  absl::Status status;
  absl::Status run = RunSync([&] {
    if (endpoint->ep == nullptr) {
      status = FailedEndpointStatus(*endpoint, "rkey unpack");
      return;
    }
    const ucs_status_t st = ucp_ep_rkey_unpack(endpoint->ep, packed.data(), &state->rkey);
    if (st != UCS_OK) {
      state->rkey = nullptr;
      status = absl::InvalidArgumentError(absl::StrCat(
          "ucp_ep_rkey_unpack for peer ", endpoint->peer_id, " failed: ", ucs_status_string(st)));
      return;
    }
    rkeys_.insert(state);
  });
  if (!run.ok()) return run;
  if (!status.ok()) return status;
  return std::shared_ptr<RemoteKey>(new RemoteKey(shared_from_this(), std::move(state)));
}

void WorkerCore::Put(std::shared_ptr<EndpointState> endpoint, const void* local, size_t length,
                     uint64_t remote_address, std::shared_ptr<RemoteKeyState> rkey,
                     DoneCallback done) {
  auto op = std::make_unique<Op>();
  op->endpoint = std::move(endpoint);
  op->rkey = std::move(rkey);
  op->done = std::move(done);
  op->operation = "put";
  OnLiveEndpoint(std::move(op), [this, local, length, remote_address](std::unique_ptr<Op> op,
                                                                      EndpointState& ep) {
    if (op->rkey->rkey == nullptr || op->rkey->endpoint != &ep) {
      Complete(std::move(op),
               absl::InvalidArgumentError(absl::StrCat(
                   "UCX put to peer ", ep.peer_id,
                   op->rkey->rkey == nullptr ? ": the rkey was released"
                                             : ": the rkey was unpacked for another endpoint")));
      return;
    }
    ucp_request_param_t params = CallbackParams(op.get());
    ucs_status_ptr_t request =
        ucp_put_nbx(ep.ep, local, length, remote_address, op->rkey->rkey, &params);
    Started(std::move(op), request);
  });
}

void WorkerCore::Send(std::shared_ptr<EndpointState> endpoint, uint16_t id, std::string header,
                      const void* data, size_t length, DoneCallback done, bool rendezvous) {
  auto op = std::make_unique<Op>();
  op->endpoint = std::move(endpoint);
  op->header = std::move(header);
  op->done = std::move(done);
  op->operation = "message send";
  OnLiveEndpoint(std::move(op),
                 [this, id, data, length, rendezvous](std::unique_ptr<Op> op, EndpointState& ep) {
                   ucp_request_param_t params = CallbackParams(op.get());
                   params.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
                   params.flags = rendezvous ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER;
                   ucs_status_ptr_t request = ucp_am_send_nbx(
                       ep.ep, id, op->header.data(), op->header.size(), data, length, &params);
                   Started(std::move(op), request);
                 });
}

absl::Status WorkerCore::SetMessageHandler(uint16_t id, MessageHandler handler,
                                           RendezvousHandler rendezvous) {
  TRIDENT_CHECK(!OnProgressThread() || !in_progress_)
      << "SetMessageHandler called from a message handler";
  if (id == kHandshakeMessageId) {
    return absl::InvalidArgumentError(
        absl::StrCat("active-message id ", id, " is reserved for UCX worker handshakes"));
  }
  auto slot = std::make_unique<HandlerSlot>();
  slot->core = this;
  slot->handler = std::move(handler);
  slot->rendezvous = std::move(rendezvous);
  absl::Status status;
  absl::Status run = RunSync([&] {
    status = SetAmHandler(id, &WorkerCore::OnMessage, slot.get());
    // The old slot (if any) is no longer referenced by UCX.
    if (status.ok()) handlers_[id] = std::move(slot);
  });
  if (!run.ok()) return run;
  return status;
}

void WorkerCore::ReceiveRendezvous(void* desc, void* dest, size_t length, DoneCallback done) {
  auto op = std::make_unique<Op>();
  op->endpoint = rendezvous_sender_;
  op->done = std::move(done);
  op->operation = "rendezvous receive";
  Op* raw = op.release();
  const bool posted = Post([this, raw, desc, dest, length] {
    std::unique_ptr<Op> op(raw);
    op->core = this;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.recv_am = &WorkerCore::OnReceiveComplete;
    params.user_data = op.get();
    ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_, desc, dest, length, &params);
    Started(std::move(op), request);
  });
  if (!posted) std::unique_ptr<Op>(raw)->Finish(ShutDownError());
}

void WorkerCore::Flush(std::shared_ptr<EndpointState> endpoint, DoneCallback done) {
  auto op = std::make_unique<Op>();
  op->endpoint = std::move(endpoint);
  op->done = std::move(done);
  op->operation = "flush";
  OnLiveEndpoint(std::move(op), [this](std::unique_ptr<Op> op, EndpointState& ep) {
    ucp_request_param_t params = CallbackParams(op.get());
    ucs_status_ptr_t request = ucp_ep_flush_nbx(ep.ep, &params);
    Started(std::move(op), request);
  });
}

void WorkerCore::Handshake(std::shared_ptr<EndpointState> endpoint, DoneCallback done) {
  auto op = std::make_unique<Op>();
  op->endpoint = std::move(endpoint);
  op->done = std::move(done);
  op->operation = "handshake";
  OnLiveEndpoint(std::move(op), [this](std::unique_ptr<Op> op, EndpointState& ep) {
    const uint64_t token = next_handshake_token_++;
    // The ping: eager, and asking UCX for a reply endpoint at the peer,
    // which answers on it (OnHandshakeMessage). Its own completion matters
    // only if it fails; the answer completes the handshake.
    auto ping = std::make_unique<Op>();
    ping->endpoint = op->endpoint;
    ping->header = EncodeHandshake(kHandshakePing, token);
    ping->done = [this, token](absl::Status status) {
      if (!status.ok()) FinishHandshake(token, std::move(status));
    };
    ping->operation = "handshake ping";
    handshakes_.emplace(token, std::move(op));
    ucp_request_param_t params = CallbackParams(ping.get());
    params.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t request = ucp_am_send_nbx(ep.ep, kHandshakeMessageId, ping->header.data(),
                                               ping->header.size(), nullptr, 0, &params);
    Started(std::move(ping), request);
  });
}

absl::Status WorkerCore::SetAmHandler(uint16_t id, ucp_am_recv_callback_t callback, void* arg) {
  ucp_am_handler_param_t params{};
  params.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
  params.id = id;
  params.cb = callback;
  params.arg = arg;
  const ucs_status_t st = ucp_worker_set_am_recv_handler(worker_, &params);
  if (st != UCS_OK) {
    return absl::InternalError(
        absl::StrCat("ucp_worker_set_am_recv_handler(", id, ") failed: ", ucs_status_string(st)));
  }
  return absl::OkStatus();
}

std::string WorkerCore::EncodeHandshake(char kind, uint64_t token) {
  std::string header(kHandshakeHeaderBytes, kind);
  std::memcpy(&header[1], &token, sizeof(token));
  return header;
}

void WorkerCore::FinishHandshake(uint64_t token, absl::Status status) {
  auto it = handshakes_.find(token);
  if (it == handshakes_.end()) return;
  std::unique_ptr<Op> op = std::move(it->second);
  handshakes_.erase(it);
  Complete(std::move(op), std::move(status));
}

void WorkerCore::FailHandshakes(const EndpointState* state, absl::string_view why) {
  std::vector<uint64_t> tokens;
  for (const auto& [token, op] : handshakes_) {
    if (op->endpoint.get() == state) tokens.push_back(token);
  }
  for (uint64_t token : tokens) {
    FinishHandshake(token, absl::UnavailableError(absl::StrCat("UCX handshake with peer ",
                                                               state->peer_id, " failed: ", why)));
  }
}

ucs_status_t WorkerCore::OnHandshakeMessage(void* arg, const void* header, size_t header_length,
                                            void* data, size_t /*length*/,
                                            const ucp_am_recv_param_t* param) {
  auto* core = static_cast<WorkerCore*>(arg);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    ucp_am_data_release(core->worker_, data);  // Not a handshake: they carry no data.
    return UCS_OK;
  }
  if (header_length != kHandshakeHeaderBytes) return UCS_OK;
  const char kind = static_cast<const char*>(header)[0];
  uint64_t token;
  std::memcpy(&token, static_cast<const char*>(header) + 1, sizeof(token));
  if (kind == kHandshakeAnswer) {
    core->FinishHandshake(token, absl::OkStatus());
  } else if (kind == kHandshakePing) {
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) {
      TRIDENT_LOG(WARNING) << "UCX worker " << core->options_.name
                           << ": handshake ping without a reply endpoint, not answered";
      return UCS_OK;
    }
    // Answered from inside UCX's callback, where the reply endpoint is
    // certainly alive. Queued behind the wireup reply on that endpoint, so
    // its arrival tells the initiator that reply went out.
    auto answer = std::make_unique<Op>();
    answer->endpoint = core->handshake_peer_;
    answer->header = EncodeHandshake(kHandshakeAnswer, token);
    answer->done = [](absl::Status) {};  // The initiator sees a failure.
    answer->operation = "handshake answer";
    ucp_request_param_t params = core->CallbackParams(answer.get());
    params.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    params.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t request =
        ucp_am_send_nbx(param->reply_ep, kHandshakeMessageId, answer->header.data(),
                        answer->header.size(), nullptr, 0, &params);
    core->Started(std::move(answer), request);
  }
  return UCS_OK;
}

ucs_status_t WorkerCore::OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                   size_t length, const ucp_am_recv_param_t* param) {
  auto* slot = static_cast<HandlerSlot*>(arg);
  const absl::string_view header_view(static_cast<const char*>(header), header_length);
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    if (!slot->rendezvous) {
      TRIDENT_LOG(WARNING) << "UCX worker " << slot->core->options_.name
                           << ": dropped a rendezvous active message of " << length
                           << " bytes (no rendezvous handler)";
      ucp_am_data_release(slot->core->worker_, data);
      return UCS_OK;
    }
    WorkerCore* core = slot->core;
    slot->rendezvous(header_view, std::unique_ptr<IncomingMessage>(
                                      new IncomingMessage(core->shared_from_this(), data, length)));
    // UCX keeps the descriptor until ucp_am_recv_data_nbx or
    // ucp_am_data_release (both on this thread, later).
    return UCS_INPROGRESS;
  }
  slot->handler(header_view, absl::string_view(static_cast<const char*>(data), length));
  return UCS_OK;  // UCX frees `data` (if it was UCP_AM_RECV_ATTR_FLAG_DATA too).
}

ucp_request_param_t WorkerCore::CallbackParams(Op* op) {
  op->core = this;
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  params.cb.send = &WorkerCore::OnSendComplete;
  params.user_data = op;
  return params;
}

void WorkerCore::Started(std::unique_ptr<Op> op, ucs_status_ptr_t request) {
  if (request == nullptr) {
    Complete(std::move(op), absl::OkStatus());
  } else if (UCS_PTR_IS_ERR(request)) {
    const ucs_status_t status = UCS_PTR_STATUS(request);
    Complete(std::move(op), OperationStatus(*op->endpoint, op->operation, status));
  } else {
    outstanding_.insert(op.release());  // OnSendComplete takes it back.
  }
}

void WorkerCore::OnSendComplete(void* request, ucs_status_t status, void* user_data) {
  Op* const raw = static_cast<Op*>(user_data);
  WorkerCore* const core = ProgressCore();
  // Every request that calls back was listed when it started; one that is
  // not was completed already, and its op is freed. Ignore such a second
  // call rather than run the freed op: ucx_peer_death_test crashed in
  // worker shutdown running an op's callback a second time (an empty
  // std::function), after rendezvous senders had been killed, which is
  // what a request called back twice does. The pointer is only looked up,
  // never read.
  if (core == nullptr || core->outstanding_.erase(raw) == 0) {
    TRIDENT_LOG(WARNING) << "UCX called back a request that had already completed (status "
                         << ucs_status_string(status) << "); ignored";
    return;
  }
  ucp_request_free(request);
  std::unique_ptr<Op> op(raw);
  const absl::Status result = OperationStatus(*op->endpoint, op->operation, status);
  core->Complete(std::move(op), result);
}

void WorkerCore::OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* state = static_cast<EndpointState*>(arg);
  state->failed.store(true, std::memory_order_release);
  state->failure = absl::StrCat("peer failed: ", ucs_status_string(status));
  TRIDENT_LOG(WARNING) << "UCX worker " << state->core->options_.name << ": endpoint to peer "
                       << state->peer_id << " failed: " << ucs_status_string(status);
  // UCX requires the endpoint to be closed; not from inside its callback.
  state->core->failed_endpoints_.push_back(state);
}

void WorkerCore::RunCompletions() {
  while (!completions_.empty()) {
    std::vector<std::pair<std::unique_ptr<Op>, absl::Status>> batch;
    batch.swap(completions_);
    for (auto& [op, status] : batch) op->Finish(std::move(status));
  }
}

void WorkerCore::Wake() {
  const uint64_t one = 1;
  // EAGAIN means the counter is already nonzero: a wakeup is pending.
  while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

std::string WorkerCore::DescribeLane(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return "";
  ucp_ep_print_info(ep, stream);
  fclose(stream);
  std::string lane = LaneFromEndpointInfo(absl::string_view(text, size));
  free(text);
  return lane;
}

void WorkerCore::CloseEndpointNow(const std::shared_ptr<EndpointState>& state,
                                  absl::string_view why) {
  if (state->ep == nullptr) return;
  FailHandshakes(state.get(), state->failed.load(std::memory_order_relaxed) ? state->failure : why);
  // A healthy endpoint closes gracefully: UCX first completes what is
  // outstanding, so the peer never sees a half-written stream (UCX 1.13's
  // emulated RMA aborts the target process when a put's completion ack
  // cannot be sent). A failed one is force-closed, which never waits for
  // the peer; its outstanding requests complete with UCS_ERR_CANCELED. A
  // graceful close to a peer that died unnoticed ends when keepalive
  // notices, so neither waits long, and neither blocks any caller.
  const bool force = state->failed.load(std::memory_order_relaxed);
  ucp_request_param_t params{};
  params.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  params.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(state->ep, &params);
  state->ep = nullptr;
  if (!force) {
    state->failure = std::string(why);
    state->failed.store(true, std::memory_order_release);
  }
  if (UCS_PTR_IS_PTR(request)) {
    closing_.emplace_back(request, state);
  } else {
    endpoints_.erase(state.get());
  }
}

void WorkerCore::PollClosing() {
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i].first) == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    ucp_request_free(closing_[i].first);
    endpoints_.erase(closing_[i].second.get());
    closing_[i] = std::move(closing_.back());
    closing_.pop_back();
  }
}

void WorkerCore::CloseFailedEndpoints() {
  std::vector<EndpointState*> failed;
  failed.swap(failed_endpoints_);
  for (EndpointState* state : failed) {
    auto it = endpoints_.find(state);
    if (it == endpoints_.end()) continue;
    std::shared_ptr<EndpointState> keep = it->second;
    CloseEndpointNow(keep, keep->failure);
  }
}

void WorkerCore::DestroyRkey(const std::shared_ptr<RemoteKeyState>& state) {
  if (state->rkey == nullptr) return;
  ucp_rkey_destroy(state->rkey);
  state->rkey = nullptr;
  rkeys_.erase(state);
}

void WorkerCore::UnmapRegion(const std::shared_ptr<MemoryRegionState>& state) {
  if (state->memh == nullptr) return;
  const ucs_status_t st = ucp_mem_unmap(context_, state->memh);
  if (st != UCS_OK) {
    TRIDENT_LOG(ERROR) << "ucp_mem_unmap failed: " << ucs_status_string(st);
  }
  state->memh = nullptr;
  regions_.erase(state);
}

bool WorkerCore::RunTasks() {
  std::vector<std::function<void()>> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) {
    task();
    RunCompletions();
  }
  return !tasks.empty();
}

bool WorkerCore::ProgressAll() {
  bool any = false;
  while (true) {
    in_progress_ = true;
    const unsigned events = ucp_worker_progress(worker_);
    in_progress_ = false;
    RunCompletions();
    CloseFailedEndpoints();
    RunCompletions();
    if (events == 0) break;
    any = true;
  }
  PollClosing();
  return any;
}

void WorkerCore::Loop() {
  progress_thread_id_.store(std::this_thread::get_id(), std::memory_order_release);
  ProgressCore() = this;
  const int idle_ms = static_cast<int>(
      std::max<int64_t>(1, absl::ToInt64Milliseconds(options_.idle_wakeup_interval)));
  // Shared-memory transports cannot always arm a wakeup (ucp_worker_arm
  // keeps answering BUSY); after a run of those, wait 1 ms between polls
  // instead of spinning a core.
  int busy_in_a_row = 0;
  absl::Time last_activity = absl::InfinitePast();
  while (true) {
    uint64_t counter;
    while (read(wake_fd_, &counter, sizeof(counter)) > 0) {
    }
    const bool ran = RunTasks();
    if (ProgressAll() || ran) last_activity = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      if (stop_requested_) break;
      if (!tasks_.empty()) continue;
    }
    // Sends in flight need progress to move on (a full shared-memory FIFO
    // or socket buffer raises no event here when it drains): keep
    // progressing while any are outstanding rather than sleeping.
    if (!outstanding_.empty()) continue;
    // Busy-poll for a moment after traffic: a message's fragments arrive
    // faster than a sleep/wake round trip (a shared-memory FIFO holds a
    // fraction of a large message, and the sender waits for it to drain).
    if (absl::Now() - last_activity < options_.busy_poll) continue;
    const ucs_status_t armed = ucp_worker_arm(worker_);
    pollfd fds[2] = {{ucp_event_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (armed == UCS_ERR_BUSY) {  // Events arrived meanwhile.
      if (++busy_in_a_row >= 64) poll(&fds[1], 1, 1);
      continue;
    }
    busy_in_a_row = 0;
    poll(fds, 2, idle_ms);
  }
  Teardown();
  stopped_.Notify();
}

void WorkerCore::Teardown() {
  // Accept nothing more, then run what was accepted against live UCX.
  // Work that callbacks post from now on fails at once with UNAVAILABLE.
  {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
  }
  RunTasks();
  std::vector<std::shared_ptr<EndpointState>> endpoints;
  for (auto& [raw, state] : endpoints_) endpoints.push_back(state);
  for (auto& state : endpoints) CloseEndpointNow(state, "the UCX worker is shut down");
  // Forced closes complete outstanding requests with UCS_ERR_CANCELED
  // during progress; bound the wait in case a transport never does.
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while ((!outstanding_.empty() || !closing_.empty()) && absl::Now() < deadline) {
    ProgressAll();
  }
  if (!outstanding_.empty() || !closing_.empty()) {
    TRIDENT_LOG(WARNING) << "UCX worker " << options_.name << ": " << outstanding_.size()
                         << " operations and " << closing_.size()
                         << " endpoint closes still pending at shutdown";
  }
  for (auto& [request, state] : closing_) ucp_request_free(request);
  closing_.clear();
  std::vector<std::shared_ptr<RemoteKeyState>> rkeys(rkeys_.begin(), rkeys_.end());
  for (auto& state : rkeys) DestroyRkey(state);
  std::vector<std::shared_ptr<MemoryRegionState>> regions(regions_.begin(), regions_.end());
  for (auto& state : regions) UnmapRegion(state);
  // Destroying the worker completes some requests still held by UCX (their
  // callbacks take them out of `outstanding_`) and frees the others
  // silently: complete those here, so that each runs exactly once.
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
  ucx_destroyed_ = true;
  std::vector<Op*> leftover(outstanding_.begin(), outstanding_.end());
  outstanding_.clear();
  for (Op* raw : leftover) {
    Complete(std::unique_ptr<Op>(raw), ShutDownError());
  }
  std::vector<uint64_t> handshakes;
  for (const auto& [token, op] : handshakes_) handshakes.push_back(token);
  for (uint64_t token : handshakes) FinishHandshake(token, ShutDownError());
  endpoints_.clear();
  RunCompletions();
}

}  // namespace trident::transport::internal
