// ParameterServer with sparse embedding tables, by direct calls: sync steps sum each row over the step's workers
// and divide by R (a row one worker touched too), async applies each push, retries and duplicates apply once,
// wrong ids are refused, NaN rows follow --nonfinite, a task may hold only tables, a rollback drops buffered
// rows, checkpoints restore the rows, and the statistics count rows and bytes (ids included).
#include <algorithm>
#include <future>
#include <map>
#include <set>
#include <string>
#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_test_util.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::Pulled;
using ::dtrain::ps::testing::PullSlices;
using ::dtrain::ps::testing::PushSlices;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SparseRows;
using Outcome = PushResponse::Outcome;

constexpr int kDim = 2;

// One dense variable "w" (2 floats) and a hash table of dim 2 whose rows start at 0 (init_scale 0), both sgd.
SimClusterOptions Options(const std::string& mode, int workers, int num_ps = 1) {
  SimClusterOptions o;
  o.variables = {{"w", 2}};
  o.num_ps = num_ps;
  o.config = MakeConfig(mode, workers, workers, /*learning_rate=*/0.5f);
  SparseTableSpec t;
  t.table = 0;
  t.name = "emb";
  t.dim = kDim;
  t.init_scale = 0.0f;
  o.config.tables = {t};
  o.config.sparse_optimizer.name = "sgd";
  o.config.sparse_optimizer.learning_rate = 1.0f;
  o.initial = {1.0f, 2.0f};
  return o;
}

// Ids 0.. owned by ps task `task` of `num_ps`.
std::vector<int64_t> IdsOf(int task, int num_ps, int n, int64_t from = 0) {
  std::vector<int64_t> ids;
  for (int64_t id = from; static_cast<int>(ids.size()) < n; ++id) {
    if (ShardOfId(id, num_ps) == task) ids.push_back(id);
  }
  return ids;
}

PullRequest Pull(SimCluster* c, int task, int worker, int64_t min_step, std::vector<int64_t> ids) {
  PullRequest r;
  r.worker_id = worker;
  r.session = c->Session(task, worker);
  r.min_step = min_step;
  r.since_step = std::max<int64_t>(0, min_step - 1);
  r.timeout_ms = 10000;
  if (!ids.empty()) r.sparse = {SparseIds{0, std::move(ids)}};
  return r;
}

absl::StatusOr<std::vector<float>> Rows(SimCluster* c, int task, int worker, int64_t min_step,
                                        std::vector<int64_t> ids) {
  absl::StatusOr<Pulled> p = PullSlices(c->task(task), Pull(c, task, worker, min_step, std::move(ids)));
  if (!p.ok()) return p.status();
  return p->rows[0];
}

PushHeader Header(SimCluster* c, int task, int worker, int64_t step, uint64_t request_id) {
  PushHeader h;
  h.worker_id = worker;
  h.step = step;
  h.request_id = request_id;
  h.commit = task == 0;
  h.session = c->Session(task, worker);
  return h;
}

