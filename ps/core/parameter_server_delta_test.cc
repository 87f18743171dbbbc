// ParameterServer deltas, expiry and 16-bit rows through the protocol: after every delta the snapshot-less chain of
// deltas of each task equals that task's state bit for bit (sync, 2 ps tasks: the deltas of one step across the
// tasks; async); a task killed and started again restores its newest checkpoint plus the deltas after it, so it
// loses at most one delta interval; rows expired by the ps leave the deltas' state too.
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_test_util.h"
#include "ps/checkpoint/delta_chain.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::SameBits;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;

constexpr int kDim = 3;

SimClusterOptions Options(const std::string& mode, int workers, int num_ps, const std::string& dir) {
  SimClusterOptions o;
  o.variables = {{"w", 5}, {"b", 3}};
  o.num_ps = num_ps;
  o.config = MakeConfig(mode, workers, workers, /*learning_rate=*/0.1f);
  SparseTableSpec t;
  t.name = "emb";
  t.dim = kDim;
  t.init_scale = 0.1f;
  o.config.tables = {t};
  o.config.sparse_optimizer.name = "adagrad";
  o.config.sparse_optimizer.learning_rate = 0.05f;
  o.initial = {1, 2, 3, 4, 5, 6, 7, 8};
  o.delta.dir = dir;
  o.delta.every_steps = 1;
  return o;
}

// One worker's step through its WorkerClient: pull the parameters and the rows of `ids`, push gradients that
// depend on them.
struct Worker {
  Worker(SimCluster* c, int id) {
    std::vector<PsInterface*> tasks;
    for (int t = 0; t < c->num_ps(); ++t) tasks.push_back(&c->task(t));
    WorkerClientOptions o;
    o.background = false;
    client = std::make_unique<WorkerClient>(tasks, c->placement().task_slices, id, id == 0, o);
    EXPECT_TRUE(client->Connect(c->config(), c->initial().data(), absl::Seconds(5)).ok());
    params.resize(c->total_floats());
  }
  absl::Status Step(int64_t min_step, int64_t step, const std::vector<int64_t>& ids, bool sync) {
    std::vector<float> rows(ids.size() * kDim);
    absl::StatusOr<PullResult> at =
        client->Pull(sync ? min_step : 0, min_step, params.data(), {{0, ids.data(), (int64_t)ids.size(), rows.data()}});
    if (!at.ok()) return at.status();
    std::vector<float> grads(params.size()), row_grads(rows.size());
    for (size_t i = 0; i < params.size(); ++i) grads[i] = 0.1f * params[i] - 0.01f * static_cast<float>(i + step);
    for (size_t i = 0; i < rows.size(); ++i) row_grads[i] = rows[i] + 0.02f * static_cast<float>(i % 5) - 0.03f;
    return client->Push(step, grads.data(), {{0, ids.data(), (int64_t)ids.size(), row_grads.data()}}).status();
  }
  std::unique_ptr<WorkerClient> client;
  std::vector<float> params;
};

// A moving window of ids, some repeated from earlier steps.
std::vector<int64_t> IdsAt(int64_t step, int worker) {
  std::vector<int64_t> ids;
  for (int64_t id = step * 7 + worker; id < step * 7 + 40; id += 1 + (id % 3)) ids.push_back(id);
  return ids;
}

// The state of every table as id -> values and slots.
std::map<int64_t, std::vector<float>> Rows(const CheckpointData& d) {
  std::map<int64_t, std::vector<float>> m;
  const SparseTableState& t = d.tables[0];
  for (size_t i = 0; i < t.ids.size(); ++i) {
    std::vector<float> row(t.values.begin() + i * kDim, t.values.begin() + (i + 1) * kDim);
    for (const auto& s : t.slots) row.insert(row.end(), s.begin() + i * kDim, s.begin() + (i + 1) * kDim);
    m[t.ids[i]] = row;
  }
  return m;
}

void ExpectSameState(const CheckpointData& a, const CheckpointData& b, const std::string& where) {
  EXPECT_EQ(a.global_step, b.global_step) << where;
  ASSERT_EQ(a.slices.size(), b.slices.size()) << where;
  for (size_t i = 0; i < a.slices.size(); ++i) {
    EXPECT_TRUE(SameBits(a.slices[i].values, b.slices[i].values)) << where << " slice " << i;
  }
  const auto ra = Rows(a), rb = Rows(b);
  ASSERT_EQ(ra.size(), rb.size()) << where;
  for (const auto& [id, row] : ra) {
    auto it = rb.find(id);
    ASSERT_NE(it, rb.end()) << where << " id " << id;
    EXPECT_TRUE(SameBits(row, it->second)) << where << " id " << id;
  }
}

// What the deltas alone (no snapshot) rebuild for task t.
CheckpointData FromDeltas(SimCluster* c, int t, const std::string& dir) {
  TrainConfig config = c->config();
  config.slices = c->placement().task_slices[t];
  absl::StatusOr<std::optional<RestorableCheckpoint>> r =
      FindStateToRestore(Env::Default(), "", dir, config, t, c->num_ps(), kRestoreNewest);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->has_value());
  return (*r)->data;
}

