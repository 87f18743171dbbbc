// A model with sparse embedding tables (dlrm) through the whole training loop against in-process ps tasks:
//   - sync with 2 workers (batch b each) equals local mode with batch 2b: the dense parameters and every row of
//     every table (read from the final checkpoints) to 1e-5, with 1 and 2 ps tasks, in process and over shared
//     memory (ps/shm), for sgd and adagrad rows —
//     TensorFlow's sparse accumulator semantics (a row's gradients summed over the aggregated workers, / R);
//   - a 1-worker sync cluster equals local mode exactly;
//   - the chief's evaluation reads the rows (log loss and AUC of a model that learned something).
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "gtest/gtest.h"
#include "common/testing/relative_difference.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "ps/core/parameter_server.h"
#include "worker/data/dataset.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/train/trainer.h"
#include "worker/train/trainer_test_util.h"

namespace dtrain::worker {
namespace {

using ::dtrain::testing::RelativeDifference;

const data::DatasetPair& CtrData() {
  static const data::DatasetPair* data = [] {
    data::SyntheticCtrOptions o;
    o.examples = 3000;
    o.test_examples = 600;
    o.num_dense = 4;
    o.num_sparse = 5;
    o.vocab = {40};
    const std::string dir = ::testing::TempDir() + "/trainer_sparse_ctr";
    std::filesystem::remove_all(dir);
    absl::StatusOr<data::SyntheticCtrReport> r = data::WriteSyntheticCtr(o, dir);
    EXPECT_TRUE(r.ok()) << r.status();
    absl::StatusOr<data::DatasetPair> d = data::LoadDataset(dir, data::DataFormat::kCriteo);
    EXPECT_TRUE(d.ok()) << d.status();
    return new data::DatasetPair(*std::move(d));
  }();
  return *data;
}

WorkerOptions Options(const std::string& sparse_optimizer) {
  WorkerOptions o;
  o.model = "dlrm";
  o.dlrm.embedding_dim = 4;
  o.dlrm.bottom = {8};
  o.dlrm.top = {8};
  o.dataset = &CtrData();
  o.shuffle = false;
  o.optimizer = "sgd";
  o.learning_rate = 0.1f;
  o.sparse_optimizer = sparse_optimizer;
  o.sparse_learning_rate = 0.2f;
  o.quiet = true;
  o.evaluate = false;
  o.startup_wait_secs = 30;
  return o;
}

// Every table's rows of the newest checkpoint in `dir`: table name -> id -> row.
std::map<std::string, std::map<int64_t, std::vector<float>>> Rows(const std::string& dir) {
  std::map<std::string, std::map<int64_t, std::vector<float>>> out;
  absl::StatusOr<std::vector<ps::CheckpointData>> parts = ps::ReadCheckpointSet(Env::Default(), dir);
  EXPECT_TRUE(parts.ok()) << parts.status();
  if (!parts.ok()) return out;
  absl::StatusOr<std::vector<ps::SparseTableRows>> tables = ps::ReadSparseTables(*parts);
  EXPECT_TRUE(tables.ok()) << tables.status();
  if (!tables.ok()) return out;
  for (const ps::SparseTableRows& t : *tables) {
    for (size_t i = 0; i < t.ids.size(); ++i) {
      out[t.spec.name][t.ids[i]] =
          std::vector<float>(t.values.begin() + i * t.spec.dim, t.values.begin() + (i + 1) * t.spec.dim);
    }
  }
  return out;
}

// Largest relative difference between two tables' rows (they must hold the same ids).
double RowsDifference(const std::map<std::string, std::map<int64_t, std::vector<float>>>& a,
                      const std::map<std::string, std::map<int64_t, std::vector<float>>>& b) {
  EXPECT_EQ(a.size(), b.size());
  std::vector<float> fa, fb;
  for (const auto& [name, rows] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << "table " << name << " missing";
      continue;
    }
    EXPECT_EQ(rows.size(), it->second.size()) << name;
    for (const auto& [id, row] : rows) {
      auto r = it->second.find(id);
      if (r == it->second.end()) {
        ADD_FAILURE() << name << ": id " << id << " missing";
        continue;
      }
      fa.insert(fa.end(), row.begin(), row.end());
      fb.insert(fb.end(), r->second.begin(), r->second.end());
    }
  }
  return RelativeDifference(fa, fb);
}

struct ClusterRun {
  std::vector<TrainingResult> results;
  std::string checkpoint_dir;
};

ClusterRun RunCluster(const WorkerOptions& base, int num_ps, int num_workers, const std::string& name,
                      bool shm = false) {
  ClusterRun run;
  run.checkpoint_dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(run.checkpoint_dir);
  ps::CheckpointOptions checkpoint;
  checkpoint.dir = run.checkpoint_dir;
  PsTasks cluster(num_ps, num_workers, checkpoint);
  std::unique_ptr<ShmFront> front = shm ? std::make_unique<ShmFront>(cluster.tasks, num_workers) : nullptr;
  run.results = RunWorkers(base, num_workers, cluster.tasks, front.get());
  if (shm) {  // rows and dense slices went through shared memory
    EXPECT_GT(front->counters.shm_pushes.load(), 0);
    EXPECT_EQ(front->counters.control_pushes.load(), 0);
    EXPECT_EQ(front->counters.control_pulls.load(), 0);
    front.reset();
  }
  for (auto& s : cluster.servers) {
    EXPECT_TRUE(s->WaitUntilFinished(absl::Seconds(30)));
    EXPECT_TRUE(s->final_checkpoint_status().ok()) << s->final_checkpoint_status();
  }
  return run;
}

TrainingResult RunLocal(WorkerOptions o, const std::string& name, std::string* checkpoint_dir) {
  *checkpoint_dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(*checkpoint_dir);
  o.checkpoint.dir = *checkpoint_dir;
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : TrainingResult{};
}

class TrainerSparseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainerSparseTest, SyncTwoWorkersEqualLocalDoubleBatch) {
  const int b = 16, k = 12;
  WorkerOptions local = Options(GetParam());
  local.batch_size = 2 * b;
  local.train_steps = k;
  std::string local_dir;
  const TrainingResult expected = RunLocal(local, "sparse_local_" + GetParam(), &local_dir);
  const auto expected_rows = Rows(local_dir);
  ASSERT_FALSE(expected_rows.empty());
  for (const auto& [num_ps, shm] : std::vector<std::pair<int, bool>>{{1, false}, {2, false}, {1, true}, {2, true}}) {
    SCOPED_TRACE(absl::StrCat(num_ps, " ps", shm ? ", shared memory" : ""));
    WorkerOptions o = Options(GetParam());
    o.batch_size = b;
    o.train_steps = k;
    o.mode = "sync";
    ClusterRun got =
        RunCluster(o, num_ps, 2, absl::StrCat("sparse_sync_", GetParam(), num_ps, shm ? "_shm" : ""), shm);
    ASSERT_EQ(got.results[0].global_step, k);
    ASSERT_EQ(got.results[0].parameters.size(), expected.parameters.size());
    EXPECT_LE(RelativeDifference(got.results[0].parameters, expected.parameters), 1e-5);
    EXPECT_LE(RowsDifference(Rows(got.checkpoint_dir), expected_rows), 1e-5);
  }
  // Not vacuous: one step moves the rows far more than that.
  WorkerOptions one = local;
  one.train_steps = 1;
  std::string one_dir;
  RunLocal(one, "sparse_one_" + GetParam(), &one_dir);
  const auto first = Rows(one_dir);
  std::vector<float> a, e;
  for (const auto& [name, rows] : first) {
    for (const auto& [id, row] : rows) {
      auto it = expected_rows.at(name).find(id);
      if (it == expected_rows.at(name).end()) continue;
      a.insert(a.end(), row.begin(), row.end());
      e.insert(e.end(), it->second.begin(), it->second.end());
    }
  }
  EXPECT_GT(RelativeDifference(a, e), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(SparseOptimizers, TrainerSparseTest, ::testing::Values("sgd", "adagrad"));

TEST(TrainerSparseTest, OneWorkerClusterEqualsLocalAndEvaluates) {
  WorkerOptions o = Options("adagrad");
  o.batch_size = 32;
  o.train_steps = 60;
  o.evaluate = true;
  std::string local_dir;
  const TrainingResult local = RunLocal(o, "sparse_one_local", &local_dir);
  o.mode = "sync";
  ClusterRun got = RunCluster(o, 2, 1, "sparse_one_cluster");
  EXPECT_EQ(got.results[0].parameters, local.parameters);
  EXPECT_EQ(RowsDifference(Rows(got.checkpoint_dir), Rows(local_dir)), 0.0);
  // The chief evaluated with the rows: log loss and AUC, the same in both.
  EXPECT_GT(local.test_auc, 0.55);
  EXPECT_GT(local.test_log_loss, 0.0);
  EXPECT_EQ(got.results[0].test_auc, local.test_auc);
  EXPECT_EQ(got.results[0].test_log_loss, local.test_log_loss);
}

}  // namespace
}  // namespace dtrain::worker

