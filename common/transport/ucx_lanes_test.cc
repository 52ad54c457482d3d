// UcxLanes between two sets of lanes in this process over tcp: as many
// endpoints as both sides have lanes, cached per peer incarnation, replaced
// for a new incarnation; the lane count's range.

#include "common/transport/ucx_lanes.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trident/v1/cluster.pb.h"

namespace trident::transport {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

class UcxLanesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto* worker : {&a_, &b_}) {
      auto created = UcxWorker::Create({.transports = "tcp", .name = "lanes"});
      if (!created.ok()) GTEST_SKIP() << created.status();
      *worker = *std::move(created);
    }
  }

  // `lanes`' endpoint as a peer sees it.
  static trident::v1::TransportEndpoint Peer(const UcxLanes& lanes, const std::string& owner,
                                             uint64_t incarnation) {
    trident::v1::TransportEndpoint peer;
    peer.set_owner_id(owner);
    peer.set_incarnation(incarnation);
    lanes.DescribeAddresses(&peer);
    return peer;
  }

  std::unique_ptr<UcxWorker> a_;
  std::unique_ptr<UcxWorker> b_;
};

TEST_F(UcxLanesTest, DescribesEveryLanesAddressMainFirst) {
  auto lanes = UcxLanes::Create(a_.get(), {.lanes = 3});
  ASSERT_THAT(lanes.status(), IsOk());
  const trident::v1::TransportEndpoint peer = Peer(**lanes, "a", 1);

  ASSERT_EQ((*lanes)->size(), 3);
  EXPECT_EQ(peer.ucx_worker_address(), a_->address());
  ASSERT_EQ(peer.lane_worker_addresses_size(), 2);
  const std::vector<UcxWorker*> workers = (*lanes)->workers();
  EXPECT_EQ(workers[0], a_.get());
  EXPECT_EQ(peer.lane_worker_addresses(0), workers[1]->address());
  EXPECT_EQ(peer.lane_worker_addresses(1), workers[2]->address());
  EXPECT_NE(workers[1]->address(), workers[2]->address());
}

TEST_F(UcxLanesTest, ConnectsAsManyLanesAsBothSidesHaveAndCachesThemPerIncarnation) {
  auto sender = UcxLanes::Create(a_.get(), {.lanes = 3});
  auto receiver = UcxLanes::Create(b_.get(), {.lanes = 2});
  ASSERT_THAT(sender.status(), IsOk());
  ASSERT_THAT(receiver.status(), IsOk());

  auto first = (*sender)->EndpointsTo(Peer(**receiver, "b", 1));
  ASSERT_THAT(first.status(), IsOk());
  auto again = (*sender)->EndpointsTo(Peer(**receiver, "b", 1));
  ASSERT_THAT(again.status(), IsOk());
  auto restarted = (*sender)->EndpointsTo(Peer(**receiver, "b", 2));
  ASSERT_THAT(restarted.status(), IsOk());

  ASSERT_EQ(first->size(), 2u);
  EXPECT_EQ(*again, *first);
  ASSERT_EQ(restarted->size(), 2u);
  EXPECT_NE((*restarted)[0], (*first)[0]);
  EXPECT_EQ((*first)[1]->peer_id(), "b (lane 1)");
}

TEST_F(UcxLanesTest, LanesOutsideOneToSixteenAreInvalid) {
  for (int lanes : {0, 17}) {
    EXPECT_THAT(UcxLanes::Create(a_.get(), {.lanes = lanes}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("lanes is ", lanes, "; must be 1 to 16"))));
  }
}

}  // namespace
}  // namespace trident::transport
