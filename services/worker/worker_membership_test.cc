#include "services/worker/worker_membership.h"

#include "gtest/gtest.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

TEST(WorkerMembershipTest, RegistrationCarriesIdentityAddressesAndCapacity) {
  WorkerIdentity identity;
  identity.worker_id = "decode-3";
  identity.incarnation = 77;
  identity.role = v1::ROLE_DECODE;
  const WorkerFacts facts{.device = "cuda:1",
                          .model = "llama3-tiny",
                          .kv_blocks_total = 512,
                          .kv_block_size_tokens = 16,
                          .max_batch_sequences = 64,
                          .max_prefill_batch_tokens = 2048,
                          .max_context_tokens = 4096};
  const controller_client::MemberAddresses addresses{.address = "decode-3.pods:50052",
                                                     .metrics_address = "decode-3.pods:9402",
                                                     .node_name = "node-a"};

  const v1::RegisterRequest request = WorkerRegisterRequest(identity, facts, addresses);

  ASSERT_TRUE(request.has_worker());
  const v1::WorkerRegistration& worker = request.worker();
  EXPECT_EQ(worker.worker_id(), "decode-3");
  EXPECT_EQ(worker.incarnation(), 77u);
  EXPECT_EQ(worker.address(), "decode-3.pods:50052");
  EXPECT_EQ(worker.metrics_address(), "decode-3.pods:9402");
  EXPECT_EQ(worker.node_name(), "node-a");
  EXPECT_EQ(worker.device(), "cuda:1");
  EXPECT_EQ(worker.model(), "llama3-tiny");
  EXPECT_EQ(worker.role(), v1::ROLE_DECODE);
  EXPECT_EQ(worker.capacity().kv_blocks_total(), 512);
  EXPECT_EQ(worker.capacity().kv_block_size_tokens(), 16);
  EXPECT_EQ(worker.capacity().max_batch_sequences(), 64);
  EXPECT_EQ(worker.capacity().max_prefill_batch_tokens(), 2048);
  EXPECT_EQ(worker.capacity().max_context_tokens(), 4096);
}

TEST(WorkerMembershipTest, HeartbeatCarriesTheSampleAndItsDrainingState) {
  v1::WorkerLoad load;
  load.set_worker_id("w");
  load.set_running_sequences(3);
  load.set_state(v1::SERVING_STATE_SERVING);
  v1::HeartbeatRequest serving;
  FillWorkerHeartbeat(load, &serving);
  EXPECT_EQ(serving.state(), v1::SERVING_STATE_SERVING);
  EXPECT_EQ(serving.worker_load().running_sequences(), 3);

  load.set_state(v1::SERVING_STATE_DRAINING);
  load.set_pending_role(v1::ROLE_PREFILL);
  v1::HeartbeatRequest draining;
  FillWorkerHeartbeat(load, &draining);
  EXPECT_EQ(draining.state(), v1::SERVING_STATE_DRAINING);
  EXPECT_EQ(draining.worker_load().pending_role(), v1::ROLE_PREFILL);
}

}  // namespace
}  // namespace trident::worker
