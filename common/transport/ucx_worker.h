#ifndef TRIDENT_COMMON_TRANSPORT_UCX_WORKER_H_
#define TRIDENT_COMMON_TRANSPORT_UCX_WORKER_H_

// One-sided writes (RMA puts) between processes over UCX's ucp layer: the data
// path behind trident.v1.TransportEndpoint and KvRegion (proto/trident/v1/
// cluster.proto). A process creates one `UcxWorker`, publishes `address()`
// (TransportEndpoint.ucx_worker_address) and the `packed_rkey()` of the memory
// it lets peers write (KvRegion.rkey); a writer `Connect`s to that address,
// unpacks the rkey against the endpoint and `Put`s bytes at remote addresses.
//
//   UcxWorker (one ucp_context + ucp_worker + one progress thread)
//    ├─ MemoryRegion   memory registered here; peers write it with its rkey
//    └─ Endpoint       connection to one peer's worker
//        └─ RemoteKey  a peer's rkey, unpacked for this endpoint
//
// Threading: every ucp_* call after creation happens on the worker's single
// progress thread. The public methods below are thread-safe; they hand work
// to that thread through a queue (waking it with an eventfd) and either
// return at once (Put, Flush) or wait for the thread to run it (Register,
// Connect, UnpackRkey, ~MemoryRegion). Completion callbacks run on the
// progress thread, never inside a ucp call, so they may call any method here,
// including the blocking ones (which then run inline). A callback must not
// block for long: it stalls every transfer of the worker.
//
// Peer failure: endpoints use UCP_ERR_HANDLING_MODE_PEER. A dead peer is seen
// when a transport reports it (a TCP reset or a shared-memory peer's pid gone)
// or by UCX keepalive, whose interval `UcxOptions::keepalive_interval` sets
// (UCX_KEEPALIVE_INTERVAL; TCP_KEEPIDLE/KEEPINTVL/KEEPCNT likewise, so that a
// silent TCP peer is dropped by the kernel within a few seconds). From then on
// the endpoint is `failed()`: outstanding and later Puts and Flushes complete
// with UNAVAILABLE naming the peer. Shared-memory transports (posix, sysv)
// only take part in error-handling endpoints when UCX's MM_ERROR_HANDLING is
// on, which `Create` sets (their keepalive checks the peer's pid).
//
// Lifetime: Endpoints, RemoteKeys and MemoryRegions may outlive their
// UcxWorker. Destroying the worker closes every endpoint (completing what is
// outstanding with UNAVAILABLE), releases every rkey and registration, and
// stops the thread; objects left over are inert afterwards: Put and Flush
// complete at once on the caller's thread with UNAVAILABLE.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trident::transport {

namespace internal {
class WorkerCore;
struct EndpointState;
struct RemoteKeyState;
struct MemoryRegionState;
}  // namespace internal

// The active-message id of Endpoint::Handshake's ping and answer, reserved:
// SetMessageHandler refuses it.
inline constexpr uint16_t kHandshakeMessageId = 0x4853;  // "HS"

// Where registered memory lives.
enum class MemoryKind { kHost, kCuda };

// Called once with the outcome of a Put, Send or Flush.
using DoneCallback = std::function<void(absl::Status)>;

// Receives the active messages of one id (UcxWorker::SetMessageHandler). Runs
// on the progress thread, inside UCX's progress: `header` and `data` are valid
// only during the call, and the handler must not call this worker's methods
// (it may take its own locks and copy the data out; it stalls every transfer
// of the worker while it runs).
using MessageHandler = std::function<void(absl::string_view header, absl::string_view data)>;