TEST(SparseParameterServerTest, SyncSumsEachRowOverTheWorkersAndDividesByR) {
  auto cluster = *SimCluster::Start(Options("sync", 2));
  SimCluster* c = cluster.get();
  ASSERT_EQ(*Rows(c, 0, 0, 0, {1, 2}), std::vector<float>({0, 0, 0, 0}));
  ASSERT_EQ(*Rows(c, 0, 1, 0, {2, 3}), std::vector<float>({0, 0, 0, 0}));
  const PushHeader h0 = Header(c, 0, 0, 0, 10), h1 = Header(c, 0, 1, 0, 11);
  EXPECT_EQ(PushSlices(c->task(0), h0, {{0, {1, 1}}}, {SparseRows{0, {1, 2}, {1, 1, 2, 2}}})->outcome,
            Outcome::kAccepted);
  EXPECT_EQ(c->task(0).step(), 0);
  EXPECT_EQ(PushSlices(c->task(0), h1, {{0, {3, 3}}}, {SparseRows{0, {2, 3}, {4, 4, 8, 8}}})->outcome,
            Outcome::kAccepted);
  EXPECT_EQ(c->task(0).step(), 1);
  absl::StatusOr<Pulled> p = PullSlices(c->task(0), Pull(c, 0, 0, 1, {3, 1, 2, 4}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->header.step, 1);
  EXPECT_EQ(p->slices[0], std::vector<float>({0.0f, 1.0f}));  // 1 - 0.5 * 2, 2 - 0.5 * 2
  // Row 1 (worker 0 only) and row 3 (worker 1 only) are divided by R = 2 all the same; id 4 is new.
  EXPECT_EQ(p->rows[0], std::vector<float>({-4, -4, -0.5f, -0.5f, -3, -3, 0, 0}));
  const TrainingStats stats = *c->task(0).GetStats();
  ASSERT_EQ(stats.tables.size(), 1u);
  EXPECT_EQ(stats.tables[0].name, "emb");
  EXPECT_EQ(stats.tables[0].rows, 4);
  EXPECT_EQ(stats.tables[0].updates, 3);
  EXPECT_EQ(stats.tables[0].lookups, 8);
  EXPECT_TRUE(c->task(0).accounting().Balanced()) << c->task(0).accounting().DebugString();
}

TEST(SparseParameterServerTest, AsyncAppliesEachPushAsItFinishes) {
  auto cluster = *SimCluster::Start(Options("async", 2));
  SimCluster* c = cluster.get();
  ASSERT_TRUE(Rows(c, 0, 0, 0, {7}).ok());
  EXPECT_EQ(PushSlices(c->task(0), Header(c, 0, 0, 0, 1), {{0, {0, 0}}}, {SparseRows{0, {7}, {1, 2}}})->outcome,
            Outcome::kAccepted);
  EXPECT_EQ(*Rows(c, 0, 1, 0, {7}), std::vector<float>({-1, -2}));
  EXPECT_EQ(PushSlices(c->task(0), Header(c, 0, 1, 0, 2), {{0, {0, 0}}}, {SparseRows{0, {7}, {1, 1}}})->outcome,
            Outcome::kAccepted);
  EXPECT_EQ(*Rows(c, 0, 0, 0, {7}), std::vector<float>({-2, -3}));
}

TEST(SparseParameterServerTest, RetriesAndDuplicatesApplyOnce) {
  auto cluster = *SimCluster::Start(Options("sync", 1));
  SimCluster* c = cluster.get();
  ASSERT_TRUE(Rows(c, 0, 0, 0, {1, 2}).ok());
  const PushHeader h = Header(c, 0, 0, 0, 5);
  {
    // A first attempt that breaks off after its rows: the retry sends them again (not a repeat).
    absl::StatusOr<std::unique_ptr<SliceUpload>> first = c->task(0).StartPush(h);
    ASSERT_TRUE(first.ok());
    const int64_t ids[] = {1, 2};
    const float rows[] = {9, 9, 9, 9};
    ASSERT_TRUE((*first)->WriteSparse(0, ids, 2, kDim, WireDtype::kF32, rows).ok());
  }
  EXPECT_EQ(PushSlices(c->task(0), h, {{0, {0, 0}}}, {SparseRows{0, {1, 2}, {1, 1, 2, 2}}})->outcome,
            Outcome::kAccepted);
  EXPECT_EQ(PushSlices(c->task(0), h, {{0, {0, 0}}}, {SparseRows{0, {1, 2}, {1, 1, 2, 2}}})->outcome,
            Outcome::kDuplicate);
  EXPECT_EQ(*Rows(c, 0, 0, 1, {1, 2}), std::vector<float>({-1, -1, -2, -2}));
  // Every push delivered twice (a retry after a lost reply): once.
  FaultInjectingPs twice(&c->task(0), {/*duplicate_pushes=*/true});
  EXPECT_EQ(PushSlices(twice, Header(c, 0, 0, 1, 6), {{0, {0, 0}}}, {SparseRows{0, {1}, {1, 1}}})->outcome,
            Outcome::kAccepted);
  EXPECT_EQ(*Rows(c, 0, 0, 2, {1}), std::vector<float>({-2, -2}));
  // An id twice in one push is refused.
  absl::StatusOr<PushResponse> repeated =
      PushSlices(c->task(0), Header(c, 0, 0, 2, 7), {{0, {0, 0}}}, {SparseRows{0, {3, 3}, {1, 1, 1, 1}}});
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(repeated.status().message(), "repeated within one push")) << repeated.status();
  EXPECT_TRUE(c->task(0).accounting().Balanced()) << c->task(0).accounting().DebugString();
}

