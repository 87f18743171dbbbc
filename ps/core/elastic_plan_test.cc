#include "ps/core/elastic_plan.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

TEST(ElasticPlanTest, AJoinerCountsFromTheNextStepAndEveryBatchIsTrainedOnOnce) {
  ElasticPlan plan(/*sync=*/true, /*global=*/false, /*unit=*/100, /*replicas_to_aggregate=*/0);
  plan.Start({0});
  std::multiset<int64_t> trained;  // the batches whose gradients made it into a step
  // Step s: the plan's workers read their batches; `contributed` made it into the step.
  auto step = [&](int64_t s, const std::vector<int>& contributed, const std::vector<int>& active) {
    const ElasticView v = plan.View(s, 0, false);
    EXPECT_EQ(v.batches.size(), v.workers.size());
    for (size_t r = 0; r < v.workers.size(); ++r) {
      if (std::find(contributed.begin(), contributed.end(), v.workers[r]) != contributed.end()) {
        trained.insert(v.batches[r]);
      }
    }
    return plan.Advance(s, contributed, active);
  };
  EXPECT_EQ(step(0, {0}, {0}), "");
  EXPECT_EQ(plan.Needed({0}), 1);
  // Worker 2 registers during step 1: step 1 still counts on worker 0 alone.
  EXPECT_EQ(plan.Join(2, 1, {0}), 2);
  EXPECT_EQ(plan.Needed({0, 2}), 1);
  EXPECT_FALSE(plan.InPlan(2));
  EXPECT_EQ(step(1, {0}, {0, 2}), "step 2: worker 2 joined (2 workers, aggregating 2, global batch 200)");
  EXPECT_EQ(plan.plan(), (std::vector<int>{0, 2}));
  EXPECT_TRUE(plan.InPlan(2));
  EXPECT_EQ(plan.Needed({0, 2}), 2);
  EXPECT_EQ(step(2, {0, 2}, {0, 2}), "");
  // Worker 1 joins, worker 0 is lost during step 3 before its commit: step 3 needs worker 2 only, worker 0's batch
  // goes back and is the first handed out in step 4, whose plan is {1, 2}.
  EXPECT_EQ(plan.Join(1, 3, {0, 2}), 4);
  EXPECT_EQ(plan.Needed({1, 2}), 1);
  const std::vector<int64_t> lost_batch = {plan.View(3, 0, false).batches[0]};
  EXPECT_EQ(step(3, {2}, {1, 2}),
            "step 4: worker 1 joined, worker 0 left (2 workers, aggregating 2, global batch 200)");
  EXPECT_EQ(plan.View(4, 1, false).batches[0], lost_batch[0]);
  EXPECT_EQ(step(4, {1, 2}, {1, 2}), "");
  EXPECT_EQ(plan.version(), 3);
  // Every batch handed out so far was trained on exactly once, none skipped.
  EXPECT_EQ(trained.size(), static_cast<size_t>(plan.cursor()) - 2);  // step 5's two batches are out now
  for (int64_t b = 0; b < plan.cursor() - 2; ++b) EXPECT_EQ(trained.count(b), 1u) << "batch " << b;
}

