#include "common/controller_client/member_address.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace trident::controller_client {
namespace {

TEST(MemberAddressTest, AdvertisedAddressNamesBothEndpoints) {
  const MemberAddresses a =
      AdvertisedAddresses("decode-0.decode.ns.svc.cluster.local:50052", "0.0.0.0", 50052, 9402);
  EXPECT_EQ(a.address, "decode-0.decode.ns.svc.cluster.local:50052");
  EXPECT_EQ(a.metrics_address, "decode-0.decode.ns.svc.cluster.local:9402");
}

TEST(MemberAddressTest, ASpecificBindHostIsUsedWithTheBoundPorts) {
  const MemberAddresses a = AdvertisedAddresses("", "127.0.0.1", 41000, 41001);
  EXPECT_EQ(a.address, "127.0.0.1:41000");
  EXPECT_EQ(a.metrics_address, "127.0.0.1:41001");
}

TEST(MemberAddressTest, AWildcardBindHostBecomesTheHostName) {
  for (const char* wildcard : {"0.0.0.0", "::", "[::]", ""}) {
    const MemberAddresses a = AdvertisedAddresses("", wildcard, 5, 6);
    EXPECT_EQ(a.address, JoinHostPort(HostName(), 5)) << wildcard;
    EXPECT_EQ(a.metrics_address, JoinHostPort(HostName(), 6)) << wildcard;
  }
}

TEST(MemberAddressTest, NodeNameComesFromTheEnvironmentWhenSet) {
  ASSERT_EQ(setenv("NODE_NAME", "gpu-node-7", 1), 0);
  EXPECT_EQ(AdvertisedAddresses("", "127.0.0.1", 1, 2).node_name, "gpu-node-7");
  ASSERT_EQ(unsetenv("NODE_NAME"), 0);
  EXPECT_EQ(AdvertisedAddresses("", "127.0.0.1", 1, 2).node_name, HostName());
}

TEST(MemberAddressTest, SplitsAndJoinsHostsIncludingIpv6) {
  EXPECT_EQ(HostOf("host:1"), "host");
  EXPECT_EQ(HostOf("[::1]:5"), "[::1]");
  EXPECT_EQ(HostOf("host"), "host");
  EXPECT_EQ(HostOf("::1"), "::1");
  EXPECT_EQ(JoinHostPort("::1", 5), "[::1]:5");
  EXPECT_EQ(JoinHostPort("[::1]", 5), "[::1]:5");
  EXPECT_EQ(JoinHostPort("10.0.0.1", 5), "10.0.0.1:5");
}

}  // namespace
}  // namespace trident::controller_client
