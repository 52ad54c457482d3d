// The attention service's side of the attention data plane over UCX
// (attention_wire.h): takes per-layer requests on every lane of its
// UcxLanes, computes each with an AttentionComputer on one dispatcher
// thread, in arrival order, and sends the reply back on the lane the
// request came from.
//
//   lane progress threads ── copy the message ──> queue ──> dispatcher thread
//                                                           decode, Compute,
//                                                           reply (Send)
//
// A request is answered exactly once: with o, or with the error (a
// malformed message: INVALID_ARGUMENT; the computer's status otherwise). A
// request from an owner with no route (AddPeer not called, or removed) can
// not be answered and is counted as dropped; so is one whose header cannot
// be read at all.
//
// Thread-safe.

#ifndef TRIDENT_COMMON_TRANSPORT_ATTENTION_UCX_ATTENTION_SERVER_H_
#define TRIDENT_COMMON_TRANSPORT_ATTENTION_UCX_ATTENTION_SERVER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/attention/attention_wire.h"
#include "common/transport/attention/message_buffers.h"
#include "common/transport/ucx_lanes.h"
#include "trident/v1/cluster.pb.h"

namespace trident::transport::attention {

// Computes requests. Called on the dispatcher thread only.
class AttentionComputer {
 public:
  virtual ~AttentionComputer() = default;
  // Writes o of every sequence of `request`, in its order, into
  // `reply_rows` (num_sequences x num_q_heads x head_dim elements of the
  // request's wire dtype). An error goes back to the requester as is.
  virtual absl::Status Compute(const RequestView& request, char* reply_rows) = 0;

  // Block-store requests (attention_wire.h, kBlocks). A put stores
  // request.rows (request.block_bytes bytes); a get's reply holds
  // BlockGetBytes(request) bytes, which ServeBlocks writes into `reply`.
  // Unless overridden: UNIMPLEMENTED (this computer has no block store).
  virtual absl::StatusOr<size_t> BlockGetBytes(const RequestView& request) {
    (void)request;
    return absl::UnimplementedError("this attention service has no block store");
  }
  virtual absl::Status ServeBlocks(const RequestView& request, char* reply) {
    (void)request;
    (void)reply;
    return absl::UnimplementedError("this attention service has no block store");
  }
};

// Counters since start.
struct AttentionServerCounters {
  int64_t requests = 0;      // Answered with o.
  int64_t errors = 0;        // Answered with an error (bad messages included).
  int64_t bad_messages = 0;  // Malformed: answered INVALID_ARGUMENT, or dropped.
  int64_t dropped = 0;       // Not answerable (unreadable, or no route).
  int64_t sequences = 0;     // Sequences of the requests answered with o.
  int64_t bytes_in = 0;      // Request data received.
  int64_t rendezvous = 0;    // Requests fetched by rendezvous (large ones).
  int64_t bytes_out = 0;     // Reply data sent.
};

// What the dispatcher saw of one request, for metrics.
struct AttentionRequestRecord {
  int32_t layer = 0;
  int32_t num_sequences = 0;
  absl::Duration queued;     // Arrival to the start of Compute.
  absl::Duration compute;    // Compute itself.
  bool append_only = false;  // kAppendOnly: k/v stored, no attention.
  // kBlocks: a block-store put (append_only) or get; `compute` is the
  // store's copy.
  bool blocks = false;
  absl::Status status;
};

// Which of the queued jobs (oldest first; each with background() and
// `arrived`) a dispatcher serves next: the oldest, unless it is background
// work (a block-store put) that arrived less than `max_delay` before `now`
// and a job that waits for an answer is queued behind it, which then goes
// first. REQUIRES: queue is not empty.
template <typename Queue>
size_t NextJobIndex(const Queue& queue, absl::Time now, absl::Duration max_delay) {
  const auto& oldest = *queue.begin();
  if (!oldest->background() || now - oldest->arrived >= max_delay) return 0;
  size_t i = 0;
  for (const auto& job : queue) {
    if (!job->background()) return i;
    ++i;
  }
  return 0;
}

struct UcxAttentionServerOptions {
  // Called on the dispatcher thread after each request is answered (may be
  // null). Must be quick.
  std::function<void(const AttentionRequestRecord&)> on_request;
};

class UcxAttentionServer {
 public:
  // Installs the request handler on every lane of `lanes` and starts the
  // dispatcher. `lanes` and `computer` are not owned and must outlive the
  // server.
  static absl::StatusOr<std::unique_ptr<UcxAttentionServer>> Create(
      UcxLanes* lanes, AttentionComputer* computer, UcxAttentionServerOptions options = {});
  // Stops taking requests, drops those queued (their requesters time out or
  // see this process gone) and joins the dispatcher.
  ~UcxAttentionServer();

