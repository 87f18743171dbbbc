#include "tests/netdelay/delay_line.h"

#include <gtest/gtest.h>

namespace dtrain::netdelay {
namespace {

constexpr int64_t kMs = 1'000'000;

TEST(DelayLineTest, HoldsEachPacketTheDelayThenReleasesThePrefixDue) {
  DelayLine line(10 * kMs);
  EXPECT_EQ(line.NextDueNs(), -1);
  EXPECT_FALSE(line.TakeDue(0).has_value());
  line.Add(7, 0);
  line.Add(8, 2 * kMs);
  line.Add(9, 5 * kMs);
  EXPECT_EQ(line.NextDueNs(), 10 * kMs);
  EXPECT_FALSE(line.TakeDue(10 * kMs - 1).has_value());
  // At 12 ms the first two are due: one verdict for "up to 8".
  EXPECT_EQ(line.TakeDue(12 * kMs), std::optional<uint32_t>(8));
  EXPECT_EQ(line.size(), 1u);
  EXPECT_EQ(line.NextDueNs(), 15 * kMs);
  EXPECT_FALSE(line.TakeDue(14 * kMs).has_value());
  EXPECT_EQ(line.TakeDue(15 * kMs), std::optional<uint32_t>(9));
  EXPECT_EQ(line.size(), 0u);
  EXPECT_EQ(line.max_size(), 3u);
}

TEST(DelayLineTest, ZeroDelayReleasesAtOnce) {
  DelayLine line(0);
  line.Add(1, 100);
  EXPECT_EQ(line.TakeDue(100), std::optional<uint32_t>(1));
}

TEST(DelayLineTest, NegativeDelayIsZero) {
  DelayLine line(-5);
  line.Add(1, 100);
  EXPECT_EQ(line.NextDueNs(), 100);
}

TEST(DelayLineTest, IdsWrapAroundInOrder) {
  // The kernel's packet ids are 32-bit and wrap; the line keeps arrival order, not numeric order.
  DelayLine line(kMs);
  line.Add(0xffffffffu, 0);
  line.Add(0u, 0);
  line.Add(1u, 3 * kMs);
  EXPECT_EQ(line.TakeDue(kMs), std::optional<uint32_t>(0u));
  EXPECT_EQ(line.TakeAll(), std::optional<uint32_t>(1u));
  EXPECT_FALSE(line.TakeAll().has_value());
}

}  // namespace
}  // namespace dtrain::netdelay
