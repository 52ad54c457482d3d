#include "common/transport/ucx_worker.h"

#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/logging/log.h"
#include "common/transport/ucx_worker_core.h"

namespace trident::transport {
namespace {

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

}  // namespace

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
