// Which workers the router follows (LoadSubscriber) when a controller
// publishes the topology: the static addresses of its flags, always, plus
// every worker of the last topology that is not DEAD.
//
// After the controller restarts, its first topologies (a new
// controller_incarnation) list only the members that have re-registered so
// far. Workers the old topology listed and the new one does not yet are
// kept for `restart_grace`, so that a restart does not unsubscribe workers
// that are still serving; a new topology listing one of them (in any state)
// decides for it at once. The grace is checked at each Update: a worker
// that never re-registers leaves with the first topology after the grace
// (meanwhile its load stream reports it down, so admission skips it).

#ifndef TRIDENT_SERVICES_ROUTER_WORKER_ADDRESS_SET_H_
#define TRIDENT_SERVICES_ROUTER_WORKER_ADDRESS_SET_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "trident/v1/controller.pb.h"

namespace trident::router {

// The gRPC addresses of the topology's workers that are not DEAD (SERVING,
// DRAINING, or not yet reported), without duplicates or empty ones, sorted.
std::vector<std::string> LiveWorkerAddresses(const trident::v1::Topology& topology);

// Thread-compatible.
class WorkerAddressSet {
 public:
  WorkerAddressSet(std::vector<std::string> static_addresses, absl::Duration restart_grace);

  // Takes the topology `now` and returns the addresses to follow, sorted.
  std::vector<std::string> Update(const trident::v1::Topology& topology, absl::Time now);

  // The addresses to follow as of the last Update (the static ones before
  // any), sorted.
  std::vector<std::string> addresses() const;

 private:
  const std::set<std::string> static_;
  const absl::Duration restart_grace_;
  uint64_t controller_incarnation_ = 0;
  // The last topology's live workers.
  std::set<std::string> current_;
  // Workers of a previous controller incarnation kept until carried_until_.
  std::set<std::string> carried_;
  absl::Time carried_until_ = absl::InfinitePast();
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_WORKER_ADDRESS_SET_H_
