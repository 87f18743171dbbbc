#include "ps/core/recent_request_ids.h"

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

TEST(RecentRequestIdsTest, RemembersInsertedIds) {
  RecentRequestIds ids(4);
  EXPECT_FALSE(ids.Contains(7));
  ids.Insert(7);
  EXPECT_TRUE(ids.Contains(7));
  ids.Insert(7);  // re-inserting does not take a second place
  EXPECT_EQ(ids.size(), 1u);
}

TEST(RecentRequestIdsTest, ForgetsTheOldestBeyondCapacity) {
  RecentRequestIds ids(3);
  for (uint64_t id = 1; id <= 5; ++id) ids.Insert(id);
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_FALSE(ids.Contains(1));
  EXPECT_FALSE(ids.Contains(2));
  EXPECT_TRUE(ids.Contains(3));
  EXPECT_TRUE(ids.Contains(5));
}

}  // namespace
}  // namespace dtrain::ps
