#include "services/worker/kv_handoff/lease_keeper.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "common/time/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::KvDestination Destination(uint64_t reservation, absl::Duration lease) {
  v1::KvDestination d;
  d.set_reservation_id(reservation);
  d.set_decode_worker_id("decode-0");
  d.set_decode_address("127.0.0.1:1");
  SetProtoDuration(lease, d.mutable_lease_remaining());
  return d;
}

// A decode worker's side of RenewKv: grants what is asked, or fails with
// the status set for a reservation.
class FakeDecode {
 public:
  absl::StatusOr<absl::Duration> Renew(const v1::KvDestination& d, absl::Duration lease) {
    calls.push_back(d.reservation_id());
    lease_asked = lease;
    if (auto it = failures.find(d.reservation_id()); it != failures.end()) return it->second;
    return lease - latency;
  }

  std::vector<uint64_t> calls;
  absl::Duration lease_asked;
  absl::Duration latency = absl::ZeroDuration();
  absl::flat_hash_map<uint64_t, absl::Status> failures;
};

class LeaseKeeperTest : public ::testing::Test {
 protected:
  FakeClock clock_{absl::FromUnixSeconds(1'700'000'000)};
  FakeDecode decode_;
  LeaseKeeper keeper_{&clock_, [this](const v1::KvDestination& d, absl::Duration lease) {
                        return decode_.Renew(d, lease);
                      }};
};

TEST_F(LeaseKeeperTest, RenewsOnceLessThanHalfIsLeftForTheOriginalLength) {
  const absl::Time start = clock_.Now();
  const uint64_t key = keeper_.Add(Destination(7, absl::Seconds(30)), nullptr);
  EXPECT_EQ(keeper_.LeaseEnd(key), start + absl::Seconds(30));
  clock_.Advance(absl::Seconds(14));
  EXPECT_EQ(keeper_.RenewDue(), 0);  // 16 s of 30 left: not due.
  EXPECT_TRUE(decode_.calls.empty());
  clock_.Advance(absl::Seconds(2));
  decode_.latency = absl::Milliseconds(5);  // Granted from the reply, 5 ms after the request.
  EXPECT_EQ(keeper_.RenewDue(), 1);
  EXPECT_THAT(decode_.calls, ElementsAre(7));
  EXPECT_EQ(decode_.lease_asked, absl::Seconds(30));
  // Counted from when the renewal was sent, so never later than the decode
  // worker's own end.
  EXPECT_EQ(keeper_.LeaseEnd(key),
            start + absl::Seconds(16) + absl::Seconds(30) - absl::Milliseconds(5));
  // Far past the original lease, still kept while renewed.
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(absl::Seconds(16));
    EXPECT_EQ(keeper_.RenewDue(), 1);
  }
  EXPECT_GT(keeper_.LeaseEnd(key), clock_.Now() + absl::Seconds(14));
}

TEST_F(LeaseKeeperTest, ARemovedLeaseIsNeitherRenewedNorKnown) {
  const uint64_t key = keeper_.Add(Destination(7, absl::Seconds(30)), nullptr);
  EXPECT_EQ(keeper_.size(), 1);
  keeper_.Remove(key);
  keeper_.Remove(key);  // No-op.
  EXPECT_EQ(keeper_.size(), 0);
  clock_.Advance(absl::Seconds(29));
  EXPECT_EQ(keeper_.RenewDue(), 0);
  EXPECT_TRUE(decode_.calls.empty());
  EXPECT_EQ(keeper_.LeaseEnd(key), absl::InfinitePast());
}

TEST_F(LeaseKeeperTest, AGoneReservationCallsLostOnceWithAbortedNamingTheDecodeWorker) {
  std::vector<absl::Status> lost;
  const uint64_t gone = keeper_.Add(Destination(7, absl::Seconds(30)),
                                    [&](const absl::Status& s) { lost.push_back(s); });
  const uint64_t restarted = keeper_.Add(Destination(8, absl::Seconds(30)),
                                         [&](const absl::Status& s) { lost.push_back(s); });
  const uint64_t kept = keeper_.Add(Destination(9, absl::Seconds(30)), nullptr);
  decode_.failures[7] = absl::NotFoundError("reservation 7 is unknown or its lease ended");
  decode_.failures[8] = absl::FailedPreconditionError("stale incarnation");
  clock_.Advance(absl::Seconds(20));
  EXPECT_EQ(keeper_.RenewDue(), 1);
  ASSERT_EQ(lost.size(), 2u);
  for (const absl::Status& s : lost) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
    EXPECT_THAT(s.message(), HasSubstr("decode worker decode-0 at 127.0.0.1:1"));
  }
  EXPECT_EQ(keeper_.LeaseEnd(gone), absl::InfinitePast());
  EXPECT_EQ(keeper_.LeaseEnd(restarted), absl::InfinitePast());
  EXPECT_EQ(keeper_.size(), 1);
  EXPECT_GT(keeper_.LeaseEnd(kept), clock_.Now());
  // Not renewed again, not lost again.
  clock_.Advance(absl::Seconds(20));
  decode_.calls.clear();
  keeper_.RenewDue();
  EXPECT_THAT(decode_.calls, ElementsAre(9));
  EXPECT_EQ(lost.size(), 2u);
}

TEST_F(LeaseKeeperTest, AnUnreachableDecodeWorkerIsRetriedAndTheLeaseEndStays) {
  const absl::Time start = clock_.Now();
  bool lost = false;
  const uint64_t key =
      keeper_.Add(Destination(7, absl::Seconds(30)), [&](const absl::Status&) { lost = true; });
  decode_.failures[7] = absl::UnavailableError("connection refused");
  clock_.Advance(absl::Seconds(20));
  EXPECT_EQ(keeper_.RenewDue(), 0);
  EXPECT_FALSE(lost);
  EXPECT_EQ(keeper_.LeaseEnd(key), start + absl::Seconds(30));
  decode_.failures.clear();
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(keeper_.RenewDue(), 1);
  EXPECT_EQ(keeper_.LeaseEnd(key), start + absl::Seconds(21) + absl::Seconds(30));
}

}  // namespace
}  // namespace trident::worker