// A message sent by rendezvous (Endpoint::Send with `rendezvous`), announced
// to its handler (RendezvousHandler) while its data is still at the sender:
// the receiver chooses where it lands and fetches it with Receive, so that
// UCX moves it once, straight into that memory (over shared memory: through
// the FIFO in fragments, or one process_vm_readv with cma), with no
// reassembly buffer in between. Dropping it without Receive releases the
// sender (its Send completes; UCX 1.13 reports OK, so delivery must be
// confirmed above UCX). Thread-safe; may outlive the worker (Receive then
// fails with UNAVAILABLE).
class IncomingMessage {
 public:
  ~IncomingMessage();
  IncomingMessage(const IncomingMessage&) = delete;
  IncomingMessage& operator=(const IncomingMessage&) = delete;

  size_t length() const { return length_; }

  // Fetches the data into [dest, dest + length()). `done` runs once, on the
  // progress thread: OK once the bytes are there; UNAVAILABLE if the sender
  // failed or the worker shut down; INTERNAL for other UCX errors. Call at
  // most once, from any thread (including the handler).
  // REQUIRES: the destination stays valid until `done` runs.
  void Receive(void* dest, DoneCallback done);

 private:
  friend class internal::WorkerCore;
  IncomingMessage(std::shared_ptr<internal::WorkerCore> core, void* desc, size_t length);

  const std::shared_ptr<internal::WorkerCore> core_;
  void* desc_;  // UCX's data descriptor; null once handed to Receive.
  const size_t length_;
};

// Receives the rendezvous messages of one id (UcxWorker::SetMessageHandler).
// Runs on the progress thread, inside UCX's progress: `header` is valid only
// during the call; the handler keeps `message` (Receive now or later, from
// any thread) or drops it. It must not call this worker's methods other than
// IncomingMessage::Receive.
using RendezvousHandler =
    std::function<void(absl::string_view header, std::unique_ptr<IncomingMessage> message)>;

struct UcxOptions {
  // UCX_TLS for this worker: a comma-separated transport list such as "tcp",
  // "posix", "sm", "rc_x,cuda_ipc". Empty: UCX's default (the UCX_TLS
  // environment variable, else every transport).
  std::string transports;
  // Name of the ucp context and worker in UCX's diagnostics and our logs.
  std::string name = "trident";
  // UCX keepalive interval; also the TCP keepalive idle time and probe
  // interval. A dead peer that no transport reports is detected within about
  // three intervals.
  absl::Duration keepalive_interval = absl::Seconds(1);
  // Longest time the progress thread sleeps with nothing to wake it; it then
  // progresses UCX anyway, which drives keepalive.
  absl::Duration idle_wakeup_interval = absl::Milliseconds(100);
  // After any traffic, the progress thread polls without sleeping for this
  // long before it waits for an event (a sleep/wake round trip per burst of
  // fragments would cap bandwidth far below the transport's).
  absl::Duration busy_poll = absl::Milliseconds(2);
};

// Memory registered with a UcxWorker (ucp_mem_map) that peers may write
// through `packed_rkey()`. Deregisters in its destructor, which waits for the
// progress thread; the memory itself is the caller's and must outlive this
// object. Thread-safe (immutable after creation).
class MemoryRegion {
 public:
  ~MemoryRegion();
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;

  void* base() const { return base_; }
  size_t length() const { return length_; }
  MemoryKind kind() const { return kind_; }
  // ucp_rkey_pack output: opaque bytes for KvRegion.rkey.
  const std::string& packed_rkey() const { return packed_rkey_; }

 private:
  friend class internal::WorkerCore;
  MemoryRegion(std::shared_ptr<internal::WorkerCore> core,
               std::shared_ptr<internal::MemoryRegionState> state, void* base, size_t length,
               MemoryKind kind, std::string packed_rkey);

  const std::shared_ptr<internal::WorkerCore> core_;
  const std::shared_ptr<internal::MemoryRegionState> state_;
  void* const base_;
  const size_t length_;
  const MemoryKind kind_;
  const std::string packed_rkey_;
};

// A peer's rkey unpacked against one Endpoint (ucp_ep_rkey_unpack); valid for
// Puts on that endpoint only. Released (asynchronously, on the progress
// thread) when the last reference goes; in-flight Puts hold references.
// Thread-safe.
class RemoteKey {
 public:
  ~RemoteKey();
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;

