// ParameterServer in async mode: immediate application, retries, staleness accounting, bounded staleness.
#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;
using Outcome = PushResponse::Outcome;

SimClusterOptions AsyncCluster(int num_workers, int num_ps, int max_staleness = -1) {
  SimClusterOptions o;
  o.variables = {{"w", 6}, {"b", 2}};
  o.num_ps = num_ps;
  o.placement.min_slice_bytes = 8;  // split "w" so that with 2 tasks it spans both
  o.config = MakeConfig("async", num_workers, 0, /*learning_rate=*/0.25f);
  o.config.max_staleness = max_staleness;
  o.initial = std::vector<float>(8, 1000.0f);
  return o;
}

TEST(AsyncTest, PushesApplyOnArrivalAndStalenessIsRecorded) {
  auto cluster = *SimCluster::Start(AsyncCluster(2, 1));
  SimWorker w0(cluster.get(), 0), w1(cluster.get(), 1);
  std::vector<float> params;
  ASSERT_EQ(*w0.Pull(0, 0, &params), 0);
  ASSERT_EQ(*w1.Pull(0, 0, &params), 0);
  EXPECT_EQ(*w0.Push(0, std::vector<float>(8, 4.0f)), Outcome::kAccepted);  // staleness 0
  ASSERT_EQ(*w0.Pull(0, 1, &params), 1);
  EXPECT_EQ(params, std::vector<float>(8, 999.0f));
  EXPECT_EQ(*w1.Push(0, std::vector<float>(8, 8.0f)), Outcome::kAccepted);  // computed at 0, applied at 1
  EXPECT_EQ(*w0.Push(1, std::vector<float>(8, 4.0f)), Outcome::kAccepted);  // computed at 1, applied at 2
  ASSERT_EQ(*w1.Pull(0, 1, &params), 3);
  EXPECT_EQ(params, std::vector<float>(8, 996.0f));
  TrainingStats stats = *cluster->task(0).GetStats();
  EXPECT_EQ(stats.global_step, 3);
  ASSERT_EQ(stats.staleness_histogram.size(), 33u);
  EXPECT_EQ(stats.staleness_histogram[0], 1);
  EXPECT_EQ(stats.staleness_histogram[1], 2);
  EXPECT_EQ(stats.max_staleness_seen, 1);
  EXPECT_EQ(stats.workers[0].applied, 2);
  EXPECT_EQ(stats.workers[1].applied, 1);
}

TEST(AsyncTest, VeryStalePushesLandInTheLastBucket) {
  auto cluster = *SimCluster::Start(AsyncCluster(2, 1));
  SimWorker w0(cluster.get(), 0), w1(cluster.get(), 1);
  for (int s = 0; s < 40; ++s) ASSERT_TRUE(w0.Push(s, std::vector<float>(8, 0.0f)).ok());
  ASSERT_TRUE(w1.Push(0, std::vector<float>(8, 0.0f)).ok());  // staleness 40
  TrainingStats stats = *cluster->task(0).GetStats();
  EXPECT_EQ(stats.staleness_histogram[32], 1);
  EXPECT_EQ(stats.max_staleness_seen, 40);
  EXPECT_EQ(stats.staleness_histogram[0], 40);
}

