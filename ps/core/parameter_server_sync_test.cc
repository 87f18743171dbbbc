// ParameterServer in sync mode on one ps task: aggregation, backup workers, stale and duplicate pushes.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <atomic>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"
#include "ps/core/slice_store.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::Pulled;
using ::dtrain::ps::testing::PullSlices;
using ::dtrain::ps::testing::PushSlices;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;
using Outcome = PushResponse::Outcome;

// Records what ps 0 applied.
class DecisionRecorder {
 public:
  std::function<void(const StepDecision&)> Hook() {
    return [this](const StepDecision& d) {
      std::lock_guard<std::mutex> lock(mu_);
      decisions_.push_back(d);
    };
  }
  std::vector<StepDecision> decisions() {
    std::lock_guard<std::mutex> lock(mu_);
    return decisions_;
  }

 private:
  std::mutex mu_;
  std::vector<StepDecision> decisions_;
};

SimClusterOptions OneTask(int num_workers, int r, std::vector<float> initial) {
  SimClusterOptions o;
  o.variables = {{"w", static_cast<int64_t>(initial.size()) - 1}, {"b", 1}};
  o.config = MakeConfig("sync", num_workers, r, /*learning_rate=*/0.5f);
  o.initial = std::move(initial);
  return o;
}

TEST(SyncTest, TwoWorkersAverageTheirGradients) {
  DecisionRecorder recorder;
  SimClusterOptions o = OneTask(2, 2, {1, 2, 3, 4});
  o.on_step_applied = recorder.Hook();
  auto cluster = *SimCluster::Start(o);
  SimWorker w0(cluster.get(), 0), w1(cluster.get(), 1);

  EXPECT_EQ(*w0.Push(0, {1, 0, -1, 2}), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 0);  // waits for the second gradient
  std::future<absl::StatusOr<int64_t>> pull0 = std::async(std::launch::async, [&] {
    std::vector<float> params;
    return w0.Pull(1, 0, &params);
  });
  EXPECT_EQ(pull0.wait_for(std::chrono::milliseconds(30)), std::future_status::timeout);
  EXPECT_EQ(*w1.Push(0, {3, 2, 1, 0}), Outcome::kAccepted);
  ASSERT_EQ(pull0.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(*pull0.get(), 1);

  // mean = {2, 1, 0, 1}; values = {1, 2, 3, 4} - 0.5 * mean = {0, 1.5, 3, 3.5}
  std::vector<float> params;
  PullRequest request;
  request.worker_id = 1;
  request.session = cluster->Session(0, 1);
  request.min_step = 1;
  request.since_step = 0;
  absl::StatusOr<Pulled> r = PullSlices(cluster->task(0), request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->header.step, 1);
  cluster->Scatter(r->slices, &params);
  EXPECT_EQ(params, std::vector<float>({0.0f, 1.5f, 3.0f, 3.5f}));
  ASSERT_EQ(r->header.decisions.size(), 1u);
  EXPECT_EQ(r->header.decisions[0].step, 0);
  EXPECT_EQ(r->header.decisions[0].workers, std::vector<int>({0, 1}));
  ASSERT_EQ(recorder.decisions().size(), 1u);
  EXPECT_EQ(recorder.decisions()[0].workers, std::vector<int>({0, 1}));

  // since_step past the step: no decisions.
  request.since_step = 1;
  EXPECT_TRUE(PullSlices(cluster->task(0), request)->header.decisions.empty());
  TrainingStats stats = *cluster->task(0).GetStats();
  EXPECT_EQ(stats.global_step, 1);
  EXPECT_EQ(stats.workers[0].applied, 1);
  EXPECT_EQ(stats.workers[1].applied, 1);
  EXPECT_TRUE(stats.staleness_histogram.empty());  // async only
}

TEST(SyncTest, BackupWorkerPushIsDroppedAndCounted) {
  DecisionRecorder recorder;
  SimClusterOptions o = OneTask(3, 2, {0, 0, 0, 0});
  o.on_step_applied = recorder.Hook();
  auto cluster = *SimCluster::Start(o);
  SimWorker w0(cluster.get(), 0), w1(cluster.get(), 1), w2(cluster.get(), 2);
  const std::vector<float> g = {1, 1, 1, 1};
  EXPECT_EQ(*w1.Push(0, g), Outcome::kAccepted);
  EXPECT_EQ(*w0.Push(0, g), Outcome::kAccepted);
  EXPECT_EQ(cluster->task(0).step(), 1);
  EXPECT_EQ(*w2.Push(0, {100, 100, 100, 100}), Outcome::kDroppedBackup);
  std::vector<float> params;
  EXPECT_EQ(*w2.Pull(1, 0, &params), 1);
  EXPECT_EQ(params, std::vector<float>({-0.5f, -0.5f, -0.5f, -0.5f}));  // worker 2's gradient is not in it
  ASSERT_EQ(recorder.decisions().size(), 1u);
  EXPECT_EQ(recorder.decisions()[0].workers, std::vector<int>({1, 0}));  // commit order
  TrainingStats stats = *cluster->task(0).GetStats();
  EXPECT_EQ(stats.workers[2].dropped_backup, 1);
  EXPECT_EQ(stats.workers[2].applied, 0);
  EXPECT_EQ(stats.workers[0].applied, 1);
  const PushAccounting a = cluster->task(0).accounting();
  EXPECT_EQ(a.received, 3);
  EXPECT_EQ(a.accepted, 2);
  EXPECT_EQ(a.applied, 2);
  EXPECT_EQ(a.dropped_backup, 1);
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
}

TEST(SyncTest, SlowWorkerDoesNotSlowTheSteps) {
  constexpr int kSteps = 20;
  DecisionRecorder recorder;
  SimClusterOptions o = OneTask(3, 2, {1, 1, 1, 1});  // R=2, T=3: one backup worker
  o.on_step_applied = recorder.Hook();
  auto cluster = *SimCluster::Start(o);
  absl::Notification fast_finished;
  std::atomic<int> fast_running{2};
  std::atomic<bool> slow_woke_before_fast_finished{false};

  auto fast = [&](int id) {
    SimWorker w(cluster.get(), id);
    std::vector<float> params;
    int64_t step = *w.Pull(0, 0, &params);
    while (step < kSteps) {
      ASSERT_TRUE(w.Push(step, testing::TestGradient(id, step, params)).ok());
      absl::StatusOr<int64_t> next = w.Pull(step + 1, step, &params);
      ASSERT_TRUE(next.ok()) << next.status();
      step = *next;
    }
    if (--fast_running == 0) fast_finished.Notify();
  };
  auto slow = [&] {
    SimWorker w(cluster.get(), 2);
    std::vector<float> params;
    ASSERT_TRUE(w.Pull(0, 0, &params).ok());
    // "Sleeps" until the fast workers are through (bounded, so a broken server fails instead of hanging).
    if (!fast_finished.WaitForNotificationWithTimeout(absl::Seconds(20))) slow_woke_before_fast_finished = true;
    absl::StatusOr<Outcome> outcome = w.Push(0, testing::TestGradient(2, 0, params));
    ASSERT_TRUE(outcome.ok());
    EXPECT_EQ(*outcome, Outcome::kDroppedStale);
  };
  std::thread t0(fast, 0), t1(fast, 1), t2(slow);
  t0.join();
  t1.join();
  t2.join();
  EXPECT_FALSE(slow_woke_before_fast_finished);
  EXPECT_EQ(cluster->task(0).step(), kSteps);
  std::vector<StepDecision> decisions = recorder.decisions();
  ASSERT_EQ(decisions.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_EQ(decisions[s].step, s);
    EXPECT_EQ(decisions[s].workers.size(), 2u) << "step " << s;
    for (int w : decisions[s].workers) EXPECT_NE(w, 2) << "step " << s;
  }
  TrainingStats stats = *cluster->task(0).GetStats();
  EXPECT_EQ(stats.workers[2].dropped_stale, 1);
  EXPECT_EQ(stats.workers[0].applied + stats.workers[1].applied, 2 * kSteps);
}

TEST(SyncTest, StaleGradientIsDroppedAndValuesUnchanged) {
  auto cluster = *SimCluster::Start(OneTask(2, 1, {1, 1, 1, 1}));  // R=1: every commit is a step
  SimWorker w0(cluster.get(), 0), w1(cluster.get(), 1);
  const std::vector<float> g = {2, 2, 2, 2};
  EXPECT_EQ(*w0.Push(0, g), Outcome::kAccepted);
  EXPECT_EQ(*w0.Push(1, g), Outcome::kAccepted);
  std::vector<float> before, after;
  ASSERT_EQ(*w1.Pull(2, 0, &before), 2);
  EXPECT_EQ(before, std::vector<float>({-1, -1, -1, -1}));
  EXPECT_EQ(*w1.Push(0, {50, 50, 50, 50}), Outcome::kDroppedStale);  // two steps old
  ASSERT_EQ(*w1.Pull(2, 0, &after), 2);
  EXPECT_EQ(after, before);
  TrainingStats stats = *cluster->task(0).GetStats();
  EXPECT_EQ(stats.workers[1].dropped_stale, 1);
  EXPECT_EQ(stats.workers[1].dropped_backup, 0);
  EXPECT_EQ(stats.global_step, 2);
  const PushAccounting a = cluster->task(0).accounting();
  EXPECT_EQ(a.received, 3);
  EXPECT_EQ(a.applied, 2);
  EXPECT_EQ(a.dropped_stale, 1);
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
}

// A transport that maps the worker's memory lends whole slices (SliceUpload::WriteInPlace): the ps reads them
// where they lie when it applies the step (no copy), and holds that memory (`keep`) until then: no longer once the
// step is applied, or once an upload that will not be applied ends.
TEST(SyncTest, LentGradientsAreReadInPlaceWhenTheStepIsApplied) {
  auto cluster = *SimCluster::Start(OneTask(2, 2, {1, 2, 3, 4}));
  ParameterServer& ps = cluster->task(0);
  const testing::Slices keys = cluster->SlicesFor(0, {0, 0, 0, 0});
  ASSERT_EQ(keys.size(), 2u);
  const uint32_t w_key = keys.begin()->first, b_key = std::next(keys.begin())->first;
  ASSERT_EQ(keys.begin()->second.size(), 3u);
  const uint64_t s0 = cluster->Session(0, 0), s1 = cluster->Session(0, 1);  // (each call registers anew)
  {
    // An upload abandoned after lending a slice lets go of it at once.
    auto lent = std::make_shared<std::vector<float>>(std::vector<float>{7, 7, 7});
    std::weak_ptr<std::vector<float>> watch = lent;
    PushHeader h{0, 0, 41, /*commit=*/true, s0};
    absl::StatusOr<std::unique_ptr<SliceUpload>> up = ps.StartPush(h);
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE((*up)->WriteInPlace(w_key, 0, 3, lent->data(), lent).ok());
    lent.reset();
    EXPECT_FALSE(watch.expired());
    up->reset();
    EXPECT_TRUE(watch.expired());
  }
  auto lent_w = std::make_shared<std::vector<float>>(std::vector<float>{9, 9, 9});
  std::weak_ptr<std::vector<float>> watch = lent_w;
  std::vector<float> lent_b = {5};
  {
    PushHeader h{0, 0, 42, /*commit=*/true, s0};
    absl::StatusOr<std::unique_ptr<SliceUpload>> up = ps.StartPush(h);
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE((*up)->WriteInPlace(w_key, 0, 3, lent_w->data(), lent_w).ok());
    ASSERT_TRUE((*up)->WriteInPlace(b_key, 0, 1, lent_b.data(), nullptr).ok());
    absl::StatusOr<PushResponse> r = (*up)->Finish();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outcome, Outcome::kAccepted);
  }
  // Worker 0's gradient changes where it lies before the step is decided: the ps reads it there. (A worker does
  // not do this; it shows that nothing was copied.)
  *lent_w = {1, 0, -1};
  lent_b[0] = 2;
  lent_w.reset();
  EXPECT_FALSE(watch.expired());  // held while the step waits for worker 1
  PushHeader h1{1, 0, 7, /*commit=*/true, s1};
  ASSERT_EQ(PushSlices(ps, h1, cluster->SlicesFor(0, {3, 2, 1, 0}))->outcome, Outcome::kAccepted);
  ASSERT_EQ(ps.step(), 1);
  EXPECT_TRUE(watch.expired());  // applied: let go
  // mean = {2, 1, 0, 1}; values = {1, 2, 3, 4} - 0.5 * mean
  PullRequest request;
  request.worker_id = 0;
  request.session = s0;
  request.min_step = 1;
  absl::StatusOr<Pulled> r = PullSlices(ps, request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->slices.at(w_key), (std::vector<float>{0, 1.5, 3}));
  EXPECT_EQ(r->slices.at(b_key), (std::vector<float>{3.5}));
  // A slice lent in part and continued from other memory is copied from there on, the part lent before too:
  // changed afterwards, it is applied as it was written.
  PushHeader h2{0, 1, 43, /*commit=*/true, s0};
  absl::StatusOr<std::unique_ptr<SliceUpload>> up = ps.StartPush(h2);
  ASSERT_TRUE(up.ok()) << up.status();
  std::vector<float> piece = {2, 2};
  ASSERT_TRUE((*up)->WriteInPlace(w_key, 0, 2, piece.data(), nullptr).ok());
  std::vector<float> rest = {2};
  ASSERT_TRUE((*up)->WriteInPlace(w_key, 2, 1, rest.data(), nullptr).ok());
  piece = {100, 100};
  ASSERT_TRUE((*up)->WriteInPlace(b_key, 0, 1, rest.data(), nullptr).ok());
  ASSERT_EQ((*up)->Finish()->outcome, Outcome::kAccepted);
  ASSERT_EQ(PushSlices(ps, PushHeader{1, 1, 8, true, s1}, cluster->SlicesFor(0, {2, 2, 2, 2}))
                ->outcome,
            Outcome::kAccepted);
  request.min_step = 2;
  r = PullSlices(ps, request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->slices.at(w_key), (std::vector<float>{-1, 0.5, 2}));
}