TEST(ParameterServerDeltaTest, SyncDeltasOfEveryTaskRebuildItsStateBitForBitAfterEveryStep) {
  ScratchDir dir("ps_delta");
  auto cluster = *SimCluster::Start(Options("sync", 2, /*num_ps=*/2, dir.path()));
  SimCluster* c = cluster.get();
  Worker w0(c, 0), w1(c, 1);
  for (int64_t step = 0; step < 8; ++step) {
    ASSERT_TRUE(w0.Step(step, step, IdsAt(step, 0), true).ok());
    ASSERT_TRUE(w1.Step(step, step, IdsAt(step, 1), true).ok());
    // Task 1 applies the step (and writes its delta) when a pull relays the decision to it.
    ASSERT_TRUE(w0.client->Pull(step + 1, step, w0.params.data()).ok());
    for (int t = 0; t < 2; ++t) {
      c->task(t).FlushDeltas();
      const CheckpointData now = *c->task(t).ExportState();
      ExpectSameState(FromDeltas(c, t, dir.path()), now, absl::StrCat("task ", t, " after step ", step));
    }
  }
  // One delta per step and task, at the same steps on both tasks.
  std::map<int64_t, int> tasks_at;
  const std::vector<DeltaFile> files = *ListDeltaFiles(Env::Default(), dir.path());
  for (const DeltaFile& f : files) ++tasks_at[f.step];
  EXPECT_EQ(tasks_at.size(), 8u);
  for (const auto& [step, n] : tasks_at) EXPECT_EQ(n, 2) << "step " << step;
}

TEST(ParameterServerDeltaTest, AsyncDeltasRebuildTheState) {
  ScratchDir dir("ps_delta_async");
  auto cluster = *SimCluster::Start(Options("async", 1, 1, dir.path()));
  SimCluster* c = cluster.get();
  Worker w(c, 0);
  for (int64_t step = 0; step < 6; ++step) {
    ASSERT_TRUE(w.Step(step, step, IdsAt(step, 0), false).ok());
    c->task(0).FlushDeltas();  // a delta is skipped while the previous one is being written
  }
  ExpectSameState(FromDeltas(c, 0, dir.path()), *c->task(0).ExportState(), "async");
}

TEST(ParameterServerDeltaTest, AKilledTaskRestoresItsCheckpointAndTheDeltasAfterIt) {
  ScratchDir dir("ps_delta_restart");
  SimClusterOptions o = Options("sync", 1, 1, dir.path());
  o.checkpoint.dir = dir.path();
  o.checkpoint.save_steps = 5;
  o.delta.every_steps = 2;
  CheckpointData at_kill;
  {
    auto cluster = *SimCluster::Start(o);
    Worker w(cluster.get(), 0);
    for (int64_t step = 0; step < 13; ++step) {
      ASSERT_TRUE(w.Step(step, step, IdsAt(step, 0), true).ok());
      cluster->task(0).FlushDeltas();  // a delta is skipped while the previous one is being written
      if (step == 11) at_kill = *cluster->task(0).ExportState();  // step 12: the newest delta's state
    }
    cluster->task(0).FlushDeltas();
    // Destroyed without Done: no final checkpoint, as when the process is killed. Step 13 is lost.
  }
  auto again = *SimCluster::Start(o);
  EXPECT_EQ(again->restored_step(), 12);
  EXPECT_EQ(again->task(0).step(), 12);
  ExpectSameState(*again->task(0).ExportState(), at_kill, "restored");
  // The next delta applies to the restored state.
  Worker w(again.get(), 0);
  ASSERT_TRUE(w.Step(12, 12, IdsAt(12, 0), true).ok());
  again->task(0).FlushDeltas();
  ASSERT_TRUE(w.Step(13, 13, IdsAt(13, 0), true).ok());
  again->task(0).FlushDeltas();
  absl::StatusOr<DeltaData> d = ReadDelta(Env::Default(), DeltaPath(dir.path(), 14, 0, 1));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->prev_step, 12);
}

TEST(ParameterServerDeltaTest, ExpiredAndSixteenBitRowsReachTheDeltas) {
  ScratchDir dir("ps_delta_ttl");
  SimClusterOptions o = Options("sync", 1, 1, dir.path());
  o.config.tables[0].ttl_steps = 2;
  o.config.tables[0].row_dtype = RowDtype::kBF16;
  o.config.tables[0].slot_dtype = RowDtype::kBF16;
  auto cluster = *SimCluster::Start(o);
  SimCluster* c = cluster.get();
  Worker w(c, 0);
  for (int64_t step = 0; step < 10; ++step) {
    ASSERT_TRUE(w.Step(step, step, IdsAt(step, 0), true).ok());
    c->task(0).FlushDeltas();
  }
  const TrainingStats stats = *c->task(0).GetStats();
  EXPECT_GT(stats.tables[0].expired, 0);
  const CheckpointData now = *c->task(0).ExportState();
  EXPECT_EQ(static_cast<int64_t>(now.tables[0].ids.size()), stats.tables[0].rows);
  ExpectSameState(FromDeltas(c, 0, dir.path()), now, "ttl");
}

}  // namespace
}  // namespace dtrain::ps
