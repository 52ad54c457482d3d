#ifndef TRIDENT_SERVICES_WORKER_WORKER_MEMBERSHIP_H_
#define TRIDENT_SERVICES_WORKER_WORKER_MEMBERSHIP_H_

// What a worker tells the controller (trident.v1.Controller): its
// registration and its heartbeats. WorkerServer feeds these to a
// controller_client::ControllerMember.

#include <cstdint>
#include <string>

#include "common/controller_client/member_address.h"
#include "services/worker/worker_services.h"
#include "trident/v1/controller.pb.h"
#include "trident/v1/generation.pb.h"

namespace trident::worker {

// The fixed facts a registration reports beside the identity.
struct WorkerFacts {
  // "cpu" or "cuda:N".
  std::string device;
  // The model served (ModelInfo's); empty without a model.
  std::string model;
  int32_t kv_blocks_total = 0;
  int32_t kv_block_size_tokens = 0;
  int32_t max_batch_sequences = 0;
  int32_t max_prefill_batch_tokens = 0;
  int32_t max_context_tokens = 0;
};

// A RegisterRequest for the worker `identity` names, in its current role
// (identity.role), reached at `addresses`.
trident::v1::RegisterRequest WorkerRegisterRequest(
    const WorkerIdentity& identity, const WorkerFacts& facts,
    const controller_client::MemberAddresses& addresses);

// Fills a heartbeat from a load sample: the sample itself and its state
// (SERVING, or DRAINING while a role change drains).
void FillWorkerHeartbeat(const trident::v1::WorkerLoad& load,
                         trident::v1::HeartbeatRequest* request);

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_WORKER_MEMBERSHIP_H_