// Lent gradients are checked for NaN/Inf when they arrive and read again when the step is applied: a worker that
// changes its shared memory in between (a bug, or an attack) must not put NaN into the parameters. The ps applies
// a checked copy: what is not finite there is applied as 0, counted and logged.
TEST(SyncTest, LentGradientsMadeNonFiniteAfterTheirCheckAreAppliedAsZero) {
  auto cluster = *SimCluster::Start(OneTask(2, 2, {1, 2, 3, 4}));
  ParameterServer& ps = cluster->task(0);
  const testing::Slices keys = cluster->SlicesFor(0, {0, 0, 0, 0});
  const uint32_t w_key = keys.begin()->first, b_key = std::next(keys.begin())->first;
  const uint64_t s0 = cluster->Session(0, 0), s1 = cluster->Session(0, 1);
  std::vector<float> lent_w = {1, 0, -1}, lent_b = {2};
  {
    absl::StatusOr<std::unique_ptr<SliceUpload>> up = ps.StartPush(PushHeader{0, 0, 42, /*commit=*/true, s0});
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE((*up)->WriteInPlace(w_key, 0, 3, lent_w.data(), nullptr).ok());
    ASSERT_TRUE((*up)->WriteInPlace(b_key, 0, 1, lent_b.data(), nullptr).ok());
    ASSERT_EQ((*up)->Finish()->outcome, Outcome::kAccepted);  // checked: finite
  }
  lent_w = {std::numeric_limits<float>::quiet_NaN(), 0, std::numeric_limits<float>::infinity()};
  ASSERT_EQ(PushSlices(ps, PushHeader{1, 0, 7, true, s1}, cluster->SlicesFor(0, {3, 2, 1, 0}))->outcome,
            Outcome::kAccepted);
  ASSERT_EQ(ps.step(), 1);
  PullRequest request;
  request.worker_id = 0;
  request.session = s0;
  request.min_step = 1;
  absl::StatusOr<Pulled> r = PullSlices(ps, request);
  ASSERT_TRUE(r.ok()) << r.status();
  // sums {NaN + 3, 0 + 2, Inf + 1} -> {0, 2, 0}; b: 2 + 0. values - 0.5 * sum / 2.
  EXPECT_EQ(r->slices.at(w_key), (std::vector<float>{1, 1.5, 3}));
  EXPECT_EQ(r->slices.at(b_key), (std::vector<float>{3.5}));
  EXPECT_EQ(ps.nonfinite_at_apply(), 2);
}

