#include "services/attention/attention_membership.h"

#include "gtest/gtest.h"

namespace trident::attention {
namespace {

namespace v1 = ::trident::v1;

TEST(AttentionMembershipTest, RegistrationCarriesWhatTheServiceIs) {
  const AttentionFacts facts{.service_id = "attention-1",
                             .incarnation = 9,
                             .numa_node = 1,
                             .isa = v1::ISA_AVX512_BF16,
                             .threads = 24,
                             .capacity_bytes = int64_t{64} << 30};
  const controller_client::MemberAddresses addresses{.address = "attention-1.pods:50053",
                                                     .metrics_address = "attention-1.pods:9403",
                                                     .node_name = "cpu-node"};

  const v1::RegisterRequest request = AttentionRegisterRequest(facts, addresses);

  ASSERT_TRUE(request.has_attention());
  const v1::AttentionRegistration& attention = request.attention();
  EXPECT_EQ(attention.service_id(), "attention-1");
  EXPECT_EQ(attention.incarnation(), 9u);
  EXPECT_EQ(attention.address(), "attention-1.pods:50053");
  EXPECT_EQ(attention.metrics_address(), "attention-1.pods:9403");
  EXPECT_EQ(attention.node_name(), "cpu-node");
  EXPECT_EQ(attention.numa_node(), 1);
  EXPECT_EQ(attention.isa(), "AVX512_BF16");
  EXPECT_EQ(attention.threads(), 24);
  EXPECT_EQ(attention.capacity_bytes(), int64_t{64} << 30);
}

TEST(AttentionMembershipTest, HeartbeatCarriesTheStoresLoad) {
  SequenceStoreStats stats;
  stats.sequences = 3;
  stats.held_bytes = 1000;
  stats.capacity_bytes = 4000;
  v1::HeartbeatRequest request;

  FillAttentionHeartbeat(stats, &request);

  EXPECT_EQ(request.state(), v1::SERVING_STATE_SERVING);
  ASSERT_TRUE(request.has_attention_load());
  EXPECT_EQ(request.attention_load().sequences(), 3);
  EXPECT_EQ(request.attention_load().held_bytes(), 1000);
  EXPECT_EQ(request.attention_load().capacity_bytes(), 4000);
  EXPECT_EQ(request.attention_load().busy_ratio(), 0);
}

}  // namespace
}  // namespace trident::attention