TEST(SparseParameterServerTest, IdsOfAnotherTaskAndBadRowsAreRefused) {
  auto cluster = *SimCluster::Start(Options("async", 1, /*num_ps=*/2));
  SimCluster* c = cluster.get();
  const std::vector<int64_t> theirs = IdsOf(1, 2, 1);
  absl::Status s = Rows(c, 0, 0, 0, theirs).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(s.message(), "belongs to ps task 1")) << s;
  PullRequest twice = Pull(c, 0, 0, 0, IdsOf(0, 2, 1));
  twice.sparse.push_back(twice.sparse[0]);
  EXPECT_EQ(PullSlices(c->task(0), twice).status().code(), absl::StatusCode::kInvalidArgument);
  PullRequest no_table = Pull(c, 0, 0, 0, IdsOf(0, 2, 1));
  no_table.sparse[0].table = 3;
  EXPECT_EQ(PullSlices(c->task(0), no_table).status().code(), absl::StatusCode::kInvalidArgument);
  // Pushes: another task's id, a wrong dim.
  const std::vector<int64_t> mine = IdsOf(0, 2, 1);
  absl::StatusOr<std::unique_ptr<SliceUpload>> up = c->task(0).StartPush(Header(c, 0, 0, 0, 1));
  ASSERT_TRUE(up.ok());
  const float rows[] = {1, 1, 1};
  EXPECT_EQ((*up)->WriteSparse(0, theirs.data(), 1, kDim, WireDtype::kF32, rows).code(),
            absl::StatusCode::kInvalidArgument);
  up = c->task(0).StartPush(Header(c, 0, 0, 0, 2));
  const absl::Status dim = (*up)->WriteSparse(0, mine.data(), 1, 3, WireDtype::kF32, rows);
  EXPECT_EQ(dim.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(dim.message(), "the table has 2")) << dim;
  EXPECT_EQ((*up)->Finish().status().code(), absl::StatusCode::kInvalidArgument);
}

// The ids of a push are read once: what is checked (the task owns them) is what is stored. A worker whose ids
// change while the ps reads them (shared memory lends them in place) cannot slip another task's id past the check.
TEST(SparseParameterServerTest, IdsChangedAfterTheirCheckAreNeverStored) {
  auto cluster = *SimCluster::Start(Options("async", 1, /*num_ps=*/2));
  SimCluster* c = cluster.get();
  const int64_t mine = IdsOf(0, 2, 1)[0], theirs = IdsOf(1, 2, 1)[0];
  ASSERT_TRUE(Rows(c, 0, 0, 0, {mine}).ok());  // its row exists: a gradient for it is applied
  int64_t slot = mine;
  std::atomic<bool> stop{false};
  std::thread flipper([&] {
    volatile int64_t* v = &slot;
    while (!stop.load(std::memory_order_relaxed)) {
      *v = theirs;
      *v = mine;
    }
  });
  const float rows[kDim] = {0.5f, 0.5f};
  // At least 4,000 pushes, and until both kinds were seen (at most 10 s): on one core the flipper runs only
  // between the pushes (each yields to it), and may well stop at the same value for a whole time slice.
  int accepted = 0, refused = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (uint64_t i = 0; i < 4000 || ((accepted == 0 || refused == 0) && absl::Now() < deadline); ++i) {
    absl::StatusOr<std::unique_ptr<SliceUpload>> up = c->task(0).StartPush(Header(c, 0, 0, 0, 100 + i));
    ASSERT_TRUE(up.ok()) << up.status();
    const float w[2] = {0, 0};
    (*up)->Write(0, 0, 2, WireDtype::kF32, w).IgnoreError();  // where task 0 holds "w"
    if ((*up)->WriteSparse(0, &slot, 1, kDim, WireDtype::kF32, rows).ok()) {
      accepted += (*up)->Finish().ok() ? 1 : 0;
    } else {
      ++refused;  // theirs, seen: refused
    }
    if (i % 64 == 0) std::this_thread::yield();
  }
  stop = true;
  flipper.join();
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
  absl::StatusOr<TrainingStats> stats = c->task(0).GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->tables[0].rows, 1);
  // Another task's id past the check would be a gradient for a row this task has not (dropped, counted).
  EXPECT_EQ(stats->tables[0].dropped_gradients, 0) << "an id ps task 0 does not own got past its check";
}