// The same for one worker's gradient applied alone (async mode, --nonfinite=reject): no sum is formed, the copy is.
TEST(SyncTest, AnAsyncLentGradientMadeNonFiniteAfterItsCheckIsAppliedAsZero) {
  SimClusterOptions o = OneTask(1, 1, {1, 2, 3, 4});
  o.config = MakeConfig("async", 1, 1, /*learning_rate=*/0.5f);
  auto cluster = *SimCluster::Start(o);
  ParameterServer& ps = cluster->task(0);
  const testing::Slices keys = cluster->SlicesFor(0, {0, 0, 0, 0});
  const uint32_t w_key = keys.begin()->first, b_key = std::next(keys.begin())->first;
  const uint64_t s0 = cluster->Session(0, 0);
  std::vector<float> lent_w = {2, 2, 2}, lent_b = {2};
  absl::StatusOr<std::unique_ptr<SliceUpload>> up = ps.StartPush(PushHeader{0, 0, 42, /*commit=*/true, s0});
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE((*up)->WriteInPlace(w_key, 0, 3, lent_w.data(), nullptr).ok());
  ASSERT_TRUE((*up)->WriteInPlace(b_key, 0, 1, lent_b.data(), nullptr).ok());
  lent_w[1] = -std::numeric_limits<float>::infinity();  // after its check, before the apply at Finish
  ASSERT_EQ((*up)->Finish()->outcome, Outcome::kAccepted);
  PullRequest request;
  request.worker_id = 0;
  request.session = s0;
  absl::StatusOr<Pulled> r = PullSlices(ps, request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->slices.at(w_key), (std::vector<float>{0, 2, 2}));
  EXPECT_EQ(r->slices.at(b_key), (std::vector<float>{3}));
  EXPECT_EQ(ps.nonfinite_at_apply(), 1);
}