TEST(ElasticPlanTest, TheStateKeepsTheBatchesNotTrainedOnYet) {
  ElasticPlan plan(true, false, 10, 0);
  plan.Start({0, 1});  // batches 0 and 1 handed out
  plan.Advance(0, {0}, {0, 1});  // worker 1's batch 1 goes back; step 1 hands out 1 and 2
  EXPECT_EQ(plan.SaveState(), "3:1,2");  // a checkpoint taken now: batches 1 and 2 are not trained on yet
  ElasticPlan restored(true, false, 10, 0);
  restored.Start({0, 1});
  ASSERT_TRUE(restored.RestoreState(plan.SaveState()).ok());
  EXPECT_EQ(restored.View(1, 0, false).batches, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(restored.cursor(), 3);
  EXPECT_FALSE(restored.RestoreState("3:7").ok());  // a batch past the cursor
  EXPECT_FALSE(restored.RestoreState("x").ok());
  EXPECT_EQ(restored.cursor(), 3);  // unchanged by the refused ones
}

TEST(ElasticPlanTest, AJoinerWhenNobodyOfThePlanIsLeftTakesTheStepAtOnce) {
  ElasticPlan plan(true, false, 10, 0);
  plan.Start({0});
  EXPECT_EQ(plan.Needed({}), 0);
  EXPECT_EQ(plan.Join(3, 5, {}), 5);  // else step 5 would wait for ever
  EXPECT_EQ(plan.Needed({3}), 1);
}

TEST(ElasticPlanTest, AFixedReplicasToAggregateStaysFixed) {
  ElasticPlan plan(true, false, 10, /*replicas_to_aggregate=*/2);
  plan.Start({0, 1, 2});
  EXPECT_EQ(plan.Needed({0, 1, 2}), 2);
  EXPECT_EQ(plan.Needed({0}), 1);
  EXPECT_EQ(plan.aggregating(), 2);
}

TEST(ElasticPlanTest, GlobalBatchesFollowTheStep) {
  ElasticPlan plan(true, /*global=*/true, 400, 0);
  plan.Start({0, 1});
  const ElasticView v = plan.View(7, 0, false);
  EXPECT_EQ(v.first_batch, 7);
  EXPECT_EQ(v.unit, 400);
  plan.Join(2, 7, {0, 1});
  EXPECT_EQ(plan.Advance(7, {0, 1}, {0, 1, 2}), "step 8: worker 2 joined (3 workers, aggregating 3, global batch 400)");
  EXPECT_EQ(plan.View(8, 0, false).first_batch, 8);
}

TEST(ElasticPlanTest, AGlobalStepThatLostAWorkerIsPlannedAgainWithTheOthers) {
  ElasticPlan plan(true, /*global=*/true, /*unit=*/100, 0, /*global_batch=*/400);
  plan.Start({0, 1, 2});
  const int64_t version = plan.version();
  EXPECT_EQ(plan.Replan(5, {0, 1, 2}), "");  // nobody left
  EXPECT_EQ(plan.Replan(5, {0, 2}),
            "step 5: worker 1 left (2 workers, aggregating 2, global batch 400); step 5 is computed again");
  EXPECT_EQ(plan.plan(), (std::vector<int>{0, 2}));
  EXPECT_GT(plan.version(), version);
  const ElasticView v = plan.View(5, 0, false);
  EXPECT_EQ(v.first_batch, 5);  // the same batch, split two ways now
  EXPECT_EQ(v.workers, (std::vector<int>{0, 2}));
  EXPECT_EQ(plan.Needed({0, 2}), 2);
  // Every worker of the step gone: the workers waiting to count from the next step take it up at once.
  plan.Join(3, 5, {0, 2});
  EXPECT_EQ(plan.Replan(5, {3}),
            "step 5: worker 3 joined, workers 0, 2 left (1 worker, aggregating 1, global batch 400); step 5 is "
            "computed again");
  EXPECT_EQ(plan.plan(), (std::vector<int>{3}));
  EXPECT_TRUE(plan.InPlan(3));
  // per_worker plans never do: a batch left undone goes back to the queue instead.
  ElasticPlan per_worker(true, /*global=*/false, 100, 0);
  per_worker.Start({0, 1});
  EXPECT_EQ(per_worker.Replan(5, {0}), "");
}

TEST(ElasticPlanTest, AsyncHandsEachPullTheNextBatch) {
  ElasticPlan plan(/*sync=*/false, false, 50, 0);
  plan.Start({0});
  EXPECT_EQ(plan.View(0, 0, true).batches, (std::vector<int64_t>{0}));
  EXPECT_EQ(plan.View(0, 0, true).batches, (std::vector<int64_t>{1}));
  EXPECT_TRUE(plan.View(0, 0, false).batches.empty());  // a pull that takes no batch
  EXPECT_EQ(plan.Join(1, 3, {0}), 3);
  EXPECT_EQ(plan.Changed(3, {0, 1}), "step 3: worker 1 joined (2 workers, async, batch 50 each)");
  EXPECT_EQ(plan.View(3, 1, true).batches, (std::vector<int64_t>{2}));
  EXPECT_EQ(plan.Changed(4, {0, 1}), "");
  // Worker 1 leaves before its next pull: the batch it took goes back and is handed out next.
  EXPECT_EQ(plan.Changed(5, {0}), "step 5: worker 1 left (1 worker, async, batch 50 each)");
  EXPECT_EQ(plan.View(5, 0, true).batches, (std::vector<int64_t>{2}));
  EXPECT_EQ(plan.View(6, 0, true).batches, (std::vector<int64_t>{3}));
}

// A worker that reads ahead (a model with sparse tables pulls a batch's rows with the pull before it trains it):
// each header names the batch held for its next step, its next pull trains that one when it says it drew it, a pull
// of the same step again keeps its batch, and a worker that leaves gives back both.
TEST(ElasticPlanTest, AsyncHoldsTheNextBatchOfAWorkerThatReadsAhead) {
  ElasticPlan plan(/*sync=*/false, false, 50, 0);
  plan.Start({0});
  ElasticView v = plan.View(0, 0, true, /*read_ahead=*/-2);  // nothing drawn yet
  EXPECT_EQ(v.batches, (std::vector<int64_t>{0}));
  EXPECT_EQ(v.next_batch, 1);
  v = plan.View(0, 0, true, /*read_ahead=*/0);  // it drew batch 0 again with its rows: the same step
  EXPECT_EQ(v.batches, (std::vector<int64_t>{0}));
  EXPECT_EQ(v.next_batch, 1);
  v = plan.View(1, 0, true, /*read_ahead=*/1);  // the next step, read ahead right
  EXPECT_EQ(v.batches, (std::vector<int64_t>{1}));
  EXPECT_EQ(v.next_batch, 2);
  // A dense worker beside it takes batches as before, never the held one.
  EXPECT_EQ(plan.Join(1, 2, {0}), 2);
  EXPECT_EQ(plan.Changed(2, {0, 1}), "step 2: worker 1 joined (2 workers, async, batch 50 each)");
  ElasticView dense = plan.View(2, 1, true);
  EXPECT_EQ(dense.batches, (std::vector<int64_t>{3}));
  EXPECT_EQ(dense.next_batch, -1);
  // The state counts both of worker 0's batches as not trained on yet (a restored job hands them out again).
  EXPECT_EQ(plan.SaveState(), "4:1,2,3");
  // A read-ahead of a batch that is not its own (ps 0 restarted meanwhile): it gets the held one, and draws again.
  v = plan.View(3, 0, true, /*read_ahead=*/7);
  EXPECT_EQ(v.batches, (std::vector<int64_t>{2}));
  EXPECT_EQ(v.next_batch, 4);
  // Worker 0 leaves: its batch and the one held for it go back, handed out first.
  EXPECT_EQ(plan.Changed(4, {1}), "step 4: worker 0 left (1 worker, async, batch 50 each)");
  EXPECT_EQ(plan.View(4, 1, true).batches, (std::vector<int64_t>{2}));
  EXPECT_EQ(plan.View(5, 1, true).batches, (std::vector<int64_t>{4}));
  EXPECT_EQ(plan.View(6, 1, true).batches, (std::vector<int64_t>{5}));
}

}  // namespace
}  // namespace dtrain::ps
