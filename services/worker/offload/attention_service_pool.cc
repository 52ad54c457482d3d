#include "services/worker/offload/attention_service_pool.h"

#include <algorithm>
#include <utility>

#include "common/grpc/async_unary.h"
#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "services/worker/offload/attention_session.h"

namespace trident::worker {
namespace {

// Keys an AdmitSequenceRequest may carry (the block store's limit).
constexpr size_t kMaxPrefixKeys = 4096;

namespace v1 = ::trident::v1;

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttentionServicePool>> AttentionServicePool::Create(
    AttentionServicePoolOptions options, transport::UcxWorker* ucx) {
  if (options.services.empty()) {
    return absl::InvalidArgumentError("no attention services given");
  }
  auto pool = std::unique_ptr<AttentionServicePool>(new AttentionServicePool(std::move(options)));
  TRIDENT_RETURN_IF_ERROR(pool->Start(ucx));
  return pool;
}

absl::Status AttentionServicePool::Start(transport::UcxWorker* ucx) {
  TRIDENT_ASSIGN_OR_RETURN(lanes_,
                           transport::UcxLanes::Create(ucx, {.lanes = std::max(1, options_.lanes)}));
  TRIDENT_ASSIGN_OR_RETURN(client_, transport::attention::UcxAttentionClient::Create(
                                        lanes_.get(), options_.incarnation));
  endpoint_.set_owner_id(options_.worker_id);
  endpoint_.set_incarnation(options_.incarnation);
  endpoint_.set_memory_type(v1::MEMORY_TYPE_HOST);
  lanes_->DescribeAddresses(&endpoint_);
  {
    absl::MutexLock lock(&mu_);
    states_.resize(options_.services.size());
  }
  for (const std::string& address : options_.services) {
    auto service = std::make_unique<Service>();
    service->address = address;
    service->stub = v1::Attention::NewStub(CreateClusterChannel(address));
    services_.push_back(std::move(service));
  }
  for (const auto& service : services_) {
    absl::Status connected = Connect(*service);
    if (!connected.ok()) {
      TRIDENT_LOG(WARNING) << "attention service " << service->address
                           << " not reachable yet (retrying): " << connected;
    }
  }
  housekeeping_ = std::thread([this] { HousekeepingLoop(); });
  return absl::OkStatus();
}

AttentionServicePool::~AttentionServicePool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (housekeeping_.joinable()) housekeeping_.join();
}

AttentionServicePool::State& AttentionServicePool::state(const Service& service) {
  for (size_t i = 0; i < services_.size(); ++i) {
    if (services_[i].get() == &service) return states_[i];
  }
  TRIDENT_LOG(FATAL) << "a service not of this pool";
  return states_.front();
}

const AttentionServicePool::State& AttentionServicePool::state(const Service& service) const {
  return const_cast<AttentionServicePool*>(this)->state(service);
}

std::vector<AttentionServicePool::Service*> AttentionServicePool::services() const {
  std::vector<Service*> all;
  for (const auto& service : services_) all.push_back(service.get());
  return all;
}

bool AttentionServicePool::connected(const Service& service) const {
  absl::MutexLock lock(&mu_);
  return state(service).connected;
}

transport::attention::RemoteAttention* AttentionServicePool::channel(
    const Service& service) const {
  absl::MutexLock lock(&mu_);
  return state(service).channel.get();
}

std::string AttentionServicePool::service_id(const Service& service) const {
  absl::MutexLock lock(&mu_);
  return state(service).service_id;
}

absl::Status AttentionServicePool::Connect(Service& service) {
  absl::StatusOr<AttentionSession> session =
      OpenAttentionSession(*service.stub, endpoint_, *client_, options_.rpc_timeout);
  absl::MutexLock lock(&mu_);
  State& s = state(service);
  if (!session.ok()) {
    s.connected = false;
    s.next_attempt = absl::Now() + options_.reconnect_interval;
    return session.status();
  }
  const v1::ConnectResponse& response = session->response;
  // The old channel stays: sequences still named by the engine may point at
  // it until their step fails and they come back.
  if (s.channel != nullptr) retired_.push_back(std::move(s.channel));
  s.channel = std::move(session->channel);
  s.service_id = response.server().owner_id();
  s.connected = true;
  s.sequences = 0;
  TRIDENT_LOG(INFO) << "connected to attention service " << s.service_id << " at "
                    << service.address << " (NUMA node " << response.numa_node() << ", "
                    << v1::Isa_Name(response.isa()) << ")";
  return absl::OkStatus();
}

AttentionServicePool::Service* AttentionServicePool::PickService() {
  absl::MutexLock lock(&mu_);
  Service* best = nullptr;
  int32_t fewest = 0;
  for (size_t i = 0; i < services_.size(); ++i) {
    if (!states_[i].connected) continue;
    if (best == nullptr || states_[i].sequences < fewest) {
      best = services_[i].get();
      fewest = states_[i].sequences;
    }
  }
  return best;
}

void AttentionServicePool::CountSequence(Service& service, int delta) {
  absl::MutexLock lock(&mu_);
  State& s = state(service);
  s.sequences = std::max(0, s.sequences + delta);
}

void AttentionServicePool::NoteFailure(Service& service, const absl::Status& status) {
  if (!absl::IsUnavailable(status) && !absl::IsDeadlineExceeded(status)) return;
  absl::MutexLock lock(&mu_);
  State& s = state(service);
  s.connected = false;
  s.next_attempt = absl::Now() + options_.reconnect_interval;
}

v1::AdmitSequenceRequest AttentionServicePool::AdmitRequest(const std::string& id, int32_t capacity,
                                                            const kv::KvCacheSpec& spec,
                                                            int32_t num_q_heads,
                                                            AdmitPrefix prefix) const {
  v1::AdmitSequenceRequest request;
  request.set_owner_id(options_.worker_id);
  request.set_owner_incarnation(options_.incarnation);
  request.set_sequence_id(id);
  request.set_num_layers(spec.num_layers);
  request.set_num_attention_heads(num_q_heads);
  request.set_num_kv_heads(spec.num_kv_heads);
  request.set_head_dim(spec.head_dim);
  request.set_dtype(kv::ToProtoDType(spec.dtype));
  request.set_capacity_tokens(capacity);
  // Block size and element order are the service's choice (bf16: the VNNI
  // pairs its kernel reads fastest); the worker only appends through it.
  if (prefix.format != nullptr && !prefix.keys.empty()) {
    *request.mutable_prefix_format() = *prefix.format;
    const size_t keys = std::min<size_t>(prefix.keys.size(), kMaxPrefixKeys);
    for (size_t i = 0; i < keys; ++i) {
      request.add_prefix_key_hi(prefix.keys[i].hi);
      request.add_prefix_key_lo(prefix.keys[i].lo);
    }
  }
  return request;
}

absl::StatusOr<v1::AdmitSequenceResponse> AttentionServicePool::Admit(
    Service& service, const std::string& id, int32_t capacity, const kv::KvCacheSpec& spec,
    int32_t num_q_heads, AdmitPrefix prefix) {
  const v1::AdmitSequenceRequest request = AdmitRequest(id, capacity, spec, num_q_heads, prefix);
  v1::AdmitSequenceResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options_.rpc_timeout);
  TRIDENT_RETURN_IF_ERROR(
      FromGrpcStatus(service.stub->AdmitSequence(&context, request, &response)));
  return response;
}