// What one push may make a task hold is bounded (--max_push_rows): past it the push is refused with the limit
// named, before its ids are copied (a count no memory could hold included); the run goes on for the others.
TEST(SparseParameterServerTest, APushPastMaxPushRowsIsRefusedNamingTheLimit) {
  SimClusterOptions o = Options("async", 1);
  o.max_push_rows = 4;
  auto cluster = *SimCluster::Start(o);
  SimCluster* c = cluster.get();
  const std::vector<int64_t> ids = {1, 2, 3, 4, 5};
  const std::vector<float> rows(ids.size() * kDim, 0.5f);
  absl::StatusOr<std::unique_ptr<SliceUpload>> up = c->task(0).StartPush(Header(c, 0, 0, 0, 1));
  ASSERT_TRUE(up.ok());
  absl::Status s = (*up)->WriteSparse(0, ids.data(), 5, kDim, WireDtype::kF32, rows.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "more than 4 rows of sparse table 'emb'")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--max_push_rows")) << s;
  // Spread over two writes of one push: the second goes past.
  up = c->task(0).StartPush(Header(c, 0, 0, 0, 2));
  ASSERT_TRUE((*up)->WriteSparse(0, ids.data(), 3, kDim, WireDtype::kF32, rows.data()).ok());
  EXPECT_EQ((*up)->WriteSparse(0, ids.data() + 3, 2, kDim, WireDtype::kF32, rows.data()).code(),
            absl::StatusCode::kResourceExhausted);
  // A count no memory could hold: refused, nothing read.
  up = c->task(0).StartPush(Header(c, 0, 0, 0, 3));
  EXPECT_EQ((*up)->WriteSparse(0, ids.data(), std::numeric_limits<int64_t>::max(), kDim, WireDtype::kF32,
                               rows.data()).code(),
            absl::StatusCode::kResourceExhausted);
  // Within the limit, it goes on.
  EXPECT_EQ(PushSlices(c->task(0), Header(c, 0, 0, 0, 4), {{0, {0, 0}}}, {SparseRows{0, {1, 2, 3, 4}, rows}})
                ->outcome,
            Outcome::kAccepted);
}

// The same for pulls: one peer cannot make the task copy and answer rows without bound.
TEST(SparseParameterServerTest, APullPastMaxPullRowsIsRefusedNamingTheLimit) {
  SimClusterOptions o = Options("async", 1);
  o.max_pull_rows = 4;
  auto cluster = *SimCluster::Start(o);
  SimCluster* c = cluster.get();
  absl::StatusOr<std::vector<float>> r = Rows(c, 0, 0, 0, {1, 2, 3, 4, 5});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "for 5 rows of sparse table 0, more than 4")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "--max_pull_rows")) << r.status();
  EXPECT_TRUE(Rows(c, 0, 0, 0, {1, 2, 3, 4}).ok());
}