TEST(SyncTest, DuplicatePushIsNotAppliedTwice) {
  auto cluster = *SimCluster::Start(OneTask(2, 2, {0, 0, 0, 0}));
  ParameterServer& ps = cluster->task(0);
  PushHeader h{0, 0, 42, /*commit=*/true, cluster->Session(0, 0)};
  EXPECT_EQ(PushSlices(ps, h, cluster->SlicesFor(0, {4, 4, 4, 4}))->outcome, Outcome::kAccepted);
  EXPECT_EQ(PushSlices(ps, h, cluster->SlicesFor(0, {4, 4, 4, 4}))->outcome, Outcome::kDuplicate);  // a retry
  h.request_id = 43;
  // A second commit for the step under a new id.
  EXPECT_EQ(PushSlices(ps, h, cluster->SlicesFor(0, {9, 9, 9, 9}))->outcome, Outcome::kDuplicate);
  EXPECT_EQ(ps.step(), 0);  // still waiting for worker 1: the duplicates did not count as contributions
  h.worker_id = 1;
  h.session = cluster->Session(0, 1);
  h.request_id = 42;  // ids are per worker
  EXPECT_EQ(PushSlices(ps, h, cluster->SlicesFor(0, {2, 2, 2, 2}))->outcome, Outcome::kAccepted);
  EXPECT_EQ(ps.step(), 1);
  std::vector<float> params;
  SimWorker w0(cluster.get(), 0);
  ASSERT_EQ(*w0.Pull(1, 0, &params), 1);
  EXPECT_EQ(params, std::vector<float>({-1.5f, -1.5f, -1.5f, -1.5f}));  // -0.5 * mean(4, 2)
  EXPECT_EQ(ps.GetStats()->workers[0].duplicates, 2);
  const PushAccounting a = ps.accounting();
  EXPECT_EQ(a.received, 4);
  EXPECT_EQ(a.duplicates, 2);
  EXPECT_EQ(a.applied, 2);
  EXPECT_EQ(a.pending, 0);
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
}

