#ifndef TRIDENT_COMMON_TRANSPORT_UCX_WORKER_CORE_H_
#define TRIDENT_COMMON_TRANSPORT_UCX_WORKER_CORE_H_

// The implementation behind ucx_worker.h's handles (private to the
// ucx_worker target): WorkerCore owns a UcxWorker's ucp context, its ucp
// worker and its progress thread, and every handle (Endpoint, RemoteKey,
// MemoryRegion, IncomingMessage) holds it and a state it keeps here.
//
// Threading: UCX is called from the progress thread alone, and members
// marked "progress thread only" are touched by no other thread once it runs.
// The public methods hand work to that thread (Post, RunSync) and may be
// called from any thread; Shutdown must not run on the progress thread.

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/transport/ucx_worker.h"

namespace trident::transport::internal {

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

// Owns the ucp context, the ucp worker and the progress thread (see above).
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

  ~WorkerCore();

  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }

  // Stops the thread after releasing everything UCX holds. Called once, by
  // ~UcxWorker, from another thread.
  void Shutdown();

  const UcxOptions& options() const { return options_; }
  const std::string& address() const { return address_; }
  bool supports_cuda() const { return supports_cuda_; }

  bool OnProgressThread() const {
    return std::this_thread::get_id() == progress_thread_id_.load(std::memory_order_acquire);
  }

  // Queues `task` for the progress thread. False (and `task` is dropped) once
  // the worker is shutting down.
  bool Post(std::function<void()> task);

  // Runs `fn` on the progress thread and waits for it: inline when called
  // there. UNAVAILABLE (and `fn` does not run) once UCX is shut down.
  absl::Status RunSync(absl::FunctionRef<void()> fn);

  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* base, size_t length,
                                                         MemoryKind kind);

  void Deregister(const std::shared_ptr<MemoryRegionState>& state) {
    RunSync([&] { UnmapRegion(state); }).IgnoreError();  // After shutdown it is unmapped.
  }

  absl::StatusOr<std::shared_ptr<Endpoint>> Connect(const std::string& peer_address,
                                                    std::string peer_id);

  absl::StatusOr<std::shared_ptr<RemoteKey>> UnpackRkey(
      const std::shared_ptr<EndpointState>& endpoint, const std::string& packed);

  void ReleaseRkey(std::shared_ptr<RemoteKeyState> state) {
    // Dropped if the worker is shutting down: shutdown destroys it.
    Post([this, state = std::move(state)] { DestroyRkey(state); });
  }

  void CloseEndpoint(std::shared_ptr<EndpointState> state) {
    Post([this, state = std::move(state)] { CloseEndpointNow(state, "endpoint closed"); });
  }

  void Put(std::shared_ptr<EndpointState> endpoint, const void* local, size_t length,
           uint64_t remote_address, std::shared_ptr<RemoteKeyState> rkey, DoneCallback done);

  void Send(std::shared_ptr<EndpointState> endpoint, uint16_t id, std::string header,
            const void* data, size_t length, DoneCallback done, bool rendezvous);

  absl::Status SetMessageHandler(uint16_t id, MessageHandler handler, RendezvousHandler rendezvous);

  // IncomingMessage::Receive: fetches a rendezvous message's data.
  void ReceiveRendezvous(void* desc, void* dest, size_t length, DoneCallback done);

  // ~IncomingMessage without Receive: drops the data (UCX tells the sender).
  void DropRendezvous(void* desc) {
    Post([this, desc] { ucp_am_data_release(worker_, desc); });
  }

  void Flush(std::shared_ptr<EndpointState> endpoint, DoneCallback done);

  void Handshake(std::shared_ptr<EndpointState> endpoint, DoneCallback done);

  // Installs the handler of handshake pings and answers. Before Start.
  absl::Status InstallHandshakeHandler() {
    return SetAmHandler(kHandshakeMessageId, &WorkerCore::OnHandshakeMessage, this);
  }

 private:
  // Points UCX's active messages `id` at `callback(arg, ...)`.
  absl::Status SetAmHandler(uint16_t id, ucp_am_recv_callback_t callback, void* arg);

  // Handshake header: one kind byte, then the initiator's 8-byte token.
  static constexpr char kHandshakePing = 'P';
  static constexpr char kHandshakeAnswer = 'A';
  static constexpr size_t kHandshakeHeaderBytes = 1 + sizeof(uint64_t);

  static std::string EncodeHandshake(char kind, uint64_t token);

  // Completes the pending handshake `token` (if still pending).
  void FinishHandshake(uint64_t token, absl::Status status);

  // Fails the pending handshakes of `state` (closed or failed).
  void FailHandshakes(const EndpointState* state, absl::string_view why);

  static ucs_status_t OnHandshakeMessage(void* arg, const void* header, size_t header_length,
                                         void* data, size_t /*length*/,
                                         const ucp_am_recv_param_t* param);

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
  void OnLiveEndpoint(std::unique_ptr<Op> op, Body body);

  struct HandlerSlot {
    WorkerCore* core = nullptr;
    MessageHandler handler;
    RendezvousHandler rendezvous;  // May be null.
  };

  static ucs_status_t OnMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);

  static absl::Status ShutDownError() {
    return absl::UnavailableError("the UCX worker is shut down");
  }

  ucp_request_param_t CallbackParams(Op* op);

  // Takes the result of a ucp *_nbx call for `op`.
  void Started(std::unique_ptr<Op> op, ucs_status_ptr_t request);

  // The worker whose progress thread this is (UCX runs request callbacks on
  // it only: in progress, endpoint closes and the worker's destruction).
  static WorkerCore*& ProgressCore() {
    static thread_local WorkerCore* core = nullptr;
    return core;
  }

  static void OnSendComplete(void* request, ucs_status_t status, void* user_data);

  static void OnReceiveComplete(void* request, ucs_status_t status, size_t /*length*/,
                                void* user_data) {
    OnSendComplete(request, status, user_data);
  }

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  // Queues `op`'s callback to run after the current ucp call returns.
  void Complete(std::unique_ptr<Op> op, absl::Status status) {
    completions_.emplace_back(std::move(op), std::move(status));
  }

  void RunCompletions();

  void Wake();

  std::string DescribeLane(ucp_ep_h ep);

  void CloseEndpointNow(const std::shared_ptr<EndpointState>& state, absl::string_view why);

  void PollClosing();

  void CloseFailedEndpoints();

  void DestroyRkey(const std::shared_ptr<RemoteKeyState>& state);

  void UnmapRegion(const std::shared_ptr<MemoryRegionState>& state);

  // Runs queued tasks; returns whether any ran.
  bool RunTasks();

  // Progresses UCX until it has nothing more to do, running callbacks;
  // returns whether anything happened.
  bool ProgressAll();

  void Loop();

  void Teardown();

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

}  // namespace trident::transport::internal

#endif  // TRIDENT_COMMON_TRANSPORT_UCX_WORKER_CORE_H_