TEST(SparseParameterServerTest, NonFiniteRowsFollowTheNonFinitePolicy) {
  SimClusterOptions o = Options("sync", 2);
  auto cluster = *SimCluster::Start(o);
  SimCluster* c = cluster.get();
  ASSERT_TRUE(Rows(c, 0, 0, 0, {1}).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<PushResponse> r =
      PushSlices(c->task(0), Header(c, 0, 0, 0, 1), {{0, {0, 0}}}, {SparseRows{0, {1}, {nan, 1}}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "NaN or Inf in 'emb'")) << r.status();
  EXPECT_EQ(c->task(0).GetStats()->workers[0].nonfinite, 1);
  EXPECT_TRUE(c->task(0).accounting().Balanced()) << c->task(0).accounting().DebugString();
}

// Two ps tasks, the dense variable on task 0 only: task 1 holds nothing but its shard of the table, and still
// applies the relayed decisions to it.
TEST(SparseParameterServerTest, ATaskMayHoldOnlyTables) {
  auto cluster = *SimCluster::Start(Options("sync", 1, /*num_ps=*/2));
  SimCluster* c = cluster.get();
  ASSERT_TRUE(c->placement().task_slices[1].empty());
  const std::vector<int64_t> ids0 = IdsOf(0, 2, 2), ids1 = IdsOf(1, 2, 2);
  ASSERT_TRUE(Rows(c, 0, 0, 0, ids0).ok());
  ASSERT_TRUE(Rows(c, 1, 0, 0, ids1).ok());
  EXPECT_EQ(PushSlices(c->task(1), Header(c, 1, 0, 0, 3), {}, {SparseRows{0, ids1, {1, 2, 3, 4}}})->outcome,
            Outcome::kAccepted);
  EXPECT_EQ(PushSlices(c->task(0), Header(c, 0, 0, 0, 3), {{0, {0, 0}}}, {SparseRows{0, ids0, {5, 6, 7, 8}}})->outcome,
            Outcome::kAccepted);
  absl::StatusOr<Pulled> p0 = PullSlices(c->task(0), Pull(c, 0, 0, 1, ids0));
  ASSERT_TRUE(p0.ok()) << p0.status();
  EXPECT_EQ(p0->rows[0], std::vector<float>({-5, -6, -7, -8}));
  ASSERT_EQ(p0->header.decisions.size(), 1u);
  PullRequest r1 = Pull(c, 1, 0, 1, ids1);
  r1.decisions = p0->header.decisions;
  absl::StatusOr<Pulled> p1 = PullSlices(c->task(1), r1);
  ASSERT_TRUE(p1.ok()) << p1.status();
  EXPECT_EQ(p1->header.step, 1);
  EXPECT_TRUE(p1->slices.empty());
  EXPECT_EQ(p1->rows[0], std::vector<float>({-1, -2, -3, -4}));
}

TEST(SparseParameterServerTest, CheckpointsHoldTheRowsAndARollbackDropsBufferedOnes) {
  ScratchDir dir("sparse_ckpt");
  SimClusterOptions o = Options("sync", 2);
  o.config.sparse_optimizer.name = "adagrad";
  o.config.tables[0].init_scale = 0.1f;
  o.checkpoint.dir = dir.path();
  o.checkpoint.save_steps = 1;
  std::vector<float> after_one;
  {
    auto cluster = *SimCluster::Start(o);
    SimCluster* c = cluster.get();
    ASSERT_TRUE(Rows(c, 0, 0, 0, {1, 2, 3}).ok());
    for (int w = 0; w < 2; ++w) {
      ASSERT_EQ(PushSlices(c->task(0), Header(c, 0, w, 0, 100 + w), {{0, {1, 1}}},
                           {SparseRows{0, {1, 2}, {1, 2, 3, 4}}})->outcome,
                Outcome::kAccepted);
    }
    after_one = *Rows(c, 0, 0, 1, {1, 2, 3});
    // Worker 0's gradient for step 1 is buffered when the chief rolls the task back to step 1.
    ASSERT_EQ(PushSlices(c->task(0), Header(c, 0, 0, 1, 200), {{0, {1, 1}}},
                         {SparseRows{0, {1}, {100, 100}}})->outcome,
              Outcome::kAccepted);
    TrainConfig config = c->config();
    config.slices = c->placement().task_slices[0];
    ASSERT_TRUE(c->task(0).Restore(config, 0, 1).ok());
    EXPECT_EQ(*Rows(c, 0, 0, 1, {1, 2, 3}), after_one);
    for (int w = 0; w < 2; ++w) {
      ASSERT_EQ(PushSlices(c->task(0), Header(c, 0, w, 1, 300 + w), {{0, {0, 0}}},
                           {SparseRows{0, {3}, {0.5f, 0.5f}}})->outcome,
                Outcome::kAccepted);
    }
    const std::vector<float> rows = *Rows(c, 0, 0, 2, {1, 3});
    EXPECT_EQ(rows[0], after_one[0]);  // worker 0's buffered 100 never applied
    EXPECT_NE(rows[2], after_one[4]);
    EXPECT_TRUE(c->task(0).accounting().Balanced()) << c->task(0).accounting().DebugString();
  }
  // A new process restores the newest checkpoint (step 2), rows and accumulators.
  absl::StatusOr<CheckpointData> saved =
      ReadCheckpoint(Env::Default(), CheckpointPath(dir.path(), 1, 0, 1));
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->tables.size(), 1u);
  EXPECT_EQ(saved->tables[0].ids.size(), 3u);
  EXPECT_EQ(saved->sparse_optimizer, "adagrad");
  auto resumed = *SimCluster::Start(o);
  EXPECT_EQ(resumed->restored_step(), 2);
  EXPECT_EQ(resumed->task(0).GetStats()->tables[0].rows, 3);
  // Another table config is refused, naming the difference.
  SimClusterOptions other = o;
  other.config.tables[0].dim = 3;
  absl::StatusOr<std::unique_ptr<SimCluster>> refused = SimCluster::Start(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "dim 2 vs 3")) << refused.status();
}

