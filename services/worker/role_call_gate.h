// The worker's role as the Generation front end's gate: a Generate call is
// colocated work (Capability::kColocated), taken only in role `both`, and
// a role change drains it or ends it (WorkerRole's abort hook).

#ifndef TRIDENT_SERVICES_WORKER_ROLE_CALL_GATE_H_
#define TRIDENT_SERVICES_WORKER_ROLE_CALL_GATE_H_

#include <memory>
#include <utility>

#include "common/frontend/call_gate.h"
#include "services/worker/worker_role.h"

namespace trident::worker {

// Thread-safe. `role` must outlive the gate; tickets may outlive both (a
// Work whose role is gone ends harmlessly).
class RoleCallGate final : public frontend::CallGate {
 public:
  explicit RoleCallGate(WorkerRole* role) : role_(role) {}

  // FAILED_PRECONDITION outside role `both`; UNAVAILABLE while a change
  // drains colocated work away.
  absl::StatusOr<std::unique_ptr<frontend::CallTicket>> Admit(absl::string_view request_id,
                                                              AbortHook abort) override {
    absl::StatusOr<WorkerRole::Work> work =
        role_->Admit(Capability::kColocated, request_id, std::move(abort));
    if (!work.ok()) return work.status();
    return std::make_unique<Ticket>(std::move(*work));
  }

 private:
  class Ticket final : public frontend::CallTicket {
   public:
    explicit Ticket(WorkerRole::Work work) : work_(std::move(work)) {}

   private:
    WorkerRole::Work work_;
  };

  WorkerRole* const role_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_ROLE_CALL_GATE_H_