// Every push is accounted for once: a push without a session is refused, an upload dropped unfinished is
// abandoned, an open one is in flight, and an accepted gradient waits (pending) until its step is decided.
TEST(SyncTest, AccountingBalancesWithRefusedAbandonedAndPendingPushes) {
  auto cluster = *SimCluster::Start(OneTask(2, 2, {0, 0, 0, 0}));
  ParameterServer& ps = cluster->task(0);
  PushHeader stranger{0, 0, 7, /*commit=*/true, /*session=*/12345};
  EXPECT_FALSE(ps.StartPush(stranger).ok());
  PushHeader h{0, 0, 8, /*commit=*/true, cluster->Session(0, 0)};
  {
    absl::StatusOr<std::unique_ptr<SliceUpload>> open = ps.StartPush(h);
    ASSERT_TRUE(open.ok()) << open.status();
    EXPECT_EQ(ps.accounting().in_flight, 1);
    EXPECT_TRUE(ps.accounting().Balanced()) << ps.accounting().DebugString();
  }  // dropped without Finish: the client went away
  PushAccounting a = ps.accounting();
  EXPECT_EQ(a.refused, 1);
  EXPECT_EQ(a.abandoned, 1);
  EXPECT_EQ(a.in_flight, 0);
  EXPECT_EQ(ps.step(), 0);
  h.request_id = 9;
  EXPECT_EQ(PushSlices(ps, h, cluster->SlicesFor(0, {4, 4, 4, 4}))->outcome, Outcome::kAccepted);
  a = ps.accounting();
  EXPECT_EQ(a.received, 3);
  EXPECT_EQ(a.accepted, 1);
  EXPECT_EQ(a.pending, 1);  // waits for worker 1
  EXPECT_EQ(a.applied, 0);
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
  SimWorker w1(cluster.get(), 1);
  EXPECT_EQ(*w1.Push(0, {2, 2, 2, 2}), Outcome::kAccepted);
  a = ps.accounting();
  EXPECT_EQ(a.applied, 2);
  EXPECT_EQ(a.pending, 0);
  EXPECT_TRUE(a.Balanced()) << a.DebugString();
}