TEST(AsyncTest, RetriedPushesAreNotDoubled) {
  // Two workers on two ps tasks, every push sent twice with the same request id.
  constexpr int kStepsPerWorker = 50;
  auto cluster = *SimCluster::Start(AsyncCluster(2, 2));
  ASSERT_EQ(cluster->placement().slices.size(), 3u);  // w is split over both tasks
  std::vector<std::thread> threads;
  std::vector<float> final_params[2];
  for (int id = 0; id < 2; ++id) {
    threads.emplace_back([&, id] {
      SimWorker w(cluster.get(), id, FaultInjectingPs::Faults{/*duplicate_pushes=*/true});
      std::vector<float> params;
      int64_t step = *w.Pull(0, 0, &params);
      // Gradients of 1 and 2 with lr 0.25: every update is exact in float.
      const std::vector<float> grad(8, static_cast<float>(id + 1));
      for (int i = 0; i < kStepsPerWorker; ++i) {
        absl::StatusOr<Outcome> outcome = w.Push(step, grad);
        ASSERT_TRUE(outcome.ok()) << outcome.status();
        EXPECT_EQ(*outcome, Outcome::kAccepted);
        step = *w.Pull(0, step, &params);
      }
      // The final values, once both workers pushed everything (a task that finished the run takes no worker
      // back: the last pull comes before leaving).
      ASSERT_TRUE(w.Pull(2 * kStepsPerWorker, step, &final_params[id]).ok());
      ASSERT_TRUE(w.Done().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  TrainingStats stats = *cluster->task(0).GetStats();
  EXPECT_EQ(stats.global_step, 2 * kStepsPerWorker);
  EXPECT_EQ(stats.workers[0].duplicates, kStepsPerWorker);
  EXPECT_EQ(stats.workers[1].duplicates, kStepsPerWorker);
  EXPECT_EQ(stats.workers[0].applied + stats.workers[1].applied, 2 * kStepsPerWorker);
  int64_t histogram_total = 0;
  for (int64_t n : stats.staleness_histogram) histogram_total += n;
  EXPECT_EQ(histogram_total, 2 * kStepsPerWorker);
  EXPECT_EQ(cluster->task(1).GetStats()->workers[0].duplicates, kStepsPerWorker);
  EXPECT_EQ(cluster->task(1).step(), 2 * kStepsPerWorker);  // task 1 counts its own updates
  // 1000 - 0.25 * (50 * 1 + 50 * 2) = 962.5 everywhere, on both tasks.
  for (int id = 0; id < 2; ++id) {
    EXPECT_EQ(final_params[id], std::vector<float>(8, 962.5f)) << "worker " << id;
  }
}

TEST(AsyncTest, BoundedStalenessBlocksTheFastWorker) {
  auto cluster = *SimCluster::Start(AsyncCluster(2, 1, /*max_staleness=*/2));
  SimWorker fast(cluster.get(), 0), slow(cluster.get(), 1);
  const std::vector<float> g(8, 0.0f);
  std::vector<float> params;
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(fast.Push(i, g).ok());
  ASSERT_TRUE(fast.Pull(0, 0, &params).ok());  // 2 commits ahead: allowed
  ASSERT_TRUE(fast.Push(2, g).ok());           // 3 ahead: the next pull waits
  std::future<absl::StatusOr<int64_t>> blocked =
      std::async(std::launch::async, [&] { return fast.Pull(0, 0, &params); });
  EXPECT_EQ(blocked.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  ASSERT_TRUE(slow.Push(0, g).ok());  // the slowest advances: 3 - 1 = 2
  ASSERT_EQ(blocked.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(*blocked.get(), 4);

  ASSERT_TRUE(fast.Push(4, g).ok());  // 4 - 1 = 3 ahead again
  blocked = std::async(std::launch::async, [&] { return fast.Pull(0, 0, &params); });
  EXPECT_EQ(blocked.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  ASSERT_TRUE(slow.Done().ok());  // a done worker no longer holds anyone back
  ASSERT_EQ(blocked.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(blocked.get().ok());

  // A pull that cannot proceed in time says why.
  auto cluster2 = *SimCluster::Start(AsyncCluster(2, 1, /*max_staleness=*/0));
  SimWorker eager(cluster2.get(), 0, {}, /*step_timeout=*/absl::Milliseconds(30));
  ASSERT_TRUE(eager.Push(0, g).ok());
  absl::StatusOr<int64_t> timed_out = eager.Pull(0, 0, &params);
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(timed_out.status().message().find("max_staleness 0"), std::string::npos) << timed_out.status();
}

TEST(AsyncTest, FastWorkerNeverGetsMoreThanMaxStalenessAhead) {
  constexpr int kMaxStaleness = 2;
  auto cluster = *SimCluster::Start(AsyncCluster(2, 1, kMaxStaleness));
  std::atomic<int> max_gap_at_pull{-1000};
  std::atomic<bool> slow_done{false};
  std::thread fast_thread([&] {
    SimWorker w(cluster.get(), 0);
    std::vector<float> params;
    int64_t step = *w.Pull(0, 0, &params);
    for (int i = 0; i < 30; ++i) {
      ASSERT_TRUE(w.Push(step, testing::TestGradient(0, step, params)).ok());
      absl::StatusOr<int64_t> next = w.Pull(0, 0, &params);
      ASSERT_TRUE(next.ok()) << next.status();
      step = *next;
      // The stats are read after the pull returned; the slow clock only grows, so the gap at the moment
      // the pull returned was at least this large.
      TrainingStats stats = *cluster->task(0).GetStats();
      if (!slow_done) {
        const int gap = static_cast<int>(stats.workers[0].applied - stats.workers[1].applied);
        EXPECT_LE(gap, kMaxStaleness) << "after commit " << i;
        max_gap_at_pull = std::max(max_gap_at_pull.load(), gap);
      }
    }
    ASSERT_TRUE(w.Done().ok());
  });
  std::thread slow_thread([&] {
    SimWorker w(cluster.get(), 1);
    std::vector<float> params;
    int64_t step = *w.Pull(0, 0, &params);
    for (int i = 0; i < 10; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ASSERT_TRUE(w.Push(step, testing::TestGradient(0, step, params)).ok());
      step = *w.Pull(0, 0, &params);
    }
    slow_done = true;
    ASSERT_TRUE(w.Done().ok());
  });
  fast_thread.join();
  slow_thread.join();
  EXPECT_EQ(max_gap_at_pull, kMaxStaleness);  // the bound was reached, so it was what held the fast one
  EXPECT_EQ(cluster->task(0).step(), 40);
  EXPECT_TRUE(cluster->task(0).finished());
}

}  // namespace
}  // namespace dtrain::ps