TEST(SparseParameterServerTest, BytesCountTheIdsAndTheRows) {
  auto cluster = *SimCluster::Start(Options("async", 1));
  SimCluster* c = cluster.get();
  const TrainingStats before = *c->task(0).GetStats();
  ASSERT_TRUE(Rows(c, 0, 0, 0, {1, 2, 3}).ok());  // 3 ids up, 3 rows and 2 floats down
  ASSERT_TRUE(PushSlices(c->task(0), Header(c, 0, 0, 0, 1), {{0, {0, 0}}}, {SparseRows{0, {1, 2}, {1, 1, 1, 1}}})
                  .ok());
  const TrainingStats after = *c->task(0).GetStats();
  EXPECT_EQ(after.bytes_received - before.bytes_received, 3 * 8 + 2 * 4 + 2 * (8 + kDim * 4));
  EXPECT_EQ(after.bytes_sent - before.bytes_sent, 2 * 4 + 3 * kDim * 4);
}

}  // namespace
}  // namespace dtrain::ps

namespace dtrain::ps {
namespace {

// Evaluation reads rows without changing a table (PullRequest::sparse_read_only): ids without a row read as the
// row a training pull would create (their initializer), and no row is created, counted or made recent; a
// training pull of the same ids then creates them with the same values.
TEST(ParameterServerSparseTest, ReadOnlyPullLeavesTheTableAsItWas) {
  SimClusterOptions o = Options("sync", 1);
  o.config.tables[0].init_scale = 0.5f;
  o.config.tables[0].init_seed = 7;
  absl::StatusOr<std::unique_ptr<SimCluster>> c = SimCluster::Start(o);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<int64_t> ids = {3, 11, 42};
  PullRequest peek = Pull(c->get(), 0, 0, 0, ids);
  peek.sparse_read_only = true;
  absl::StatusOr<Pulled> read = PullSlices((*c)->task(0), peek);
  ASSERT_TRUE(read.ok()) << read.status();
  absl::StatusOr<TrainingStats> stats = (*c)->task(0).GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->tables[0].rows, 0);
  EXPECT_EQ(stats->tables[0].created, 0);
  EXPECT_EQ(stats->tables[0].lookups, 0);
  // A training pull creates the rows, with exactly the values evaluation read.
  absl::StatusOr<std::vector<float>> trained = Rows(c->get(), 0, 0, 0, ids);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(read->rows[0], *trained);
  stats = (*c)->task(0).GetStats();
  EXPECT_EQ(stats->tables[0].rows, 3);
  // Read-only again: the rows exist now and read as they are; the count stays.
  peek = Pull(c->get(), 0, 0, 0, ids);  // the worker's new session (Rows registered it again)
  peek.sparse_read_only = true;
  read = PullSlices((*c)->task(0), peek);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->rows[0], *trained);
  EXPECT_EQ((*c)->task(0).GetStats()->tables[0].rows, 3);
}