TEST(SyncTest, PiecesOfOneUploadAreGatheredUntilTheCommit) {
  // Layer by layer and chunk by chunk: the commit at the end of the upload needs every slice whole.
  auto cluster = *SimCluster::Start(OneTask(1, 1, {0, 0, 0, 0}));
  ParameterServer& ps = cluster->task(0);
  absl::StatusOr<std::unique_ptr<SliceUpload>> upload =
      ps.StartPush(PushHeader{0, 0, 1, /*commit=*/true, cluster->Session(0, 0)});
  ASSERT_TRUE(upload.ok()) << upload.status();
  const float b[] = {4}, w[] = {2, 2, 2};
  ASSERT_TRUE((*upload)->Write(1, 0, 1, WireDtype::kF32, b).ok());      // the last layer first
  ASSERT_TRUE((*upload)->Write(0, 0, 2, WireDtype::kF32, w).ok());      // 'w' in two pieces
  EXPECT_EQ(ps.step(), 0);
  ASSERT_TRUE((*upload)->Write(0, 2, 1, WireDtype::kF32, w + 2).ok());
  EXPECT_EQ(ps.step(), 0);  // nothing is decided before the upload ends
  absl::StatusOr<PushResponse> r = (*upload)->Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, Outcome::kAccepted);
  EXPECT_EQ(ps.step(), 1);
  std::vector<float> params;
  SimWorker w0(cluster.get(), 0);
  ASSERT_EQ(*w0.Pull(1, 0, &params), 1);
  EXPECT_EQ(params, std::vector<float>({-1, -1, -1, -2}));
}

