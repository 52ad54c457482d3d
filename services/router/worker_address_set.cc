#include "services/router/worker_address_set.h"

#include <utility>

namespace trident::router {

namespace v1 = ::trident::v1;

std::vector<std::string> LiveWorkerAddresses(const v1::Topology& topology) {
  std::set<std::string> live;
  for (const v1::WorkerEntry& entry : topology.workers()) {
    if (entry.state() == v1::SERVING_STATE_DEAD) continue;
    if (entry.registration().address().empty()) continue;
    live.insert(entry.registration().address());
  }
  return {live.begin(), live.end()};
}

WorkerAddressSet::WorkerAddressSet(std::vector<std::string> static_addresses,
                                   absl::Duration restart_grace)
    : static_(static_addresses.begin(), static_addresses.end()), restart_grace_(restart_grace) {}

std::vector<std::string> WorkerAddressSet::Update(const v1::Topology& topology, absl::Time now) {
  if (controller_incarnation_ != 0 &&
      topology.controller_incarnation() != controller_incarnation_) {
    // A new controller: what the old one listed stays for the grace.
    if (now >= carried_until_) carried_.clear();
    carried_.insert(current_.begin(), current_.end());
    carried_until_ = now + restart_grace_;
  }
  controller_incarnation_ = topology.controller_incarnation();
  const std::vector<std::string> live = LiveWorkerAddresses(topology);
  current_ = std::set<std::string>(live.begin(), live.end());
  if (now >= carried_until_) {
    carried_.clear();
  } else {
    // The new topology decides for every worker it lists.
    for (const v1::WorkerEntry& entry : topology.workers()) {
      carried_.erase(entry.registration().address());
    }
  }
  return addresses();
}

std::vector<std::string> WorkerAddressSet::addresses() const {
  std::set<std::string> all = static_;
  all.insert(current_.begin(), current_.end());
  all.insert(carried_.begin(), carried_.end());
  return {all.begin(), all.end()};
}

}  // namespace trident::router
