#include "services/controller/controller_server.h"

#include <algorithm>
#include <random>
#include <utility>

#include "common/logging/log.h"
#include "services/controller/prometheus/prometheus_client.h"
#include "trident/v1/controller.grpc.pb.h"

namespace trident::controller {
namespace {

uint64_t RandomIncarnation() {
  std::random_device device;
  uint64_t value = 0;
  while (value == 0) value = (static_cast<uint64_t>(device()) << 32) | device();
  return value;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ControllerServer>> ControllerServer::Create(
    ControllerServerOptions options, prometheus::Registry& registry, const Clock* clock) {
  if (options.membership.controller_incarnation == 0) {
    options.membership.controller_incarnation = RandomIncarnation();
  }
  auto server = std::unique_ptr<ControllerServer>(new ControllerServer());
  absl::StatusOr<std::unique_ptr<Membership>> membership =
      Membership::Create(options.membership, clock);
  if (!membership.ok()) return membership.status();
  server->membership_ = std::move(*membership);
  server->decision_interval_ = options.balancer.policy.interval;
  if (!options.balancer.prometheus_url.empty()) {
    absl::StatusOr<std::unique_ptr<PrometheusClient>> client = PrometheusClient::Create(
        {.base_url = options.balancer.prometheus_url, .timeout = options.prometheus_timeout});
    if (!client.ok()) return client.status();
    server->source_ = std::move(*client);
  }
  server->metrics_ = std::make_unique<ControllerMetrics>(registry);
  server->setter_ = std::make_unique<GrpcRoleSetter>();
  absl::StatusOr<std::unique_ptr<RoleBalancer>> balancer = RoleBalancer::Create(
      options.balancer, server->membership_.get(), server->source_.get(), server->setter_.get(),
      server->metrics_.get(), clock);
  if (!balancer.ok()) return balancer.status();
  server->balancer_ = std::move(*balancer);
  server->service_ =
      std::make_unique<ControllerService>(server->membership_.get(), server->balancer_.get());
  TRIDENT_LOG(INFO) << "controller incarnation " << server->incarnation() << "; heartbeats every "
                    << absl::FormatDuration(options.membership.heartbeat_interval)
                    << ", dead after " << absl::FormatDuration(options.membership.dead_after)
                    << "; role decisions every "
                    << absl::FormatDuration(options.balancer.policy.interval) << " from "
                    << (server->source_ ? server->source_->Describe()
                                        : std::string("nothing (no --prometheus_url)"));
  server->loop_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

ControllerServer::~ControllerServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
}

std::vector<RegisteredService> ControllerServer::services() {
  return {{service_.get(), trident::v1::Controller::service_full_name()}};
}

void ControllerServer::Loop() {
  const absl::Duration expire_every = membership_->options().heartbeat_interval;
  const absl::Duration decide_every = decision_interval_;
  absl::Time next_expire = absl::Now() + expire_every;
  absl::Time next_decision = absl::Now() + decide_every;
  absl::MutexLock lock(&mu_);
  while (true) {
    const absl::Time wake = std::min(next_expire, next_decision);
    if (mu_.AwaitWithDeadline(absl::Condition(&stopping_), wake)) return;
    mu_.Unlock();
    const absl::Time now = absl::Now();
    if (now >= next_expire) {
      if (int dead = membership_->ExpireSilent(); dead > 0) {
        TRIDENT_LOG(WARNING) << dead << " member(s) missed their heartbeats for "
                             << absl::FormatDuration(membership_->options().dead_after)
                             << ": marked DEAD";
      }
      metrics_->UpdateMembers(membership_->Snapshot());
      next_expire = now + expire_every;
    }
    if (now >= next_decision) {
      balancer_->RunInterval();
      next_decision = now + decide_every;
    }
    mu_.Lock();
  }
}

}  // namespace trident::controller
