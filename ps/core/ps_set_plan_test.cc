#include "ps/core/ps_set_plan.h"

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

TEST(PsSetPlanTest, AnAddedTaskJoinsAtTheNextDecisionAndNothingIsDecidedPastItUntilTheMove) {
  PsSetPlan plan({"h0:1", "h1:2"});
  EXPECT_EQ(plan.View(5).version, 0);  // never changed: headers carry nothing
  ASSERT_TRUE(plan.Add("h2:3").ok());
  EXPECT_TRUE(plan.pending());
  // The joining task asking again (dtrain_ps --join does while it waits): the same change, said so.
  absl::StatusOr<std::string> again = plan.Add("h2:3");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, "ps task 2 (h2:3) joins at the next step boundary: 3 ps tasks (asked before)");
  EXPECT_NE(plan.Add("h3:4").status().message().find("under way already"), std::string::npos);
  EXPECT_FALSE(plan.Frozen(5));         // no step fixed yet: training goes on
  EXPECT_EQ(plan.View(5).version, 0);   // announced only once its step is fixed
  EXPECT_TRUE(plan.Decided(6));         // the next decision ends at step 6: the move happens there
  EXPECT_FALSE(plan.Decided(7));        // only once
  EXPECT_EQ(plan.move_step(), 6);
  EXPECT_TRUE(plan.Frozen(6));
  const PsSet v = plan.View(6);
  EXPECT_EQ(v.version, 1);
  EXPECT_EQ(v.step, 6);
  EXPECT_EQ(v.hosts, (std::vector<std::string>{"h0:1", "h1:2", "h2:3"}));
  EXPECT_TRUE(v.leaving.empty());
  // The chief's restore must match the announcement.
  EXPECT_FALSE(plan.Moved(2, 6).ok());
  EXPECT_FALSE(plan.Moved(3, 5).ok());
  ASSERT_TRUE(plan.Moved(3, 6).ok());
  EXPECT_FALSE(plan.pending());
  EXPECT_FALSE(plan.Frozen(6));
  EXPECT_EQ(plan.num_ps(), 3);
  // The set stays announced (a worker started with the old --ps_hosts learns it).
  EXPECT_EQ(plan.View(9).version, 1);
  EXPECT_EQ(plan.View(9).hosts.size(), 3u);
}

TEST(PsSetPlanTest, AnyTaskButPs0LeavesTheLastTakingItsPlaceAndEveryRefusalIsOneLine) {
  PsSetPlan plan({"h0:1", "h1:2", "h2:3"});
  EXPECT_EQ(plan.Remove(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.Remove(0).status().message().find("ps task 0 holds the global step"), std::string::npos);
  EXPECT_FALSE(plan.Remove(3).ok());
  EXPECT_EQ(plan.Add("h1:2").status().code(), absl::StatusCode::kFailedPrecondition);  // a task already
  EXPECT_EQ(plan.Add("nohost").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.Add("h:99999").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::string> said = plan.Remove(1);
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_EQ(*said, "ps task 1 (h1:2) leaves at the next step boundary: 2 ps tasks; ps task 2 (h2:3) becomes ps task 1");
  EXPECT_NE(plan.Add("h3:4").status().message().find("under way already"), std::string::npos);
  ASSERT_TRUE(plan.Decided(10));
  const PsSet v = plan.View(10);
  EXPECT_EQ(v.hosts, (std::vector<std::string>{"h0:1", "h2:3"}));
  EXPECT_EQ(v.leaving, (std::vector<std::string>{"h1:2"}));
  ASSERT_TRUE(plan.Moved(2, 10).ok());
  ASSERT_TRUE(plan.Remove(1).ok());
  ASSERT_TRUE(plan.Decided(20));
  ASSERT_TRUE(plan.Moved(1, 20).ok());
  EXPECT_EQ(plan.View(21).version, 2);
  EXPECT_NE(plan.Remove(0).status().message().find("one ps task"), std::string::npos);
}

TEST(PsSetPlanTest, WithoutTheSpecsHostsNothingChanges) {
  PsSetPlan plan({});
  EXPECT_EQ(plan.Add("h:1").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(plan.Remove(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(plan.Decided(3));
  EXPECT_FALSE(plan.Frozen(3));
}

}  // namespace
}  // namespace dtrain::ps
