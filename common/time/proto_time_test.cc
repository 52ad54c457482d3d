#include "common/time/proto_time.h"

#include "gtest/gtest.h"

namespace trident {
namespace {

TEST(ProtoTimeTest, DurationsRoundTripWithOneSign) {
  for (absl::Duration d : {absl::ZeroDuration(), absl::Milliseconds(1500), absl::Nanoseconds(7),
                           -absl::Milliseconds(1500), absl::Hours(30)}) {
    google::protobuf::Duration p;
    SetProtoDuration(d, &p);
    EXPECT_EQ(DurationFromProto(p), d);
    EXPECT_FALSE(p.seconds() > 0 && p.nanos() < 0);
    EXPECT_FALSE(p.seconds() < 0 && p.nanos() > 0);
    EXPECT_LT(p.nanos(), 1'000'000'000);
  }
  google::protobuf::Duration p;
  SetProtoDuration(absl::Milliseconds(1500), &p);
  EXPECT_EQ(p.seconds(), 1);
  EXPECT_EQ(p.nanos(), 500'000'000);
}

TEST(ProtoTimeTest, TimestampsAreUnixTime) {
  google::protobuf::Timestamp t;
  SetProtoTimestamp(absl::FromUnixMillis(1'700'000'000'250), &t);
  EXPECT_EQ(t.seconds(), 1'700'000'000);
  EXPECT_EQ(t.nanos(), 250'000'000);
}

}  // namespace
}  // namespace trident