  UcxAttentionServer(const UcxAttentionServer&) = delete;
  UcxAttentionServer& operator=(const UcxAttentionServer&) = delete;

  // Routes replies for the owner of `client` (ConnectRequest.client): connects
  // to its lanes (blocking: UcxLanes::EndpointsTo and its errors). Replaces
  // an earlier route of the same owner id.
  absl::Status AddPeer(const trident::v1::TransportEndpoint& client) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the route of `incarnation`, if any.
  void RemovePeer(uint64_t incarnation) ABSL_LOCKS_EXCLUDED(mu_);
  // Probes every route's owner (Endpoint::Handshake on its first lane) and
  // counts as failed one whose last probe has gone unanswered for
  // `timeout`: over shared memory UCX 1.13 may never see a peer process
  // die, and an owner that holds sequences here must not hold them forever.
  // Call periodically (the service's housekeeping); `now` from its clock.
  void ProbePeers(absl::Time now, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // The (owner id, incarnation) of routes whose endpoints have failed (the
  // peer died or is unreachable) or whose probe timed out, each reported
  // once.
  std::vector<std::pair<std::string, uint64_t>> TakeFailedPeers() ABSL_LOCKS_EXCLUDED(mu_);

  AttentionServerCounters counters() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::string header;
    std::vector<uint64_t> data;  // 8-byte aligned copy of the message data.
    size_t data_bytes = 0;
    absl::Time arrived;
    // A block-store put (kBlocks | kAppendOnly): background work, served
    // after what waits for an answer (NextJob). Set when queued.
    bool is_background = false;
    bool background() const { return is_background; }
  };
  // Whether a request header names background work (Job::is_background).
  static bool IsBackground(absl::string_view header);
  // How long a put may be passed over by other requests.
  static constexpr absl::Duration kBackgroundMaxDelay = absl::Milliseconds(20);
  struct Probe {
    absl::Time sent;
    std::atomic<bool> answered{false};
  };
  struct Route {
    std::string owner_id;
    std::vector<std::shared_ptr<Endpoint>> endpoints;
    bool reported_failed = false;
    bool probe_timed_out = false;
    std::shared_ptr<Probe> probe;  // The last one sent; null before the first.
  };

  UcxAttentionServer(UcxLanes* lanes, AttentionComputer* computer,
                     UcxAttentionServerOptions options)
      : lanes_(lanes), computer_(computer), options_(std::move(options)) {}
  void OnRequest(absl::string_view header, absl::string_view data) ABSL_LOCKS_EXCLUDED(mu_);
  // A large request sent by rendezvous: fetched straight into a job's
  // buffer, then queued as OnRequest's are.
  void OnRendezvous(absl::string_view header, std::unique_ptr<IncomingMessage> message)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A spare job or a new one.
  std::unique_ptr<Job> TakeJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The queued job to serve next: the oldest, unless it is background work
  // younger than kBackgroundMaxDelay and a request that waits for an answer
  // (attention, a block get) is queued behind it.
  std::unique_ptr<Job> NextJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DispatchLoop();
  void Serve(Job& job);
  // Serve's part for a block-store request, once decoded.
  void ServeBlocks(const RequestView& request, absl::Time arrived);
  // Sends `reply`'s error or its data; counts it. Whoever has no route is
  // counted as dropped.
  void Answer(const RequestHeader& h, ReplyHeader reply, const absl::Status& status,
              std::shared_ptr<uint64_t[]> data, size_t data_bytes, int32_t sequences)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The endpoint of the route of `incarnation` on `lane`; null if none.
  std::shared_ptr<Endpoint> RouteTo(uint64_t incarnation, int32_t lane) ABSL_LOCKS_EXCLUDED(mu_);
  // Sends a reply (the data is kept alive until UCX is done with it).
  static void SendReply(Endpoint& endpoint, std::string header, std::shared_ptr<uint64_t[]> data,
                        size_t data_bytes);

  UcxLanes* const lanes_;
  AttentionComputer* const computer_;
  const UcxAttentionServerOptions options_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::unique_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  // Rendezvous fetches under way (the destructor waits for them).
  int32_t receiving_ ABSL_GUARDED_BY(mu_) = 0;
  // Spare jobs, to keep their buffers.
  std::vector<std::unique_ptr<Job>> spare_ ABSL_GUARDED_BY(mu_);
  // Reply rows, reused once each reply is sent.
  MessageBuffers reply_buffers_;
  absl::flat_hash_map<uint64_t, Route> routes_ ABSL_GUARDED_BY(mu_);
  AttentionServerCounters counters_ ABSL_GUARDED_BY(mu_);
  std::thread dispatcher_;
};

}  // namespace trident::transport::attention

#endif  // TRIDENT_COMMON_TRANSPORT_ATTENTION_UCX_ATTENTION_SERVER_H_
