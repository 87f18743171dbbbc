// Tables with initial values (SparseTableSpec::initial_values, e.g. an ONNX file's embedding initializer): the
// chief's Initialize uploads every row each task owns; rows read back equal the chief's, their optimizer slots
// start fresh; a retried or repeated upload, one after the task is initialized, rows missing, and rows of a table
// without initial values; a restore from a checkpoint skips them; WorkerClient splits them over the tasks.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
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

constexpr int kDim = 2, kRows = 12;

// The file's rows: id i is (i + 0.5, -i).
std::vector<float> FileRows() {
  std::vector<float> v;
  for (int i = 0; i < kRows; ++i) v.insert(v.end(), {i + 0.5f, -static_cast<float>(i)});
  return v;
}

// A dense variable "w" and a [12, 2] table "emb.weight" that starts from FileRows(), adagrad at 0.5.
SimClusterOptions Options(int num_ps, const std::string& mode = "sync") {
  SimClusterOptions o;
  o.variables = {{"w", 2}};
  o.num_ps = num_ps;
  o.config = MakeConfig(mode, 1, 1);
  SparseTableSpec t;
  t.name = "emb.weight";
  t.dim = kDim;
  t.rows = kRows;
  t.initial_values = true;
  o.config.tables = {t};
  o.config.sparse_optimizer.name = "adagrad";
  o.config.sparse_optimizer.learning_rate = 0.5f;
  o.initial = {1.0f, 2.0f};
  o.initial_rows = {InitialRows{0, std::make_shared<const std::vector<float>>(FileRows())}};
  return o;
}

std::vector<int64_t> Owned(int task, int num_ps) {
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < kRows; ++id) {
    if (ShardOfId(id, num_ps) == task) ids.push_back(id);
  }
  return ids;
}

std::vector<float> RowsOf(const std::vector<int64_t>& ids) {
  const std::vector<float> all = FileRows();
  std::vector<float> out;
  for (int64_t id : ids) out.insert(out.end(), all.begin() + id * kDim, all.begin() + (id + 1) * kDim);
  return out;
}

absl::StatusOr<std::vector<float>> Rows(SimCluster* c, int task, int64_t min_step, std::vector<int64_t> ids) {
  PullRequest r;
  r.worker_id = 0;
  r.session = c->Session(task, 0);
  r.min_step = min_step;
  r.since_step = std::max<int64_t>(0, min_step - 1);
  r.timeout_ms = 10000;
  r.sparse = {SparseIds{0, std::move(ids)}};
  absl::StatusOr<Pulled> p = PullSlices(c->task(task), r);
  if (!p.ok()) return p.status();
  return p->rows[0];
}

TEST(InitialRowsTest, EveryTaskHoldsTheChiefsRowsWithFreshSlots) {
  auto cluster = SimCluster::Start(Options(/*num_ps=*/2));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  SimCluster* c = cluster->get();
  for (int t = 0; t < 2; ++t) {
    const std::vector<int64_t> ids = Owned(t, 2);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(*Rows(c, t, 0, ids), RowsOf(ids)) << "task " << t;
    const SparseTableStats stats = c->task(t).GetStats()->tables[0];
    EXPECT_EQ(stats.rows, static_cast<int64_t>(ids.size()));
    EXPECT_EQ(stats.created, static_cast<int64_t>(ids.size()));
  }
  // One adagrad step on a row of task 0: its accumulator starts at 0.1.
  const int64_t id = Owned(0, 2)[0];
  PushHeader h;
  h.step = 0;
  h.request_id = 1;
  h.commit = true;
  h.session = c->Session(0, 0);
  ASSERT_TRUE(PushSlices(c->task(0), h, {{0, {0, 0}}}, {SparseRows{0, {id}, {1, 0}}}).ok());
  const std::vector<float> row = *Rows(c, 0, 1, {id});
  EXPECT_FLOAT_EQ(row[0], id + 0.5f - 0.5f / std::sqrt(1.1f));
  EXPECT_EQ(row[1], -static_cast<float>(id));
}