namespace dtrain::worker {
namespace {

// Train and test sets whose test ids are mostly never seen in training (a large vocabulary).
const data::DatasetPair& WideCtrData() {
  static const data::DatasetPair* data = [] {
    data::SyntheticCtrOptions o;
    o.examples = 200;
    o.test_examples = 300;
    o.num_dense = 4;
    o.num_sparse = 5;
    o.vocab = {100000};
    const std::string dir = ::testing::TempDir() + "/trainer_sparse_wide_ctr";
    std::filesystem::remove_all(dir);
    absl::StatusOr<data::SyntheticCtrReport> r = data::WriteSyntheticCtr(o, dir);
    EXPECT_TRUE(r.ok()) << r.status();
    absl::StatusOr<data::DatasetPair> d = data::LoadDataset(dir, data::DataFormat::kCriteo);
    EXPECT_TRUE(d.ok()) << d.status();
    return new data::DatasetPair(*std::move(d));
  }();
  return *data;
}

int64_t RowsHeld(const ps::TrainingStats& stats) {
  int64_t rows = 0;
  for (const ps::SparseTableStats& t : stats.tables) rows += t.rows;
  return rows;
}

// The chief's evaluation looks up the test set's ids on the ps read-only: the tables hold exactly the rows that
// training made, with or without evaluation (before, the test ids' rows were created: 144,103 rows held against
// 135,798 in the checkpoint of the same step), and the final checkpoint holds as many.
TEST(TrainerSparseTest, EvaluationLeavesTheRowCountUnchanged) {
  WorkerOptions o = Options("adagrad");
  o.dataset = &WideCtrData();
  o.batch_size = 16;
  o.train_steps = 5;
  o.mode = "sync";
  o.evaluate = false;
  ClusterRun trained = RunCluster(o, 1, 1, "sparse_rows_no_eval");
  const int64_t rows = RowsHeld(trained.results[0].stats);
  ASSERT_GT(rows, 0);
  o.evaluate = true;
  ClusterRun evaluated = RunCluster(o, 1, 1, "sparse_rows_eval");
  EXPECT_GT(evaluated.results[0].test_auc, -1);  // it did evaluate, over the test set's ids
  EXPECT_EQ(RowsHeld(evaluated.results[0].stats), rows);
  int64_t in_checkpoint = 0;
  for (const auto& [name, table] : Rows(evaluated.checkpoint_dir)) in_checkpoint += static_cast<int64_t>(table.size());
  EXPECT_EQ(in_checkpoint, rows);
  // Not vacuous: most of the test set's ids were never trained on.
  std::set<int64_t> seen(o.dataset->train.ids.begin(),
                         o.dataset->train.ids.begin() + std::min<size_t>(o.dataset->train.ids.size(), 80 * 5));
  int64_t unseen = 0;
  for (int64_t id : o.dataset->test.ids) unseen += seen.count(id) == 0 ? 1 : 0;
  EXPECT_GT(unseen, rows);
}

// The worker's row cache: with staleness 0 every row is pulled every step (the same run, bit for bit); with
// staleness 4 hot rows cross the wire less often and the model still learns.
TEST(TrainerSparseTest, RowCacheWithStalenessZeroChangesNothingAndSavesBytesWithMore) {
  WorkerOptions o = Options("adagrad");
  o.batch_size = 32;
  o.train_steps = 60;
  o.evaluate = true;
  std::string plain_dir, zero_dir, four_dir;
  const TrainingResult plain = RunLocal(o, "cache_plain", &plain_dir);
  o.row_cache_rows = 1000;
  o.row_cache_staleness = 0;
  const TrainingResult zero = RunLocal(o, "cache_zero", &zero_dir);
  EXPECT_EQ(zero.parameters, plain.parameters);
  EXPECT_EQ(RowsDifference(Rows(zero_dir), Rows(plain_dir)), 0.0);
  EXPECT_EQ(zero.sparse_bytes_per_step, plain.sparse_bytes_per_step);
  EXPECT_EQ(zero.row_cache_hit_rate, 0.0);
  o.row_cache_staleness = 4;
  const TrainingResult four = RunLocal(o, "cache_four", &four_dir);
  EXPECT_GT(four.row_cache_hit_rate, 0.3);
  EXPECT_LT(four.sparse_bytes_per_step, 0.8 * plain.sparse_bytes_per_step);
  EXPECT_GT(four.test_auc, 0.55);
}

// The hybrid (dense sync, rows async) on 2 workers: every step's dense update still waits for both, and the
// model learns about as well as fully sync training.
TEST(TrainerSparseTest, HybridTrainsLikeSync) {
  WorkerOptions o = Options("adagrad");
  o.batch_size = 32;
  o.train_steps = 60;
  o.mode = "sync";
  o.evaluate = true;
  ClusterRun sync = RunCluster(o, 1, 2, "hybrid_sync");
  o.sparse_mode = "async";
  ClusterRun hybrid = RunCluster(o, 1, 2, "hybrid_async");
  ASSERT_EQ(hybrid.results[0].global_step, 60);
  EXPECT_EQ(hybrid.results[0].stats.workers[0].applied + hybrid.results[0].stats.workers[1].applied, 120);
  EXPECT_GT(hybrid.results[0].test_auc, 0.55);
  EXPECT_NEAR(hybrid.results[0].test_auc, sync.results[0].test_auc, 0.05);
}

}  // namespace
}  // namespace dtrain::worker
