#include "services/worker/worker_membership.h"

namespace trident::worker {

namespace v1 = ::trident::v1;

v1::RegisterRequest WorkerRegisterRequest(const WorkerIdentity& identity, const WorkerFacts& facts,
                                          const controller_client::MemberAddresses& addresses) {
  v1::RegisterRequest request;
  v1::WorkerRegistration* worker = request.mutable_worker();
  worker->set_worker_id(identity.worker_id);
  worker->set_incarnation(identity.incarnation);
  worker->set_address(addresses.address);
  worker->set_metrics_address(addresses.metrics_address);
  worker->set_node_name(addresses.node_name);
  worker->set_device(facts.device);
  worker->set_model(facts.model);
  worker->set_role(identity.role);
  v1::WorkerCapacity* capacity = worker->mutable_capacity();
  capacity->set_kv_blocks_total(facts.kv_blocks_total);
  capacity->set_kv_block_size_tokens(facts.kv_block_size_tokens);
  capacity->set_max_batch_sequences(facts.max_batch_sequences);
  capacity->set_max_prefill_batch_tokens(facts.max_prefill_batch_tokens);
  capacity->set_max_context_tokens(facts.max_context_tokens);
  return request;
}

void FillWorkerHeartbeat(const v1::WorkerLoad& load, v1::HeartbeatRequest* request) {
  request->set_state(load.state() == v1::SERVING_STATE_DRAINING ? v1::SERVING_STATE_DRAINING
                                                                : v1::SERVING_STATE_SERVING);
  *request->mutable_worker_load() = load;
}

}  // namespace trident::worker