// The hybrid (sparse_mode "async", PERSIA's): each push's rows are applied when it arrives, scaled by 1/R, while
// the dense variables wait for the step; with sgd the rows end where a sync step puts them.
TEST(SparseParameterServerTest, HybridAppliesEachPushsRowsAtOnceAndTheSlicesWithTheStep) {
  SimClusterOptions o = Options("sync", 2);
  o.config.sparse_mode = "async";
  auto cluster = *SimCluster::Start(o);
  SimCluster* c = cluster.get();
  ASSERT_TRUE(Rows(c, 0, 0, 0, {1, 2}).ok());
  EXPECT_EQ(PushSlices(c->task(0), Header(c, 0, 0, 0, 10), {{0, {1, 1}}}, {SparseRows{0, {1, 2}, {1, 1, 2, 2}}})->outcome,
            Outcome::kAccepted);
  EXPECT_EQ(c->task(0).step(), 0);  // the step waits for worker 1
  // Worker 1 reads worker 0's rows already (its pull does not wait for the step's rows); the slices are unchanged.
  absl::StatusOr<Pulled> early = PullSlices(c->task(0), Pull(c, 0, 1, 0, {1, 2, 3}));
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_EQ(early->rows[0], std::vector<float>({-0.5f, -0.5f, -1, -1, 0, 0}));
  EXPECT_EQ(early->slices[0], std::vector<float>({1, 2}));
  EXPECT_EQ(PushSlices(c->task(0), Header(c, 0, 1, 0, 11), {{0, {3, 3}}}, {SparseRows{0, {2, 3}, {4, 4, 8, 8}}})->outcome,
            Outcome::kAccepted);
  absl::StatusOr<Pulled> p = PullSlices(c->task(0), Pull(c, 0, 0, 1, {3, 1, 2}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->slices[0], std::vector<float>({0.0f, 1.0f}));
  EXPECT_EQ(p->rows[0], std::vector<float>({-4, -4, -0.5f, -0.5f, -3, -3}));  // as sync: (sum over workers) / 2
  SimClusterOptions bad = Options("sync", 1);
  bad.config.sparse_mode = "sometimes";
  EXPECT_EQ(SimCluster::Start(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// A pull in parts (a transport striping it over connections): part k of N delivers the slices whose index is k
// modulo N, the rows only in part 0; together they deliver everything once. A bad part is refused.
TEST(SparseParameterServerTest, PullPartsDeliverDisjointSlicesAndTheRowsOnce) {
  SimClusterOptions o = Options("sync", 1);
  o.variables = {{"a", 2}, {"b", 3}, {"c", 1}, {"d", 4}, {"e", 2}};
  o.placement.min_slice_bytes = 0;
  o.initial = std::vector<float>(12, 1.0f);
  auto cluster = *SimCluster::Start(o);
  std::set<uint32_t> seen;
  int with_rows = 0;
  for (int part = 0; part < 3; ++part) {
    PullRequest r = Pull(cluster.get(), 0, 0, 0, {5, 6});
    r.part = part;
    r.parts = 3;
    absl::StatusOr<Pulled> p = PullSlices(cluster->task(0), r);
    ASSERT_TRUE(p.ok()) << p.status();
    std::set<uint32_t> keys;
    for (const auto& [key, values] : p->slices) keys.insert(key);
    std::set<uint32_t> want;
    for (uint32_t key = part; key < 5; key += 3) want.insert(key);
    EXPECT_EQ(keys, want) << "part " << part;
    seen.insert(keys.begin(), keys.end());
    with_rows += p->rows.count(0) > 0 && p->rows.at(0).size() == 2 * kDim;
  }
  EXPECT_EQ(seen.size(), 5u);
  EXPECT_EQ(with_rows, 1);
  for (auto [part, parts] : std::vector<std::pair<int, int>>{{1, 1}, {-1, 2}, {0, 0}, {0, kMaxPullParts + 1}}) {
    PullRequest r = Pull(cluster.get(), 0, 0, 0, {});
    r.part = part;
    r.parts = parts;
    EXPECT_EQ(PullSlices(cluster->task(0), r).status().code(), absl::StatusCode::kInvalidArgument)
        << part << " of " << parts;
  }
}

}  // namespace
}  // namespace dtrain::ps
