// The worker's KV transport over UCX (common/transport): the decode side
// exports its KV pool (one registered region covering every layer, its rkey
// and the UCX worker's address, in each ReserveKv reply); the prefill side
// connects to a destination's endpoint (one endpoint per peer incarnation,
// reused) and writes layers with transport::KvWriter.

#ifndef TRIDENT_SERVICES_WORKER_UCX_KV_H_
#define TRIDENT_SERVICES_WORKER_UCX_KV_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/model_backend.h"
#include "common/transport/ucx_worker.h"
#include "services/worker/decode_service.h"
#include "services/worker/kv_sender.h"

namespace trident::worker {

// Thread-safe.
class UcxKv final : public KvExporter, public KvSender {
 public:
  // Registers `memory` (the backend's KV pool) with `ucx`, which must outlive
  // this. FAILED_PRECONDITION for device memory when UCX lacks CUDA support
  // (staging through host buffers is not built yet).
  static absl::StatusOr<std::unique_ptr<UcxKv>> Create(transport::UcxWorker* ucx,
                                                       const backend::KvMemory& memory,
                                                       std::string owner_id, uint64_t incarnation);

  // KvExporter.
  absl::Status Describe(trident::v1::KvDestination* destination) const override;
  void AcceptMessagesFor(KvReservations* reservations) override;

  ~UcxKv() override;

  // KV messages dropped: late ones of ended transfers, or invalid ones.
  int64_t dropped_messages() const { return dropped_messages_.load(); }

  // KvSender.
  int32_t num_layers() const override { return memory_.spec.num_layers; }
  absl::StatusOr<std::unique_ptr<KvTransfer>> Open(
      const trident::v1::KvDestination& destination) override;

 private:
  // The handler of KV messages (progress thread).
  void OnMessage(absl::string_view header, absl::string_view data);

  UcxKv(transport::UcxWorker* ucx, const backend::KvMemory& memory, std::string owner_id,
        uint64_t incarnation, std::unique_ptr<transport::MemoryRegion> region)
      : ucx_(ucx),
        memory_(memory),
        owner_id_(std::move(owner_id)),
        incarnation_(incarnation),
        region_(std::move(region)) {}

  transport::UcxWorker* const ucx_;
  const backend::KvMemory memory_;
  const std::string owner_id_;
  const uint64_t incarnation_;
  const std::unique_ptr<transport::MemoryRegion> region_;
  // Where KV messages go; held (shared) while one is copied in.
  absl::Mutex sink_mu_;
  KvReservations* sink_ ABSL_GUARDED_BY(sink_mu_) = nullptr;
  std::atomic<int64_t> dropped_messages_{0};
  absl::Mutex mu_;
  // Endpoints by (owner id, incarnation): a new incarnation gets a new one.
  absl::flat_hash_map<std::pair<std::string, uint64_t>, std::shared_ptr<transport::Endpoint>>
      endpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_UCX_KV_H_
