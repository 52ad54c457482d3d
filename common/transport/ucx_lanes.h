#ifndef TRIDENT_COMMON_TRANSPORT_UCX_LANES_H_
#define TRIDENT_COMMON_TRANSPORT_UCX_LANES_H_

// The lanes of one data plane over UCX, shared by every protocol on it (the
// KV data plane in kv/; the attention data plane beside it): several
// UcxWorkers, each with a progress thread of its own, that carry the
// protocol's messages side by side, and the endpoints to a peer's lanes,
// connected once per peer incarnation and handshaken before use.
//
//   UcxLanes
//    ├─ lane 0        the given UcxWorker (not owned): the one-sided writes'
//    │                worker (TransportEndpoint.ucx_worker_address)
//    ├─ lanes 1..n-1  workers of its own, with lane 0's options and the
//    │                name "<name>-laneN" (TransportEndpoint.lane_worker_addresses)
//    └─ endpoints     by (peer owner id, incarnation): one per lane both sides
//                     have, lane 0 first; a new incarnation (the peer
//                     restarted) or a failed endpoint gets new ones
//
// Where one UCX worker's copying is the limit (shared memory, tcp), n lanes
// move about n times as much (bench/RESULTS.md). A protocol installs its
// message handlers on every worker() and spreads its sends over the
// endpoints EndpointsTo returns.
//
// Thread-safe. EndpointsTo blocks (connection setup and the handshake): call
// it off the progress threads.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/ucx_worker.h"
#include "trident/v1/cluster.pb.h"

namespace trident::transport {

struct UcxLanesOptions {
  // Lanes, the given worker included: 1 to kMaxLanes.
  int lanes = 1;
  // Longest wait for a peer's answers to the handshakes of EndpointsTo.
  absl::Duration handshake_timeout = absl::Seconds(10);
};

class UcxLanes {
 public:
  static constexpr int kMaxLanes = 16;

  // Lanes on `main` (not owned; must outlive this) and lanes - 1 workers of
  // their own. INVALID_ARGUMENT ("lanes is N; must be 1 to 16") for a lane
  // count out of range; UcxWorker::Create's errors.
  static absl::StatusOr<std::unique_ptr<UcxLanes>> Create(UcxWorker* main,
                                                          UcxLanesOptions options = {});

  // Drops the cached endpoints and destroys the lanes' own workers (see
  // UcxWorker's lifetime rules: endpoints still held elsewhere turn inert).
  // REQUIRES: no handler of a protocol on these workers still uses state
  // destroyed before this.
  ~UcxLanes();

  UcxLanes(const UcxLanes&) = delete;
  UcxLanes& operator=(const UcxLanes&) = delete;

  int size() const { return static_cast<int>(1 + own_.size()); }
  // Every lane's worker, lane 0 (the given one) first.
  std::vector<UcxWorker*> workers() const;
  UcxWorker* main() const { return main_; }

  // Sets `endpoint`'s ucx_worker_address (lane 0) and lane_worker_addresses
  // (the others); leaves its other fields alone.
  void DescribeAddresses(trident::v1::TransportEndpoint* endpoint) const;

  // The endpoints to `peer`'s lanes, as many as both sides have
  // (min(size(), 1 + peer.lane_worker_addresses_size())), lane 0 first,
  // each connected from the lane of the same index and handshaken
  // (Endpoint::Handshake: UCX's connection setup has finished on both
  // sides; over tcp, UCX 1.13.1 aborts the peer if this process dies while
  // the peer's reply to the connection request is still queued). Cached
  // per (owner id, incarnation) until one of them fails. UNAVAILABLE when
  // the peer cannot be reached, fails the handshake or does not answer it
  // within handshake_timeout; UcxWorker::Connect's errors.
  absl::StatusOr<std::vector<std::shared_ptr<Endpoint>>> EndpointsTo(
      const trident::v1::TransportEndpoint& peer) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  UcxLanes(UcxWorker* main, UcxLanesOptions options) : main_(main), options_(options) {}
  // Connects a lane of each side and waits for every handshake.
  absl::StatusOr<std::vector<std::shared_ptr<Endpoint>>> ConnectAll(
      const trident::v1::TransportEndpoint& peer) const;

  UcxWorker* const main_;
  const UcxLanesOptions options_;
  // Lanes 1..n-1; set at Create.
  std::vector<std::unique_ptr<UcxWorker>> own_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::pair<std::string, uint64_t>, std::vector<std::shared_ptr<Endpoint>>>
      endpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_UCX_LANES_H_
