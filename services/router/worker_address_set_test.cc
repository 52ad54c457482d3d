#include "services/router/worker_address_set.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace trident::router {
namespace {

namespace v1 = ::trident::v1;
using Addresses = std::vector<std::string>;

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

void AddWorker(v1::Topology* topology, const std::string& address,
               v1::ServingState state = v1::SERVING_STATE_SERVING) {
  v1::WorkerEntry* entry = topology->add_workers();
  entry->mutable_registration()->set_worker_id(address);
  entry->mutable_registration()->set_address(address);
  entry->set_state(state);
}

v1::Topology Topology(uint64_t incarnation, uint64_t version) {
  v1::Topology topology;
  topology.set_controller_incarnation(incarnation);
  topology.set_version(version);
  return topology;
}

TEST(LiveWorkerAddressesTest, ListsEveryWorkerButTheDeadOnesOnce) {
  v1::Topology topology = Topology(1, 1);
  AddWorker(&topology, "b:1");
  AddWorker(&topology, "a:1", v1::SERVING_STATE_DRAINING);
  AddWorker(&topology, "c:1", v1::SERVING_STATE_DEAD);
  AddWorker(&topology, "b:1");
  AddWorker(&topology, "", v1::SERVING_STATE_SERVING);
  AddWorker(&topology, "d:1", v1::SERVING_STATE_UNSPECIFIED);

  EXPECT_EQ(LiveWorkerAddresses(topology), (Addresses{"a:1", "b:1", "d:1"}));
}

TEST(WorkerAddressSetTest, AlwaysIncludesTheStaticAddresses) {
  WorkerAddressSet set({"static:1", "shared:1"}, absl::Seconds(30));
  EXPECT_EQ(set.addresses(), (Addresses{"shared:1", "static:1"}));
  v1::Topology topology = Topology(1, 1);
  AddWorker(&topology, "shared:1");
  AddWorker(&topology, "dynamic:1");

  EXPECT_EQ(set.Update(topology, kStart), (Addresses{"dynamic:1", "shared:1", "static:1"}));

  EXPECT_EQ(set.Update(Topology(1, 2), kStart), (Addresses{"shared:1", "static:1"}));
}

TEST(WorkerAddressSetTest, FollowsMembershipAndStateWithinOneController) {
  WorkerAddressSet set({}, absl::Seconds(30));
  v1::Topology first = Topology(1, 1);
  AddWorker(&first, "a:1");
  AddWorker(&first, "b:1");
  EXPECT_EQ(set.Update(first, kStart), (Addresses{"a:1", "b:1"}));

  v1::Topology second = Topology(1, 2);
  AddWorker(&second, "a:1");
  AddWorker(&second, "b:1", v1::SERVING_STATE_DEAD);
  EXPECT_EQ(set.Update(second, kStart), (Addresses{"a:1"}));
}

TEST(WorkerAddressSetTest, KeepsTheOldControllersWorkersForTheGraceAfterARestart) {
  WorkerAddressSet set({}, absl::Seconds(30));
  v1::Topology before = Topology(1, 9);
  AddWorker(&before, "a:1");
  AddWorker(&before, "b:1");
  AddWorker(&before, "c:1");
  set.Update(before, kStart);

  // The restarted controller knows nobody yet.
  EXPECT_EQ(set.Update(Topology(2, 1), kStart + absl::Seconds(1)),
            (Addresses{"a:1", "b:1", "c:1"}));
  // a re-registers; b is listed DEAD: decided at once. c is still carried.
  v1::Topology rebuilt = Topology(2, 2);
  AddWorker(&rebuilt, "a:1");
  AddWorker(&rebuilt, "b:1", v1::SERVING_STATE_DEAD);
  EXPECT_EQ(set.Update(rebuilt, kStart + absl::Seconds(2)), (Addresses{"a:1", "c:1"}));

  // After the grace, c (which never came back) leaves with the next update.
  v1::Topology later = Topology(2, 3);
  AddWorker(&later, "a:1");
  EXPECT_EQ(set.Update(later, kStart + absl::Seconds(32)), (Addresses{"a:1"}));
}

}  // namespace
}  // namespace trident::router
