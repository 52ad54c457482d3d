#include "common/transport/ucx_worker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/logging/log.h"

namespace trident::transport {
namespace internal {

struct EndpointState {
  std::string peer_id;
  // Progress thread only. Null once closed.
  ucp_ep_h ep = nullptr;
  // Set on the progress thread; read anywhere.
  std::atomic<bool> failed{false};
  // Progress thread only: why the endpoint failed, for later operations.
  std::string failure;
  WorkerCore* core = nullptr;
};

struct RemoteKeyState {
  // Progress thread only. Null once destroyed.
  ucp_rkey_h rkey = nullptr;
  EndpointState* endpoint = nullptr;
};

struct MemoryRegionState {
  // Progress thread only. Null once unmapped.
  ucp_mem_h memh = nullptr;
};

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

std::string UcxDuration(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Microseconds(d), "us");
}

// Whether a UCX_TLS value may enable any of `names` ("all", an empty list
// and exclusion lists such as "^ib" may enable anything).
bool MayEnable(absl::string_view tls, std::initializer_list<absl::string_view> names) {
  if (tls.empty() || absl::StartsWith(tls, "^")) return true;
  for (absl::string_view item : absl::StrSplit(tls, ',')) {
    if (item == "all") return true;
    for (absl::string_view name : names) {
      if (absl::StartsWith(item, name)) return true;
    }
  }
  return false;
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

// Owns the ucp context and worker and the progress thread; see the header.
// Members marked "progress thread only" are touched by no other thread once
// the thread runs.
class WorkerCore : public std::enable_shared_from_this<WorkerCore> {
 public:
  WorkerCore(UcxOptions options, ucp_context_h context, ucp_worker_h worker, std::string address,
             bool supports_cuda, int ucp_event_fd, int wake_fd)
      : options_(std::move(options)),
        context_(context),
        worker_(worker),
        address_(std::move(address)),
        supports_cuda_(supports_cuda),
        ucp_event_fd_(ucp_event_fd),
        wake_fd_(wake_fd) {}

  ~WorkerCore() {
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }

  // Stops the thread after releasing everything UCX holds. Called once, by
  // ~UcxWorker, from another thread.
  void Shutdown() {
    TRIDENT_CHECK(!OnProgressThread()) << "a UcxWorker must not be destroyed on its own "
                                          "progress thread (from a completion callback)";
    {
      absl::MutexLock lock(&mu_);
      stop_requested_ = true;
    }
    Wake();
    thread_.join();
  }

  const UcxOptions& options() const { return options_; }
  const std::string& address() const { return address_; }
  bool supports_cuda() const { return supports_cuda_; }

  bool OnProgressThread() const {
    return std::this_thread::get_id() == progress_thread_id_.load(std::memory_order_acquire);
  }

  // Queues `task` for the progress thread. False (and `task` is dropped) once
  // the worker is shutting down.
  bool Post(std::function<void()> task) {
    {
      absl::MutexLock lock(&mu_);
      if (!accepting_) return false;
      tasks_.push_back(std::move(task));
    }
    Wake();
    return true;
  }

  // Runs `fn` on the progress thread and waits for it: inline when called
  // there. UNAVAILABLE (and `fn` does not run) once UCX is shut down.
  absl::Status RunSync(absl::FunctionRef<void()> fn) {
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

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* base, size_t length,
                                                         MemoryKind kind) {
    if (base == nullptr || length == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot register ", length, " bytes at address ",
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
    return std::unique_ptr<MemoryRegion>(new MemoryRegion(shared_from_this(), std::move(state),
                                                          base, length, kind, std::move(packed)));
  }

  void Deregister(const std::shared_ptr<MemoryRegionState>& state) {
    RunSync([&] { UnmapRegion(state); }).IgnoreError();  // After shutdown it is unmapped.
  }

  absl::StatusOr<std::shared_ptr<Endpoint>> Connect(const std::string& peer_address,
                                                    std::string peer_id) {
    if (peer_address.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("empty UCX worker address for peer ", peer_id));
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

  absl::StatusOr<std::shared_ptr<RemoteKey>> UnpackRkey(
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

  void ReleaseRkey(std::shared_ptr<RemoteKeyState> state) {
    // Dropped if the worker is shutting down: shutdown destroys it.
    Post([this, state = std::move(state)] { DestroyRkey(state); });
  }

  void CloseEndpoint(std::shared_ptr<EndpointState> state) {
    Post([this, state = std::move(state)] { CloseEndpointNow(state, "endpoint closed"); });
  }

  void Put(std::shared_ptr<EndpointState> endpoint, const void* local, size_t length,
           uint64_t remote_address, std::shared_ptr<RemoteKeyState> rkey, DoneCallback done) {
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

  void Send(std::shared_ptr<EndpointState> endpoint, uint16_t id, std::string header,
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

  absl::Status SetMessageHandler(uint16_t id, MessageHandler handler,
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

  // IncomingMessage::Receive: fetches a rendezvous message's data.
  void ReceiveRendezvous(void* desc, void* dest, size_t length, DoneCallback done) {
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

  // ~IncomingMessage without Receive: drops the data (UCX tells the sender).
  void DropRendezvous(void* desc) {
    Post([this, desc] { ucp_am_data_release(worker_, desc); });
  }

  void Flush(std::shared_ptr<EndpointState> endpoint, DoneCallback done) {
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

  void Handshake(std::shared_ptr<EndpointState> endpoint, DoneCallback done) {
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

  // Installs the handler of handshake pings and answers. Before Start.
  absl::Status InstallHandshakeHandler() {
    return SetAmHandler(kHandshakeMessageId, &WorkerCore::OnHandshakeMessage, this);
  }

 private:
  // Points UCX's active messages `id` at `callback(arg, ...)`.
  absl::Status SetAmHandler(uint16_t id, ucp_am_recv_callback_t callback, void* arg) {
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

  // Handshake header: one kind byte, then the initiator's 8-byte token.
  static constexpr char kHandshakePing = 'P';
  static constexpr char kHandshakeAnswer = 'A';
  static constexpr size_t kHandshakeHeaderBytes = 1 + sizeof(uint64_t);

  static std::string EncodeHandshake(char kind, uint64_t token) {
    std::string header(kHandshakeHeaderBytes, kind);
    std::memcpy(&header[1], &token, sizeof(token));
    return header;
  }

  // Completes the pending handshake `token` (if still pending).
  void FinishHandshake(uint64_t token, absl::Status status) {
    auto it = handshakes_.find(token);
    if (it == handshakes_.end()) return;
    std::unique_ptr<Op> op = std::move(it->second);
    handshakes_.erase(it);
    Complete(std::move(op), std::move(status));
  }

  // Fails the pending handshakes of `state` (closed or failed).
  void FailHandshakes(const EndpointState* state, absl::string_view why) {
    std::vector<uint64_t> tokens;
    for (const auto& [token, op] : handshakes_) {
      if (op->endpoint.get() == state) tokens.push_back(token);
    }
    for (uint64_t token : tokens) {
      FinishHandshake(token, absl::UnavailableError(absl::StrCat(
                                 "UCX handshake with peer ", state->peer_id, " failed: ", why)));
    }
  }

  static ucs_status_t OnHandshakeMessage(void* arg, const void* header, size_t header_length,
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

  // An outstanding Put or Flush. Owned by the UCX request while UCX holds it
  // (and listed in `outstanding_`), else by whoever completes it.
  struct Op {
    std::shared_ptr<EndpointState> endpoint;
    std::shared_ptr<RemoteKeyState> rkey;
    std::string header;  // Of a message; UCX may read it until completion.
    DoneCallback done;
    const char* operation = "";
    WorkerCore* core = nullptr;

    void Finish(absl::Status status) {
      DoneCallback callback = std::move(done);
      callback(std::move(status));
    }
  };

  // Runs `body(op, endpoint)` on the progress thread for an operation on
  // op->endpoint; fails the op instead when that endpoint has failed or
  // closed (FailedEndpointStatus), or when the worker takes no more work
  // (ShutDownError).
  template <typename Body>
  void OnLiveEndpoint(std::unique_ptr<Op> op, Body body) {
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

  struct HandlerSlot {
    WorkerCore* core = nullptr;
    MessageHandler handler;
    RendezvousHandler rendezvous;  // May be null.
  };

  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
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
      slot->rendezvous(header_view, std::unique_ptr<IncomingMessage>(new IncomingMessage(
                                        core->shared_from_this(), data, length)));
      // UCX keeps the descriptor until ucp_am_recv_data_nbx or
      // ucp_am_data_release (both on this thread, later).
      return UCS_INPROGRESS;
    }
    slot->handler(header_view, absl::string_view(static_cast<const char*>(data), length));
    return UCS_OK;  // UCX frees `data` (if it was UCP_AM_RECV_ATTR_FLAG_DATA too).
  }

  static absl::Status ShutDownError() {
    return absl::UnavailableError("the UCX worker is shut down");
  }

  ucp_request_param_t CallbackParams(Op* op) {
    op->core = this;
    ucp_request_param_t params{};
    params.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    params.cb.send = &WorkerCore::OnSendComplete;
    params.user_data = op;
    return params;
  }

  // Takes the result of a ucp *_nbx call for `op`.
  void Started(std::unique_ptr<Op> op, ucs_status_ptr_t request) {
    if (request == nullptr) {
      Complete(std::move(op), absl::OkStatus());
    } else if (UCS_PTR_IS_ERR(request)) {
      const ucs_status_t status = UCS_PTR_STATUS(request);
      Complete(std::move(op), OperationStatus(*op->endpoint, op->operation, status));
    } else {
      outstanding_.insert(op.release());  // OnSendComplete takes it back.
    }
  }

  // The worker whose progress thread this is (UCX runs request callbacks on
  // it only: in progress, endpoint closes and the worker's destruction).
  static WorkerCore*& ProgressCore() {
    static thread_local WorkerCore* core = nullptr;
    return core;
  }

  static void OnSendComplete(void* request, ucs_status_t status, void* user_data) {
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

  static void OnReceiveComplete(void* request, ucs_status_t status, size_t /*length*/,
                                void* user_data) {
    OnSendComplete(request, status, user_data);
  }

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* state = static_cast<EndpointState*>(arg);
    state->failed.store(true, std::memory_order_release);
    state->failure = absl::StrCat("peer failed: ", ucs_status_string(status));
    TRIDENT_LOG(WARNING) << "UCX worker " << state->core->options_.name << ": endpoint to peer "
                         << state->peer_id << " failed: " << ucs_status_string(status);
    // UCX requires the endpoint to be closed; not from inside its callback.
    state->core->failed_endpoints_.push_back(state);
  }

  // Queues `op`'s callback to run after the current ucp call returns.
  void Complete(std::unique_ptr<Op> op, absl::Status status) {
    completions_.emplace_back(std::move(op), std::move(status));
  }

  void RunCompletions() {
    while (!completions_.empty()) {
      std::vector<std::pair<std::unique_ptr<Op>, absl::Status>> batch;
      batch.swap(completions_);
      for (auto& [op, status] : batch) op->Finish(std::move(status));
    }
  }

  void Wake() {
    const uint64_t one = 1;
    // EAGAIN means the counter is already nonzero: a wakeup is pending.
    while (write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

  std::string DescribeLane(ucp_ep_h ep) {
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

  void CloseEndpointNow(const std::shared_ptr<EndpointState>& state, absl::string_view why) {
    if (state->ep == nullptr) return;
    FailHandshakes(state.get(),
                   state->failed.load(std::memory_order_relaxed) ? state->failure : why);
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

  void PollClosing() {
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

  void CloseFailedEndpoints() {
    std::vector<EndpointState*> failed;
    failed.swap(failed_endpoints_);
    for (EndpointState* state : failed) {
      auto it = endpoints_.find(state);
      if (it == endpoints_.end()) continue;
      std::shared_ptr<EndpointState> keep = it->second;
      CloseEndpointNow(keep, keep->failure);
    }
  }

  void DestroyRkey(const std::shared_ptr<RemoteKeyState>& state) {
    if (state->rkey == nullptr) return;
    ucp_rkey_destroy(state->rkey);
    state->rkey = nullptr;
    rkeys_.erase(state);
  }

  void UnmapRegion(const std::shared_ptr<MemoryRegionState>& state) {
    if (state->memh == nullptr) return;
    const ucs_status_t st = ucp_mem_unmap(context_, state->memh);
    if (st != UCS_OK) {
      TRIDENT_LOG(ERROR) << "ucp_mem_unmap failed: " << ucs_status_string(st);
    }
    state->memh = nullptr;
    regions_.erase(state);
  }

  // Runs queued tasks; returns whether any ran.
  bool RunTasks() {
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

  // Progresses UCX until it has nothing more to do, running callbacks;
  // returns whether anything happened.
  bool ProgressAll() {
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

  void Loop() {
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

  void Teardown() {
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

  const UcxOptions options_;
  const ucp_context_h context_;
  const ucp_worker_h worker_;
  const std::string address_;
  const bool supports_cuda_;
  const int ucp_event_fd_;  // Owned by worker_.
  const int wake_fd_;       // Ours: an eventfd that Post() signals.

  std::thread thread_;
  std::atomic<std::thread::id> progress_thread_id_{};
  absl::Notification stopped_;

  absl::Mutex mu_;
  std::vector<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;

  // Progress thread only.
  bool ucx_destroyed_ = false;
  bool in_progress_ = false;  // Inside ucp_worker_progress (message handlers).
  // Message handlers by id; UCX holds raw pointers to the slots.
  absl::flat_hash_map<uint16_t, std::unique_ptr<HandlerSlot>> handlers_;
  std::vector<std::pair<std::unique_ptr<Op>, absl::Status>> completions_;
  absl::flat_hash_set<Op*> outstanding_;
  absl::flat_hash_map<EndpointState*, std::shared_ptr<EndpointState>> endpoints_;
  std::vector<EndpointState*> failed_endpoints_;
  std::vector<std::pair<void*, std::shared_ptr<EndpointState>>> closing_;
  absl::flat_hash_set<std::shared_ptr<RemoteKeyState>> rkeys_;
  absl::flat_hash_set<std::shared_ptr<MemoryRegionState>> regions_;
  // Handshakes awaiting the peer's answer, by token.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Op>> handshakes_;
  uint64_t next_handshake_token_ = 1;
  // Names the peer in errors of handshake answers (sent on UCX's reply
  // endpoint, which has no EndpointState of ours).
  const std::shared_ptr<EndpointState> handshake_peer_ = [] {
    auto state = std::make_shared<EndpointState>();
    state->peer_id = "a handshaking peer";
    return state;
  }();
  // Names the peer in errors of rendezvous receives (UCX does not say which
  // endpoint a message came from).
  const std::shared_ptr<EndpointState> rendezvous_sender_ = [] {
    auto state = std::make_shared<EndpointState>();
    state->peer_id = "the message's sender";
    return state;
  }();
};

}  // namespace internal

using internal::MayEnable;
using internal::UcxDuration;
using internal::WorkerCore;

MemoryRegion::MemoryRegion(std::shared_ptr<WorkerCore> core,
                           std::shared_ptr<internal::MemoryRegionState> state, void* base,
                           size_t length, MemoryKind kind, std::string packed_rkey)
    : core_(std::move(core)),
      state_(std::move(state)),
      base_(base),
      length_(length),
      kind_(kind),
      packed_rkey_(std::move(packed_rkey)) {}

MemoryRegion::~MemoryRegion() { core_->Deregister(state_); }

IncomingMessage::IncomingMessage(std::shared_ptr<WorkerCore> core, void* desc, size_t length)
    : core_(std::move(core)), desc_(desc), length_(length) {}

IncomingMessage::~IncomingMessage() {
  if (desc_ != nullptr) core_->DropRendezvous(desc_);
}

void IncomingMessage::Receive(void* dest, DoneCallback done) {
  TRIDENT_CHECK(desc_ != nullptr) << "IncomingMessage::Receive called twice";
  void* desc = desc_;
  desc_ = nullptr;
  core_->ReceiveRendezvous(desc, dest, length_, std::move(done));
}

RemoteKey::RemoteKey(std::shared_ptr<WorkerCore> core,
                     std::shared_ptr<internal::RemoteKeyState> state)
    : core_(std::move(core)), state_(std::move(state)) {}

RemoteKey::~RemoteKey() { core_->ReleaseRkey(state_); }

Endpoint::Endpoint(std::shared_ptr<WorkerCore> core, std::shared_ptr<internal::EndpointState> state,
                   std::string peer_id, std::string lane)
    : core_(std::move(core)),
      state_(std::move(state)),
      peer_id_(std::move(peer_id)),
      lane_(std::move(lane)) {}

Endpoint::~Endpoint() { core_->CloseEndpoint(state_); }

absl::StatusOr<std::shared_ptr<RemoteKey>> Endpoint::UnpackRkey(const std::string& packed) {
  return core_->UnpackRkey(state_, packed);
}

void Endpoint::Put(const void* local, size_t length, uint64_t remote_address,
                   std::shared_ptr<RemoteKey> rkey, DoneCallback done) {
  if (rkey == nullptr) {
    absl::Status error =
        absl::InvalidArgumentError(absl::StrCat("UCX put to peer ", peer_id_, ": null rkey"));
    if (!core_->Post([done = std::move(done), error]() mutable { done(error); })) {
      done(error);
    }
    return;
  }
  core_->Put(state_, local, length, remote_address, rkey->state_, std::move(done));
}

void Endpoint::Send(uint16_t id, std::string header, const void* data, size_t length,
                    DoneCallback done, bool rendezvous) {
  core_->Send(state_, id, std::move(header), data, length, std::move(done), rendezvous);
}

void Endpoint::Flush(DoneCallback done) { core_->Flush(state_, std::move(done)); }

void Endpoint::Handshake(DoneCallback done) { core_->Handshake(state_, std::move(done)); }

bool Endpoint::failed() const { return state_->failed.load(std::memory_order_acquire); }

UcxWorker::UcxWorker(std::shared_ptr<WorkerCore> core) : core_(std::move(core)) {}

UcxWorker::~UcxWorker() { core_->Shutdown(); }

absl::StatusOr<std::unique_ptr<UcxWorker>> UcxWorker::Create(const UcxOptions& options) {
  if (options.keepalive_interval <= absl::ZeroDuration() ||
      options.idle_wakeup_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "UcxOptions.keepalive_interval and idle_wakeup_interval must be positive");
  }
  const std::string where =
      absl::StrCat(" (UCX worker '", options.name, "', transports '",
                   options.transports.empty() ? "<UCX default>" : options.transports, "')");
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("ucp_config_read failed: ", ucs_status_string(st), where));
  }
  const char* env_tls = std::getenv("UCX_TLS");
  const std::string effective_tls =
      !options.transports.empty() ? options.transports : (env_tls != nullptr ? env_tls : "");
  std::vector<std::pair<std::string, std::string>> settings;
  if (!options.transports.empty()) settings.emplace_back("TLS", options.transports);
  settings.emplace_back("KEEPALIVE_INTERVAL", UcxDuration(options.keepalive_interval));
  // Transport (UCT) settings go without their transport prefix: UCX applies
  // such a name to every transport having that field, and warns about names
  // no opened transport used, so set only those of transports that may open.
  if (MayEnable(effective_tls, {"tcp"})) {
    settings.emplace_back("KEEPIDLE", UcxDuration(options.keepalive_interval));
    settings.emplace_back("KEEPINTVL", UcxDuration(options.keepalive_interval));
    settings.emplace_back("KEEPCNT", "3");
  }
  if (MayEnable(effective_tls, {"posix", "sysv", "sm", "shm", "mm"})) {
    settings.emplace_back("MM_ERROR_HANDLING", "y");
  }
  for (const auto& [name, value] : settings) {
    st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::FailedPreconditionError(absl::StrCat(
          "ucp_config_modify(", name, "=", value, ") failed: ", ucs_status_string(st), where));
    }
  }

  ucp_params_t params{};
  params.field_mask =
      UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.name = options.name.c_str();
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    return absl::FailedPreconditionError(
        absl::StrCat("ucp_init failed: ", ucs_status_string(st), where));
  }

  ucp_context_attr_t context_attr{};
  context_attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  st = ucp_context_query(context, &context_attr);
  const bool supports_cuda =
      st == UCS_OK && (context_attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME;
  // Only the progress thread calls into the worker.
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  worker_params.name = options.name.c_str();
  ucp_worker_h worker = nullptr;
  st = ucp_worker_create(context, &worker_params, &worker);
  if (st != UCS_OK) {
    ucp_cleanup(context);
    return absl::FailedPreconditionError(
        absl::StrCat("ucp_worker_create failed: ", ucs_status_string(st), where));
  }

  ucp_address_t* raw_address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(worker, &raw_address, &address_length);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return absl::FailedPreconditionError(
        absl::StrCat("ucp_worker_get_address failed: ", ucs_status_string(st), where));
  }
  std::string address(reinterpret_cast<const char*>(raw_address), address_length);
  ucp_worker_release_address(worker, raw_address);

  int event_fd = -1;
  st = ucp_worker_get_efd(worker, &event_fd);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return absl::FailedPreconditionError(
        absl::StrCat("ucp_worker_get_efd failed: ", ucs_status_string(st), where));
  }
  const int wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    const int error = errno;
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return absl::FailedPreconditionError(
        absl::StrCat("eventfd failed: ", std::strerror(error), where));
  }

  auto core = std::make_shared<WorkerCore>(options, context, worker, std::move(address),
                                           supports_cuda, event_fd, wake_fd);
  const absl::Status handshakes = core->InstallHandshakeHandler();
  if (!handshakes.ok()) {
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return absl::FailedPreconditionError(absl::StrCat(handshakes.message(), where));
  }
  core->Start();
  return std::unique_ptr<UcxWorker>(new UcxWorker(std::move(core)));
}

const std::string& UcxWorker::address() const { return core_->address(); }

bool UcxWorker::supports_cuda_memory() const { return core_->supports_cuda(); }

const UcxOptions& UcxWorker::options() const { return core_->options(); }

absl::StatusOr<std::unique_ptr<MemoryRegion>> UcxWorker::Register(void* base, size_t length,
                                                                  MemoryKind kind) {
  return core_->Register(base, length, kind);
}

absl::StatusOr<std::shared_ptr<Endpoint>> UcxWorker::Connect(const std::string& peer_address,
                                                             std::string peer_id) {
  return core_->Connect(peer_address, std::move(peer_id));
}

absl::Status UcxWorker::SetMessageHandler(uint16_t id, MessageHandler handler,
                                          RendezvousHandler rendezvous) {
  return core_->SetMessageHandler(id, std::move(handler), std::move(rendezvous));
}

bool UcxWorker::OnProgressThread() const { return core_->OnProgressThread(); }

}  // namespace trident::transport
