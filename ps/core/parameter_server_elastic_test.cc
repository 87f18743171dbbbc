// ParameterServer in an elastic job (ParameterServerOptions::max_workers, TrainConfig::elastic_batch): workers
// past the cluster spec's join a running job at the next step boundary, sync steps follow the live workers, the
// pull header tells each worker its batches, and a run where workers came and went ends complete.
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "ps/core/parameter_server.h"
#include "ps/core/train_config.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;
using Outcome = PushResponse::Outcome;

SimClusterOptions Elastic(const std::string& mode, int max_workers) {
  SimClusterOptions o;
  o.variables = {{"w", 3}, {"b", 1}};
  o.config = MakeConfig(mode, /*num_workers=*/1, /*replicas_to_aggregate=*/0, /*learning_rate=*/0.5f);
  o.config.total_num_replicas = 0;
  o.config.elastic_batch = "per_worker";
  o.config.batch_unit = 10;
  o.config.train_steps = 6;
  o.initial = {1, 2, 3, 4};
  o.max_workers = max_workers;
  return o;
}

PullResult PullOf(SimWorker& w, int64_t min_step, int64_t since_step) {
  std::vector<float> params(4);
  absl::StatusOr<PullResult> r = w.client().Pull(min_step, since_step, params.data());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : PullResult{};
}