TEST(SyncTest, PullStreamsEachSliceAsSoonAsItIsUpdated) {
  // A pull waiting for step 1 gets its header at the decision and every slice at step 1, in key order, even
  // when a large slice is updated in several published chunks.
  SimClusterOptions o;
  const int64_t big = 3 * SliceStore::kChunkFloats + 5;
  o.variables = {{"w", big}, {"b", 3}};
  o.config = MakeConfig("sync", 2, 1, /*learning_rate=*/1.0f);  // worker 1 pulls while worker 0 pushes
  o.initial.assign(big + 3, 1.0f);
  auto cluster = *SimCluster::Start(o);
  std::vector<uint32_t> order;
  class Recorder : public PullReceiver {
   public:
    explicit Recorder(std::vector<uint32_t>* order, std::vector<float>* flat, int64_t big)
        : order_(order), flat_(flat), big_(big) {}
    absl::Status OnHeader(const PullHeader& h) override {
      step_ = h.step;
      return absl::OkStatus();
    }
    absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
      order_->push_back(key);
      return Buffer{flat_->data() + (key == 0 ? 0 : big_) + offset, WireDtype::kF32};
    }
    absl::Status Written(uint32_t, int64_t, int64_t) override { return absl::OkStatus(); }
    int64_t step_ = -1;

   private:
    std::vector<uint32_t>* order_;
    std::vector<float>* flat_;
    int64_t big_;
  };
  std::vector<float> flat(big + 3);
  Recorder recorder(&order, &flat, big);
  PullRequest request;
  request.worker_id = 1;
  request.session = cluster->Session(0, 1);
  request.min_step = 1;
  std::future<absl::Status> pull = std::async(std::launch::async, [&] { return cluster->task(0).Pull(request, &recorder); });
  SimWorker w0(cluster.get(), 0);
  ASSERT_EQ(*w0.Push(0, std::vector<float>(big + 3, 0.5f)), Outcome::kAccepted);
  ASSERT_EQ(pull.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_TRUE(pull.get().ok());
  EXPECT_EQ(recorder.step_, 1);
  EXPECT_EQ(order, std::vector<uint32_t>({0, 0, 0, 0, 1}));  // four chunks of 'w', then 'b'
  EXPECT_EQ(flat, std::vector<float>(big + 3, 0.5f));
}