void AttentionServicePool::AdmitAsync(Service& service, const std::string& id, int32_t capacity,
                                      const kv::KvCacheSpec& spec, int32_t num_q_heads,
                                      AdmitPrefix prefix,
                                      UnaryDone<v1::AdmitSequenceResponse> done) {
  CallUnaryAsync<v1::AdmitSequenceResponse>(
      AdmitRequest(id, capacity, spec, num_q_heads, prefix), options_.rpc_timeout,
      [stub = service.stub.get()](
          grpc::ClientContext* context, const v1::AdmitSequenceRequest* request,
          v1::AdmitSequenceResponse* response, std::function<void(grpc::Status)> on_done) {
        stub->async()->AdmitSequence(context, request, response, std::move(on_done));
      },
      std::move(done));
}

absl::Status AttentionServicePool::ReleaseAt(Service& service, uint64_t handle) {
  v1::ReleaseSequenceRequest request;
  request.set_owner_id(options_.worker_id);
  request.set_owner_incarnation(options_.incarnation);
  request.set_handle(handle);
  v1::ReleaseSequenceResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options_.rpc_timeout);
  return FromGrpcStatus(service.stub->ReleaseSequence(&context, request, &response));
}

void AttentionServicePool::QueueRelease(Service& service, uint64_t handle) {
  absl::MutexLock lock(&mu_);
  releases_.push_back(Release{&service, handle});
}

bool AttentionServicePool::QueueReleaseOf(const transport::attention::RemoteAttention* channel,
                                          uint64_t handle) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < services_.size(); ++i) {
    if (states_[i].channel.get() != channel) continue;
    states_[i].sequences = std::max(0, states_[i].sequences - 1);
    releases_.push_back(Release{services_[i].get(), handle});
    return true;
  }
  return false;
}

void AttentionServicePool::HousekeepingLoop() {
  while (true) {
    std::deque<Release> releases;
    std::vector<Service*> reconnect;
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(
          absl::Condition(
              +[](AttentionServicePool* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
                return self->stopping_ || !self->releases_.empty();
              },
              this),
          absl::Milliseconds(200));
      if (stopping_) return;
      releases.swap(releases_);
      const absl::Time now = absl::Now();
      for (size_t i = 0; i < services_.size(); ++i) {
        if (!states_[i].connected && states_[i].next_attempt <= now) {
          reconnect.push_back(services_[i].get());
        }
      }
    }
    for (const Release& release : releases) {
      // A service that cannot be reached frees it with this worker's session.
      ReleaseAt(*release.service, release.handle).IgnoreError();
    }
    for (Service* service : reconnect) Connect(*service).IgnoreError();
  }
}

}  // namespace trident::worker