 private:
  friend class internal::WorkerCore;
  friend class Endpoint;
  RemoteKey(std::shared_ptr<internal::WorkerCore> core,
            std::shared_ptr<internal::RemoteKeyState> state);

  const std::shared_ptr<internal::WorkerCore> core_;
  const std::shared_ptr<internal::RemoteKeyState> state_;
};

// A connection to one peer's worker. Thread-safe. Destroying it closes the
// UCX endpoint in the background and returns at once: operations still
// outstanding complete normally if the peer is alive, else with UNAVAILABLE
// once the failure is seen (keepalive bounds that), so a dead peer never
// hangs anything.
class Endpoint {
 public:
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Unpacks `packed` (a peer MemoryRegion's packed_rkey(), received over the
  // control plane) for Puts on this endpoint. INVALID_ARGUMENT if empty or
  // rejected by UCX; UNAVAILABLE if the endpoint failed or the worker is
  // gone. UCX cannot validate the bytes fully: they must come from
  // ucp_rkey_pack of a peer running the same UCX version.
  absl::StatusOr<std::shared_ptr<RemoteKey>> UnpackRkey(const std::string& packed);

  // Writes `length` bytes from `local` to `remote_address` in the peer's
  // memory registered under `rkey`. Returns at once; `done` runs exactly once
  // on the progress thread when the local buffer may be reused (OK), or with
  // the error: UNAVAILABLE naming the peer if it failed or the endpoint was
  // closed, INVALID_ARGUMENT for a null rkey or one unpacked on another
  // endpoint, INTERNAL for other UCX errors. OK does NOT mean the bytes are
  // visible at the peer: a later Flush that completes OK does.
  // REQUIRES: [local, local + length) stays valid until `done` runs, and
  // [remote_address, remote_address + length) lies in the peer's registered
  // region (UCX does not check it for every transport).
  void Put(const void* local, size_t length, uint64_t remote_address,
           std::shared_ptr<RemoteKey> rkey, DoneCallback done);

  // Sends an active message: `header` (at most a few hundred bytes) and
  // `length` bytes of `data` to the peer's handler for `id`.
  //
  // Eager (the default): the sender pushes every fragment and the receiver
  // only receives, never replying inside UCX. That is the point of messages
  // next to Put: on lanes where UCX emulates RMA (tcp, posix, sysv) the
  // target acknowledges each put from its own progress, and UCX 1.13 aborts
  // the target when the writer dies mid-put; a message sender that dies
  // mid-message costs the receiver only the partial message. The receiver's
  // MessageHandler sees the message once UCX has reassembled it.
  //
  // `rendezvous`: the peer's RendezvousHandler is told of the message first
  // and fetches the data into memory of its choice (IncomingMessage), which
  // saves the receiver a copy of every byte; the sender's buffer must stay
  // put until then, and the receiver asks the sender for the data from
  // inside UCX.
  //
  // `done` runs once on the progress thread when `data` may be reused (OK),
  // or with UNAVAILABLE naming the peer, or INTERNAL. OK does not mean the
  // handler ran or used the data (a rendezvous message the receiver dropped
  // completes OK too): delivery must be confirmed above UCX (e.g. the
  // receiver counting bytes). A message for an id with no handler at the peer is
  // dropped there.
  // REQUIRES: [data, data + length) stays valid until `done` runs.
  void Send(uint16_t id, std::string header, const void* data, size_t length, DoneCallback done,
            bool rendezvous = false);

  // Completes (OK) once every Put posted on this endpoint before it has
  // completed at the peer; UNAVAILABLE naming the peer if it failed first.
  // `done` runs exactly once on the progress thread.
  void Flush(DoneCallback done);

  // Sends the peer's worker a ping and completes (OK) when its answer comes
  // back on this endpoint: UCX's connection setup has then finished on both
  // sides, the peer's included. A flush does not wait for the peer's side:
  // over tcp the peer still has its wireup reply queued on a connection back
  // to us, and UCX 1.13 aborts the peer's process if we die before that
  // reply goes out. Call it once after Connect, before anything whose sender
  // may die mid-way. `done` runs exactly once on the progress thread:
  // UNAVAILABLE naming the peer if the endpoint fails or closes first, or
  // the worker shuts down. A live peer that never answers (not a UcxWorker)
  // leaves it pending until the endpoint closes: bound the wait above it.
  void Handshake(DoneCallback done);

  const std::string& peer_id() const { return peer_id_; }
  // The UCX transport carrying this endpoint's writes, as UCX names it
  // ("tcp", "posix", "sysv", "rc_mlx5", "cuda_ipc", ...): the lane of the
  // endpoint's RMA bandwidth lanes, else of its active-message lane (UCX
  // emulates RMA over it). Best effort: empty if UCX's description could not
  // be parsed.
  const std::string& lane() const { return lane_; }
  // True once the peer was seen to fail or the endpoint was closed.
  bool failed() const;

 private:
  friend class internal::WorkerCore;
  Endpoint(std::shared_ptr<internal::WorkerCore> core,
           std::shared_ptr<internal::EndpointState> state, std::string peer_id, std::string lane);

  const std::shared_ptr<internal::WorkerCore> core_;
  const std::shared_ptr<internal::EndpointState> state_;
  const std::string peer_id_;
  const std::string lane_;
};

// One UCX context and worker with its progress thread. Thread-safe; see the
// file comment. Destroy it from a thread other than its progress thread.
class UcxWorker {
 public:
  // Initializes UCX with `options` and starts the progress thread.
  // FAILED_PRECONDITION naming the UCX call and the transports when UCX
  // cannot start here (e.g. `transports` names none that exist);
  // INVALID_ARGUMENT for a non-positive interval.
  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const UcxOptions& options);

  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // ucp_worker_get_address bytes: TransportEndpoint.ucx_worker_address.
  const std::string& address() const;
  // Whether UCX here handles CUDA device memory (built with CUDA support).
  bool supports_cuda_memory() const;
  const UcxOptions& options() const;

