#include "common/transport/ucx_lanes.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace trident::transport {

namespace v1 = ::trident::v1;

absl::StatusOr<std::unique_ptr<UcxLanes>> UcxLanes::Create(UcxWorker* main,
                                                           UcxLanesOptions options) {
  if (options.lanes < 1 || options.lanes > kMaxLanes) {
    return absl::InvalidArgumentError(
        absl::StrCat("lanes is ", options.lanes, "; must be 1 to ", kMaxLanes));
  }
  std::unique_ptr<UcxLanes> lanes(new UcxLanes(main, options));
  for (int lane = 1; lane < options.lanes; ++lane) {
    UcxOptions lane_options = main->options();
    lane_options.name = absl::StrCat(lane_options.name, "-lane", lane);
    TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<UcxWorker> worker, UcxWorker::Create(lane_options));
    lanes->own_.push_back(std::move(worker));
  }
  return lanes;
}

UcxLanes::~UcxLanes() {
  {
    absl::MutexLock lock(&mu_);
    endpoints_.clear();
  }
  own_.clear();
}

std::vector<UcxWorker*> UcxLanes::workers() const {
  std::vector<UcxWorker*> workers = {main_};
  for (const auto& worker : own_) workers.push_back(worker.get());
  return workers;
}

void UcxLanes::DescribeAddresses(v1::TransportEndpoint* endpoint) const {
  endpoint->set_ucx_worker_address(main_->address());
  endpoint->clear_lane_worker_addresses();
  for (const auto& worker : own_) endpoint->add_lane_worker_addresses(worker->address());
}

absl::StatusOr<std::vector<std::shared_ptr<Endpoint>>> UcxLanes::EndpointsTo(
    const v1::TransportEndpoint& peer) {
  const auto key = std::make_pair(peer.owner_id(), peer.incarnation());
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(key);
    if (it != endpoints_.end() &&
        std::none_of(it->second.begin(), it->second.end(),
                     [](const auto& endpoint) { return endpoint->failed(); })) {
      return it->second;
    }
  }
  TRIDENT_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<Endpoint>> endpoints, ConnectAll(peer));
  absl::MutexLock lock(&mu_);
  endpoints_[key] = endpoints;
  return endpoints;
}

absl::StatusOr<std::vector<std::shared_ptr<Endpoint>>> UcxLanes::ConnectAll(
    const v1::TransportEndpoint& peer) const {
  const std::vector<UcxWorker*> lanes = workers();
  const size_t n =
      std::min(lanes.size(), 1 + static_cast<size_t>(peer.lane_worker_addresses_size()));
  std::vector<std::shared_ptr<Endpoint>> endpoints;
  for (size_t lane = 0; lane < n; ++lane) {
    TRIDENT_ASSIGN_OR_RETURN(
        std::shared_ptr<Endpoint> endpoint,
        lanes[lane]->Connect(
            lane == 0 ? peer.ucx_worker_address() : peer.lane_worker_addresses(lane - 1),
            lane == 0 ? peer.owner_id() : absl::StrCat(peer.owner_id(), " (lane ", lane, ")")));
    endpoints.push_back(std::move(endpoint));
  }
  struct Answers {
    absl::Mutex mu;
    size_t pending ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto answers = std::make_shared<Answers>();  // Callbacks may outlive a timeout.
  {
    absl::MutexLock lock(&answers->mu);
    answers->pending = endpoints.size();
  }
  for (const auto& endpoint : endpoints) {
    endpoint->Handshake([answers](absl::Status s) {
      absl::MutexLock lock(&answers->mu);
      if (!s.ok() && answers->status.ok()) answers->status = std::move(s);
      --answers->pending;
    });
  }
  absl::MutexLock lock(&answers->mu);
  auto answered = [&answers]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(answers->mu) {
    return answers->pending == 0 || !answers->status.ok();
  };
  if (!answers->mu.AwaitWithTimeout(absl::Condition(&answered), options_.handshake_timeout)) {
    return absl::UnavailableError(absl::StrCat("UCX handshake with ", peer.owner_id(),
                                               " did not finish within ",
                                               absl::FormatDuration(options_.handshake_timeout)));
  }
  TRIDENT_RETURN_IF_ERROR(answers->status);
  return endpoints;
}

}  // namespace trident::transport
