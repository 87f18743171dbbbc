#include "ps/rpc/peer_address.h"

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

TEST(PeerAddressTest, TheIpOfAPeerString) {
  EXPECT_EQ(PeerIp("ipv4:10.77.0.2:41234"), "10.77.0.2");
  EXPECT_EQ(PeerIp("ipv6:[::1]:80"), "::1");
  EXPECT_EQ(PeerIp("ipv6:[fe80::1%25eth0]:80"), "fe80::1");
  EXPECT_EQ(PeerIp("unix:/tmp/socket"), "");
  EXPECT_EQ(PeerIp("ipv4:nocolon"), "");
  EXPECT_EQ(PeerIp("ipv6:[::1"), "");
  EXPECT_EQ(PeerIp(""), "");
}

TEST(PeerAddressTest, LoopbackAndUnixSocketsAreThisHostAndOthersAreNot) {
  EXPECT_TRUE(PeerOnThisHost("ipv4:127.0.0.1:5000"));
  EXPECT_TRUE(PeerOnThisHost("ipv4:127.8.9.10:5000"));
  EXPECT_TRUE(PeerOnThisHost("ipv6:[::1]:5000"));
  EXPECT_TRUE(PeerOnThisHost("ipv6:[::ffff:127.0.0.1]:5000"));
  EXPECT_TRUE(PeerOnThisHost("unix:/tmp/socket"));
  // Documentation addresses (RFC 5737, RFC 3849): no interface holds them.
  EXPECT_FALSE(PeerOnThisHost("ipv4:203.0.113.9:5000"));
  EXPECT_FALSE(PeerOnThisHost("ipv6:[2001:db8::7]:5000"));
  EXPECT_FALSE(PeerOnThisHost("ipv6:[::ffff:203.0.113.9]:5000"));
  EXPECT_FALSE(PeerOnThisHost("garbage"));
}

}  // namespace
}  // namespace dtrain::ps