// The upload itself, on one task: retries, repeats, late and missing rows, and a table without initial values.
TEST(InitialRowsTest, InitializeTakesRowsOnceCompleteAndIgnoresLateOnes) {
  SimClusterOptions o = Options(1);
  SparseTableSpec plain;
  plain.table = 1;
  plain.name = "plain";
  plain.dim = kDim;
  plain.rows = kRows;
  o.config.tables.push_back(plain);
  ParameterServerOptions po;
  auto ps = *ParameterServer::Create(po);
  RegisterRequest reg;
  reg.is_chief = true;
  reg.config = o.config;
  reg.config.slices = {{0, "w", 0, 2}};
  ASSERT_TRUE(ps->Register(reg).ok());
  const float w[] = {1, 2};
  std::vector<int64_t> ids = Owned(0, 1);
  const std::vector<float> rows = FileRows();
  {
    // A first attempt that breaks off after half the rows (its upload is dropped without Finish).
    auto first = *ps->StartInitialize(0);
    ASSERT_TRUE(first->Write(0, 0, 2, WireDtype::kF32, w).ok());
    std::vector<float> wrong(rows.size(), 9.0f);
    ASSERT_TRUE(first->WriteSparse(0, ids.data(), kRows / 2, kDim, WireDtype::kF32, wrong.data()).ok());
  }
  {
    // Rows missing: refused, naming the table.
    auto partial = *ps->StartInitialize(0);
    ASSERT_TRUE(partial->Write(0, 0, 2, WireDtype::kF32, w).ok());
    ASSERT_TRUE(partial->WriteSparse(0, ids.data() + 2, kRows - 2, kDim, WireDtype::kF32, rows.data() + 2 * kDim)
                    .ok());
    const absl::Status s = partial->Finish().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), absl::StrCat("no complete initial rows for sparse table 'emb.weight': ", kRows - 2,
                                        " of the ", kRows, " rows this task holds"));
  }
  // The retry: every row, the first ones twice (a repeated chunk keeps the last values).
  auto retry = *ps->StartInitialize(0);
  ASSERT_TRUE(retry->Write(0, 0, 2, WireDtype::kF32, w).ok());
  std::vector<float> stale(4 * kDim, 7.0f);
  ASSERT_TRUE(retry->WriteSparse(0, ids.data(), 4, kDim, WireDtype::kF32, stale.data()).ok());
  ASSERT_TRUE(retry->WriteSparse(0, ids.data(), kRows, kDim, WireDtype::kF32, rows.data()).ok());
  // Rows of a table that starts from its initializer, another dim, an id outside the table: refused.
  EXPECT_EQ(retry->WriteSparse(1, ids.data(), 1, kDim, WireDtype::kF32, rows.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(retry->WriteSparse(0, ids.data(), 1, kDim + 1, WireDtype::kF32, rows.data()).code(),
            absl::StatusCode::kInvalidArgument);
  const int64_t outside = kRows;
  EXPECT_EQ(retry->WriteSparse(0, &outside, 1, kDim, WireDtype::kF32, rows.data()).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(retry->Finish().ok());
  // An Initialize after the task is initialized (a restarted chief) changes nothing.
  auto late = *ps->StartInitialize(0);
  std::vector<float> other(rows.size(), -3.0f);
  ASSERT_TRUE(late->WriteSparse(0, ids.data(), kRows, kDim, WireDtype::kF32, other.data()).ok());
  ASSERT_TRUE(late->Finish().ok());

  PullRequest r;
  r.session = ps->Register(reg)->session;
  r.timeout_ms = 10000;
  r.sparse = {SparseIds{0, ids}, SparseIds{1, {3}}};
  absl::StatusOr<Pulled> p = PullSlices(*ps, r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->rows[0], rows);
  SparseTableSpec spec1 = o.config.tables[1];
  std::vector<float> initial1(kDim);
  SparseInitialRow(spec1, 3, initial1.data());
  EXPECT_EQ(p->rows[1], initial1);  // the plain table: its initializer
  EXPECT_EQ(ps->GetStats()->tables[0].rows, kRows);
}

TEST(InitialRowsTest, ARestoreSkipsThemAndAChiefWithoutThemIsRefused) {
  ScratchDir dir("initial_rows_ckpt");
  SimClusterOptions o = Options(2);
  o.checkpoint.dir = dir.path();
  o.checkpoint.save_steps = 1;
  const int64_t id = Owned(1, 2)[0];
  std::vector<float> trained;
  {
    auto cluster = *SimCluster::Start(o);
    SimCluster* c = cluster.get();
    PushHeader h0, h1;
    h0.step = h1.step = 0;
    h0.request_id = h1.request_id = 7;
    h0.commit = true;
    h1.session = c->Session(1, 0);
    ASSERT_TRUE(PushSlices(c->task(1), h1, {}, {SparseRows{0, {id}, {2, 2}}}).ok());
    h0.session = c->Session(0, 0);
    ASSERT_TRUE(PushSlices(c->task(0), h0, {{0, {0, 0}}}).ok());
    absl::StatusOr<Pulled> p0 = PullSlices(c->task(0), [&] {
      PullRequest r;
      r.session = c->Session(0, 0);
      r.min_step = 1;
      r.timeout_ms = 10000;
      return r;
    }());
    ASSERT_TRUE(p0.ok()) << p0.status();
    PullRequest r1;
    r1.session = c->Session(1, 0);
    r1.min_step = 1;
    r1.timeout_ms = 10000;
    r1.decisions = p0->header.decisions;
    r1.sparse = {SparseIds{0, {id}}};
    absl::StatusOr<Pulled> p1 = PullSlices(c->task(1), r1);
    ASSERT_TRUE(p1.ok()) << p1.status();
    trained = p1->rows[0];
    ASSERT_NE(trained, RowsOf({id}));
  }
  // A new cluster restores step 1: the trained row, not the chief's initial one.
  auto resumed = *SimCluster::Start(o);
  EXPECT_EQ(resumed->restored_step(), 1);
  EXPECT_EQ(*Rows(resumed.get(), 1, 1, {id}), trained);
  // A fresh start without the rows: the chief refuses before training.
  SimClusterOptions none = Options(2);
  none.initial_rows.clear();
  absl::StatusOr<std::unique_ptr<SimCluster>> refused = SimCluster::Start(none);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(), "sparse table 'emb.weight' starts from initial values, but the chief has "
                                        "no 12 x 2 rows to give ps task 0");
}

}  // namespace
}  // namespace dtrain::ps