TEST(ElasticTest, AWorkerJoinsAtTheNextStepAndTheStepsFollowTheWorkers) {
  auto cluster = *SimCluster::Start(Elastic("sync", 3));
  SimWorker w0(cluster.get(), 0);
  PullResult at = PullOf(w0, 0, 0);
  EXPECT_EQ(at.elastic.workers, (std::vector<int>{0}));
  EXPECT_EQ(at.elastic.unit, 10);
  EXPECT_EQ(at.elastic.batches, (std::vector<int64_t>{0}));
  EXPECT_EQ(*w0.Push(0, {1, 1, 1, 1}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 1);  // alone: R follows the one worker

  SimWorker w2(cluster.get(), 2);  // past the spec's one worker: joins at step 1, counts from step 2
  EXPECT_EQ(w2.client().join_step(), 2);
  // A commit for a step whose plan does not have it is dropped (its batch was nobody's): here before its join.
  EXPECT_EQ(*w2.Push(1, {9, 9, 9, 9}), Outcome::kDroppedBackup);
  EXPECT_EQ(*w0.Push(1, {1, 1, 1, 1}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 2);  // step 1 did not wait for the joiner
  at = PullOf(w2, w2.client().join_step(), 0);
  EXPECT_EQ(at.step, 2);
  EXPECT_EQ(at.elastic.workers, (std::vector<int>{0, 2}));
  EXPECT_EQ(at.elastic.aggregating, 2);
  EXPECT_EQ(at.elastic.batches, (std::vector<int64_t>{2, 3}));  // 0 and 1 went to worker 0's steps 0 and 1
  EXPECT_EQ(*w0.Push(2, {1, 1, 1, 1}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 2);  // now it waits for both
  EXPECT_EQ(*w2.Push(2, {3, 3, 3, 3}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 3);
  EXPECT_EQ(PullOf(w0, 3, 2).elastic.batches, (std::vector<int64_t>{4, 5}));

  // Worker 2 leaves: step 3 goes on with worker 0 alone, and the run ends complete.
  ASSERT_TRUE(w2.client().Done(Leaving::kStopped, 3, "SIGTERM").ok());
  for (int64_t s = 3; s < 6; ++s) EXPECT_EQ(*w0.Push(s, {1, 1, 1, 1}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 6);
  ASSERT_TRUE(w0.Done().ok());
  ASSERT_TRUE(cluster->task(0).WaitUntilFinished(absl::Seconds(10)));
  const TrainingOutcome outcome = cluster->task(0).outcome();
  EXPECT_EQ(outcome.kind, RunOutcome::kComplete) << outcome.message;
  EXPECT_TRUE(absl::StrContains(outcome.message, "2 workers took part; left before the end: worker 2 (stopped"))
      << outcome.message;
}

TEST(ElasticTest, AWorkerThatLeftComesBackWithTheSameIndex) {
  auto cluster = *SimCluster::Start(Elastic("sync", 2));
  SimWorker w0(cluster.get(), 0);
  {
    SimWorker w1(cluster.get(), 1);
    EXPECT_EQ(*w0.Push(0, {1, 1, 1, 1}), Outcome::kAccepted);
    EXPECT_EQ(PullOf(w1, w1.client().join_step(), 0).elastic.workers, (std::vector<int>{0, 1}));
    ASSERT_TRUE(w1.client().Done(Leaving::kStopped, 1, "SIGTERM").ok());  // a scheduler's scale-down
  }
  EXPECT_EQ(*w0.Push(1, {1, 1, 1, 1}), Outcome::kAccepted);  // step 1 goes on without it
  EXPECT_EQ(cluster->task(0).step(), 2);
  SimWorker again(cluster.get(), 1);  // scaled up again: the same index takes part again
  EXPECT_EQ(again.client().join_step(), 3);
  EXPECT_EQ(*w0.Push(2, {1, 1, 1, 1}), Outcome::kAccepted);
  EXPECT_EQ(PullOf(again, 3, 0).elastic.workers, (std::vector<int>{0, 1}));
  EXPECT_EQ(*again.Push(3, {1, 1, 1, 1}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 3);  // waits for worker 0's commit too
  EXPECT_EQ(*w0.Push(3, {1, 1, 1, 1}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 4);
}

// --elastic_batch=global: every step is the one batch; a plan worker that leaves before its commit leaves a part
// of it undone, so ps 0 plans the step again with the others (their commits of the old split set aside, a late
// one dropped) and their pulls answer that same step at once, with the new plan.
TEST(ElasticTest, AGlobalStepWhoseWorkerLeftBeforeItsCommitIsComputedAgain) {
  SimClusterOptions o = Elastic("sync", 3);
  o.config.elastic_batch = "global";
  o.config.global_batch = 30;  // three parts of 10
  auto cluster = *SimCluster::Start(o);
  SimWorker w0(cluster.get(), 0);
  PullResult at = PullOf(w0, 0, 0);
  EXPECT_EQ(at.elastic.workers, (std::vector<int>{0}));
  EXPECT_EQ(at.elastic.first_batch, 0);
  SimWorker w1(cluster.get(), 1), w2(cluster.get(), 2);
  EXPECT_EQ(*w0.Push(0, {1, 1, 1, 1}), Outcome::kAccepted);  // params 0.5 1.5 2.5 3.5
  ASSERT_EQ(cluster->task(0).step(), 1);
  for (SimWorker* w : {&w1, &w2}) PullOf(*w, 1, 0);
  at = PullOf(w0, 1, 0);
  EXPECT_EQ(at.elastic.workers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(at.elastic.first_batch, 1);
  EXPECT_EQ(*w0.Push(1, {9, 9, 9, 9}), Outcome::kAccepted);  // its part of the three-way split
  ASSERT_TRUE(w2.client().Done(Leaving::kStopped, 1, "SIGTERM").ok());  // before its commit
  // Worker 1 computed its part of the old split: dropped. Both pull step 1 again, split two ways.
  EXPECT_EQ(*w1.Push(1, {9, 9, 9, 9}), Outcome::kDroppedStale);
  for (SimWorker* w : {&w0, &w1}) {
    const PullResult again = PullOf(*w, 2, 1);
    EXPECT_EQ(again.step, 1);
    EXPECT_EQ(again.elastic.workers, (std::vector<int>{0, 1}));
    EXPECT_EQ(again.elastic.first_batch, 1);
    EXPECT_GT(again.elastic.version, at.elastic.version);
  }
  EXPECT_EQ(cluster->task(0).step(), 1);
  EXPECT_EQ(*w0.Push(1, {1, 1, 1, 1}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 1);  // waits for worker 1's part
  EXPECT_EQ(*w1.Push(1, {3, 3, 3, 3}), Outcome::kAccepted);
  ASSERT_EQ(cluster->task(0).step(), 2);
  // Step 1 is the average of the parts computed again (2), not of what was set aside.
  std::vector<float> params(4);
  ASSERT_TRUE(w0.client().Pull(2, 1, params.data()).ok());
  EXPECT_EQ(params, (std::vector<float>{-0.5f, 0.5f, 1.5f, 2.5f}));
}

TEST(ElasticTest, AGlobalBatchIsCheckedAgainstItsPartsAndTheWorkers) {
  TrainConfig c = MakeConfig("sync", 1, 0, 0.1f);
  c.total_num_replicas = 0;
  c.elastic_batch = "global";
  c.batch_unit = 100;
  c.global_batch = 400;
  EXPECT_TRUE(CheckElasticConfig(c, 4).ok()) << CheckElasticConfig(c, 4);
  absl::Status s = CheckElasticConfig(c, 5);
  EXPECT_TRUE(absl::StrContains(s.message(), "feeds at most 4 workers")) << s;
  c.global_batch = 350;
  s = CheckElasticConfig(c, 2);
  EXPECT_TRUE(absl::StrContains(s.message(), "--global_batch that is a multiple")) << s;
  c.global_batch = 400;
  c.replicas_to_aggregate = 2;
  s = CheckElasticConfig(c, 2);
  EXPECT_TRUE(absl::StrContains(s.message(), "--replicas_to_aggregate")) << s;
  c.replicas_to_aggregate = 0;
  c.optimizer.clip_norm = 1.0f;
  s = CheckElasticConfig(c, 2);
  EXPECT_TRUE(absl::StrContains(s.message(), "--clip_norm")) << s;
}

TEST(ElasticTest, AWorkerPastMaxWorkersIsRefusedNamingTheFlag) {
  auto cluster = *SimCluster::Start(Elastic("sync", 2));
  RegisterRequest request;
  request.worker_id = 2;
  request.config = cluster->config();
  absl::StatusOr<RegisterResponse> r = cluster->task(0).Register(request);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "takes at most 2 workers")) << r.status();
}

TEST(ElasticTest, MoreWorkersThanTheSpecNeedAnElasticInput) {
  SimClusterOptions o = Elastic("sync", 3);
  o.config.elastic_batch.clear();
  absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Start(o);
  ASSERT_FALSE(cluster.ok());
  EXPECT_TRUE(absl::StrContains(cluster.status().message(), "--elastic_batch")) << cluster.status();
}

TEST(ElasticTest, AsyncPullsEachTakeTheNextBatch) {
  auto cluster = *SimCluster::Start(Elastic("async", 2));
  SimWorker w0(cluster.get(), 0);
  EXPECT_EQ(PullOf(w0, 0, 0).elastic.batches, (std::vector<int64_t>{0}));
  SimWorker w1(cluster.get(), 1);
  EXPECT_EQ(w1.client().join_step(), 0);  // async: at once
  const PullResult a = PullOf(w1, 0, 0), b = PullOf(w0, 0, 0);
  EXPECT_EQ(a.elastic.batches, (std::vector<int64_t>{1}));
  EXPECT_EQ(b.elastic.batches, (std::vector<int64_t>{2}));
  EXPECT_EQ(b.elastic.workers, (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace dtrain::ps