  // Registers [base, base + length) for remote writes. INVALID_ARGUMENT for a
  // null base or zero length; FAILED_PRECONDITION for kCuda when
  // !supports_cuda_memory(); INTERNAL naming the UCX call if UCX refuses;
  // UNAVAILABLE if the worker is shutting down.
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* base, size_t length,
                                                         MemoryKind kind);

  // Creates an endpoint to the worker whose address() is `peer_address`;
  // `peer_id` names the peer in errors and logs. Does not wait for the peer
  // (Endpoint::Handshake does): an unreachable peer shows as failures of the
  // first operations.
  // INVALID_ARGUMENT for an empty address; UNAVAILABLE naming the peer if UCX
  // finds no transport to it or the worker is shutting down.
  absl::StatusOr<std::shared_ptr<Endpoint>> Connect(const std::string& peer_address,
                                                    std::string peer_id);

  // Routes active messages `id` (Endpoint::Send) to `handler`, and those sent
  // by rendezvous to `rendezvous` (null: they are dropped, failing their
  // Send), replacing any earlier handlers of that id. Waits for the progress thread to install it.
  // INVALID_ARGUMENT for kHandshakeMessageId; INTERNAL if UCX refuses;
  // UNAVAILABLE if the worker is shutting down. Must not be called from a
  // MessageHandler.
  absl::Status SetMessageHandler(uint16_t id, MessageHandler handler,
                                 RendezvousHandler rendezvous = nullptr);

  // True on this worker's progress thread (i.e. inside a completion callback).
  bool OnProgressThread() const;

 private:
  explicit UcxWorker(std::shared_ptr<internal::WorkerCore> core);

  const std::shared_ptr<internal::WorkerCore> core_;
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_UCX_WORKER_H_
