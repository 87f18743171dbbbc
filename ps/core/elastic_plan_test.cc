#include "ps/core/elastic_plan.h"

#include <set>

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

// The batches of the one input order that each step's workers read (per_worker: batch first_batch + rank).
std::vector<int64_t> BatchesOf(ElasticPlan& plan, int64_t step) {
  const ElasticView v = plan.View(step, /*worker=*/0, /*take_batch=*/false);
  std::vector<int64_t> out;
  for (size_t r = 0; r < v.workers.size(); ++r) out.push_back(v.first_batch + static_cast<int64_t>(r));
  return out;
}

TEST(ElasticPlanTest, AJoinerCountsFromTheNextStepAndEveryBatchIsReadOnce) {
  ElasticPlan plan(/*sync=*/true, /*global=*/false, /*unit=*/100, /*replicas_to_aggregate=*/0);
  plan.Start(0, {0});
  std::set<int64_t> read;
  int64_t expected_next = 0;
  auto step = [&](int64_t s, const std::vector<int>& active) {
    for (int64_t b : BatchesOf(plan, s)) {
      EXPECT_TRUE(read.insert(b).second) << "batch " << b << " read twice";
      EXPECT_EQ(b, expected_next++) << "a gap before batch " << b;
    }
    return plan.Advance(s, active);
  };
  EXPECT_EQ(step(0, {0}), "");
  EXPECT_EQ(plan.Needed({0}), 1);
  // Worker 2 registers during step 1: step 1 still counts on worker 0 alone.
  EXPECT_EQ(plan.Join(2, 1, {0}), 2);
  EXPECT_EQ(plan.Needed({0, 2}), 1);
  EXPECT_EQ(step(1, {0, 2}), "step 2: worker 2 joined (2 workers, aggregating 2, global batch 200)");
  EXPECT_EQ(plan.plan(), (std::vector<int>{0, 2}));
  EXPECT_EQ(plan.Needed({0, 2}), 2);
  EXPECT_EQ(step(2, {0, 2}), "");
  // Worker 1 joins, worker 0 is lost during step 3: step 3 needs worker 2 only; step 4's plan is {1, 2}.
  EXPECT_EQ(plan.Join(1, 3, {0, 2}), 4);
  EXPECT_EQ(plan.Needed({1, 2}), 1);
  EXPECT_EQ(step(3, {1, 2}), "step 4: worker 1 joined, worker 0 left (2 workers, aggregating 2, global batch 200)");
  EXPECT_EQ(step(4, {1, 2}), "");
  EXPECT_EQ(plan.cursor(), 8);  // 1 + 1 + 2 + 2 + 2 batches
  EXPECT_EQ(plan.version(), 3);
}

TEST(ElasticPlanTest, AJoinerWhenNobodyOfThePlanIsLeftTakesTheStepAtOnce) {
  ElasticPlan plan(true, false, 10, 0);
  plan.Start(5, {0});
  EXPECT_EQ(plan.Needed({}), 0);
  EXPECT_EQ(plan.Join(3, 5, {}), 5);  // else step 5 would wait for ever
  EXPECT_EQ(plan.Needed({3}), 1);
}

TEST(ElasticPlanTest, AFixedReplicasToAggregateStaysFixed) {
  ElasticPlan plan(true, false, 10, /*replicas_to_aggregate=*/2);
  plan.Start(0, {0, 1, 2});
  EXPECT_EQ(plan.Needed({0, 1, 2}), 2);
  EXPECT_EQ(plan.Needed({0}), 1);
  EXPECT_EQ(plan.aggregating(), 2);
}

TEST(ElasticPlanTest, GlobalBatchesFollowTheStep) {
  ElasticPlan plan(true, /*global=*/true, 400, 0);
  plan.Start(7, {0, 1});
  const ElasticView v = plan.View(7, 0, false);
  EXPECT_EQ(v.first_batch, 7);
  EXPECT_EQ(v.unit, 400);
  plan.Join(2, 7, {0, 1});
  EXPECT_EQ(plan.Advance(7, {0, 1, 2}), "step 8: worker 2 joined (3 workers, aggregating 3, global batch 400)");
  EXPECT_EQ(plan.View(8, 0, false).first_batch, 8);
}

TEST(ElasticPlanTest, AsyncHandsEachPullTheNextBatch) {
  ElasticPlan plan(/*sync=*/false, false, 50, 0);
  plan.Start(0, {0});
  EXPECT_EQ(plan.View(0, 0, true).first_batch, 0);
  EXPECT_EQ(plan.View(0, 0, true).first_batch, 1);
  EXPECT_EQ(plan.View(0, 0, false).first_batch, -1);  // a pull that takes no batch
  EXPECT_EQ(plan.Join(1, 3, {0}), 3);
  EXPECT_EQ(plan.Changed(3, {0, 1}), "step 3: worker 1 joined (2 workers, async, batch 50 each)");
  EXPECT_EQ(plan.View(3, 1, true).first_batch, 2);
  EXPECT_EQ(plan.Changed(4, {0, 1}), "");
}

}  // namespace
}  // namespace dtrain::ps