TEST(SyncTest, ManyWorkersManyStepsStayConsistent) {
  // 4 workers, R=3: every step has exactly 3 distinct contributors and the step count is exact.
  constexpr int kSteps = 30;
  DecisionRecorder recorder;
  SimClusterOptions o = OneTask(4, 3, {1, 2, 3, 4, 5});
  o.on_step_applied = recorder.Hook();
  auto cluster = *SimCluster::Start(o);
  std::atomic<int64_t> pushes{0};
  std::vector<std::thread> threads;
  for (int id = 0; id < 4; ++id) {
    threads.emplace_back([&, id] {
      SimWorker w(cluster.get(), id);
      std::vector<float> params;
      int64_t step = *w.Pull(0, 0, &params);
      while (step < kSteps) {
        ASSERT_TRUE(w.Push(step, testing::TestGradient(id, step, params)).ok());
        ++pushes;
        absl::StatusOr<int64_t> next = w.Pull(step + 1, step, &params);
        ASSERT_TRUE(next.ok()) << next.status();
        step = *next;
      }
      ASSERT_TRUE(w.Done().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(cluster->task(0).finished());
  EXPECT_EQ(cluster->task(0).step(), kSteps);
  std::vector<StepDecision> decisions = recorder.decisions();
  ASSERT_EQ(decisions.size(), static_cast<size_t>(kSteps));
  int64_t applied = 0, dropped = 0, duplicates = 0;
  for (const StepDecision& d : decisions) {
    std::vector<int> sorted = d.workers;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), 3) << "step " << d.step;
  }
  const TrainingStats stats = *cluster->task(0).GetStats();
  for (const WorkerStats& w : stats.workers) {
    applied += w.applied;
    dropped += w.dropped_backup + w.dropped_stale;
    duplicates += w.duplicates;
  }
  EXPECT_EQ(applied, 3 * kSteps);
  EXPECT_EQ(duplicates, 0);
  EXPECT_EQ(applied + dropped, pushes.load());  // every push was either applied or dropped
}

// A push wakes no pull it does not concern. Pulls waiting for a step used to wait on one condition variable that
// every push signalled, so with W workers each push woke every waiting pull (64 sync workers on one task: 76
// context switches per push, a third more of the task's CPU per push than at 8 workers). Here 47 workers push one
// by one, each then pulling the next step, which waits for the 48th: the pulls already waiting must sleep
// through the pushes that follow. Counted as the process's voluntary context switches (a woken waiter that finds
// nothing to do blocks again: one switch each time): 46 + 45 + ... + 1 = 1,081 if every push woke every waiting
// pull; what remains is each pull thread blocking once and the pushing thread's pauses (~100).
TEST(SyncTest, AWaitingPullIsNotWokenByOtherWorkersPushes) {
  constexpr int kWorkers = 48;
  auto cluster = *SimCluster::Start(OneTask(kWorkers, kWorkers, {1, 2, 3, 4}));
  std::vector<std::unique_ptr<SimWorker>> workers;
  for (int w = 0; w < kWorkers; ++w) workers.push_back(std::make_unique<SimWorker>(cluster.get(), w));
  const auto switches = [] {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return static_cast<int64_t>(u.ru_nvcsw);
  };
  std::vector<std::future<absl::StatusOr<int64_t>>> pulls;
  const int64_t before = switches();
  for (int w = 0; w + 1 < kWorkers; ++w) {
    ASSERT_EQ(*workers[w]->Push(0, {1, 0, -1, 2}), Outcome::kAccepted);
    pulls.push_back(std::async(std::launch::async, [&, w] {
      std::vector<float> params;
      return workers[w]->Pull(1, 0, &params);
    }));
    // Long enough for a woken pull to find nothing to do and wait again before the next push.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
  }
  const int64_t during = switches() - before;
  ::testing::Test::RecordProperty("voluntary_context_switches", std::to_string(during));
  EXPECT_EQ(cluster->task(0).step(), 0);
  for (auto& pull : pulls) {
    EXPECT_EQ(pull.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);  // all still waiting
  }
  EXPECT_LT(during, 400) << "voluntary context switches while " << kWorkers - 1
                         << " pushes arrived and their pulls waited: waiting pulls were woken by other pushes";
  ASSERT_EQ(*workers[kWorkers - 1]->Push(0, {1, 0, -1, 2}), Outcome::kAccepted);
  for (auto& pull : pulls) {
    ASSERT_EQ(pull.wait_for(std::chrono::seconds(20)), std::future_status::ready);
    absl::StatusOr<int64_t> step = pull.get();
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 1);
  }
}

}  // namespace
}  // namespace dtrain::ps
