// Imported graphs through the whole training loop (in-process ps tasks, the worker's overlapped client):
//   - sync with 2 workers (batch b each) equals local mode with batch 2b for a graph with a residual Add;
//   - with BatchNorm (running statistics as state slices on the ps), a 1-worker sync cluster equals local mode
//     exactly, and the running statistics moved as PyTorch's rule says they should over the run;
//   - nn.Embedding tables (rows on 2 ps tasks, starting from the file's) in sync with 2 workers equal local mode
//     with twice the batch, tables included.
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "common/testing/relative_difference.h"
#include "ps/core/parameter_server.h"
#include "worker/models/onnx/onnx_test_util.h"
#include "worker/data/dataset.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/models/registry.h"
#include "worker/data/synthetic_data.h"
#include "worker/train/trainer.h"
#include "worker/train/trainer_test_util.h"

namespace dtrain::worker {
namespace {

using ::dtrain::models::onnx::testing::IntAttr;
using ::dtrain::models::onnx::testing::OnnxBuilder;
using ::dtrain::models::onnx::testing::Ramp;
using ::dtrain::testing::RelativeDifference;

std::string WriteResidualNet(const std::string& name, bool batch_norm) {
  const std::string path = ::testing::TempDir() + "/" + name + ".onnx";
  std::ofstream(path, std::ios::binary) << models::onnx::testing::ResidualNetBytes(batch_norm);
  return path;
}

std::vector<TrainingResult> RunCluster(const WorkerOptions& base, int num_ps, int num_workers) {
  PsTasks cluster(num_ps, num_workers);
  return RunWorkers(base, num_workers, cluster.tasks);
}

TEST(TrainerOnnxTest, SyncTwoWorkersEqualLocalDoubleBatchWithAResidualAdd) {
  const data::DatasetPair data = MakeSyntheticDataset(600, 60);
  const std::string path = WriteResidualNet("residual", /*batch_norm=*/false);
  const int b = 10, k = 10;
  WorkerOptions local = QuietTrainingOptions(&data, path);
  local.batch_size = 2 * b;
  local.train_steps = k;
  absl::StatusOr<TrainingResult> expected = RunTraining(local, {});
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (int num_ps : {1, 2}) {
    SCOPED_TRACE(num_ps);
    WorkerOptions o = QuietTrainingOptions(&data, path);
    o.batch_size = b;
    o.train_steps = k;
    o.mode = "sync";
    std::vector<TrainingResult> got = RunCluster(o, num_ps, 2);
    ASSERT_EQ(got[0].global_step, k);
    ASSERT_EQ(got[0].parameters.size(), expected->parameters.size());
    const double rel = RelativeDifference(got[0].parameters, expected->parameters);
    EXPECT_LE(rel, 1e-5) << "sync 2 workers vs local differ by " << rel;
  }
  // The comparison is not vacuous: one step moves the parameters far more than that.
  WorkerOptions one = local;
  one.train_steps = 1;
  absl::StatusOr<TrainingResult> first = RunTraining(one, {});
  ASSERT_TRUE(first.ok());
  EXPECT_GT(RelativeDifference(first->parameters, expected->parameters), 1e-3);
}

TEST(TrainerOnnxTest, BatchNormOneWorkerClusterEqualsLocalExactly) {
  const data::DatasetPair data = MakeSyntheticDataset(600, 60);
  const std::string path = WriteResidualNet("residual_bn", /*batch_norm=*/true);
  WorkerOptions o = QuietTrainingOptions(&data, path);
  o.batch_size = 16;
  o.train_steps = 12;
  absl::StatusOr<TrainingResult> local = RunTraining(o, {});
  ASSERT_TRUE(local.ok()) << local.status();
  o.mode = "sync";
  std::vector<TrainingResult> got = RunCluster(o, 1, 1);
  ASSERT_EQ(got[0].global_step, 12);
  EXPECT_EQ(got[0].parameters, local->parameters);
  // The running statistics are state on the ps: they moved from their initial values (mean 0, var 1) toward the
  // batches' statistics, by PyTorch's rule, whatever the optimizer (SGD's learning rate does not scale them).
  absl::StatusOr<models::ModelRef> spec = models::ResolveModel(path);
  ASSERT_TRUE(spec.ok());
  models::ModelOptions mo;
  mo.height = mo.width = 28;
  mo.channels = 1;
  absl::StatusOr<std::vector<models::VariableInfo>> vars = models::ModelVariables(**spec, mo);
  ASSERT_TRUE(vars.ok()) << vars.status();
  const std::vector<int64_t> offsets = models::Offsets(*vars);
  bool moved = false;
  for (size_t v = 0; v < vars->size(); ++v) {
    if ((*vars)[v].name != "bn1.running_var") continue;
    EXPECT_FALSE((*vars)[v].trainable);
    for (int c = 0; c < 4; ++c) {
      const float var = local->parameters[offsets[v] + c];
      EXPECT_GT(var, 0.0f);
      moved = moved || std::abs(var - 1.0f) > 1e-3f;
    }
  }
  EXPECT_TRUE(moved) << "bn1.running_var did not move";
}

// nn.Embedding per categorical feature (3 of them, [7, 2], [5, 2], [9, 2] tables), concatenated with the dense
// features, a Linear to one logit: what PyTorch exports for a small click-through-rate model.
std::string WriteEmbeddingNet(const std::string& name, int dense) {
  OnnxBuilder b;
  b.Input("dense", {-1, dense}).Input("ids", {-1, 3}, ::onnx::TensorProto::INT64);
  const int64_t rows[] = {7, 5, 9};
  std::vector<std::string> cat = {"dense"};
  for (int f = 0; f < 3; ++f) {
    const std::string k = "k" + std::to_string(f), col = "col" + std::to_string(f), e = "e" + std::to_string(f);
    const std::string table = "emb." + std::to_string(f) + ".weight";
    b.Initializer(table, {rows[f], 2}, Ramp(rows[f] * 2, 0.1f))
        .Constant(models::onnx::testing::IntTensor(k, {}, {f}))
        .Node("Gather", {"ids", k}, {col}, {IntAttr("axis", 1)})
        .Node("Gather", {table, col}, {e});
    cat.push_back(e);
  }
  b.Initializer("fc.weight", {1, dense + 6}, Ramp(dense + 6, 0.05f))
      .Initializer("fc.bias", {1}, {0.0f})
      .Node("Concat", cat, {"cat"}, {IntAttr("axis", 1)})
      .Node("Gemm", {"cat", "fc.weight", "fc.bias"}, {"logit"}, {IntAttr("transB", 1)})
      .Output("logit", {-1, 1});
  const std::string path = ::testing::TempDir() + "/" + name + ".onnx";
  std::ofstream(path, std::ios::binary) << b.Bytes();
  return path;
}

// The tables start from the file's rows on every ps task (the chief's Initialize), a step's rows are summed over
// the workers and divided by R: 2 workers on 2 ps tasks equal local mode with twice the batch, tables included
// (pulled whole at the end for --export_onnx).
TEST(TrainerOnnxTest, EmbeddingTablesSyncTwoWorkersTwoPsEqualLocalDoubleBatch) {
  const std::string dir = ::testing::TempDir() + "/embedding_ctr";
  data::SyntheticCtrOptions so;
  so.examples = 400;
  so.test_examples = 40;
  so.num_dense = 2;
  so.num_sparse = 3;
  ASSERT_TRUE(data::WriteSyntheticCtr(so, dir).ok());
  absl::StatusOr<data::DatasetPair> data = data::LoadDataset(dir, data::DataFormat::kCriteo);
  ASSERT_TRUE(data.ok()) << data.status();
  const std::string path = WriteEmbeddingNet("embedding", 2);
  const int b = 10, k = 10;
  WorkerOptions local = QuietTrainingOptions(&*data, path);
  local.sparse_optimizer = "sgd";
  local.batch_size = 2 * b;
  local.train_steps = k;
  local.export_onnx = ::testing::TempDir() + "/embedding_local_trained.onnx";
  absl::StatusOr<TrainingResult> expected = RunTraining(local, {});
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(expected->table_rows.size(), 3u);
  WorkerOptions o = local;
  o.batch_size = b;
  o.mode = "sync";
  o.export_onnx = ::testing::TempDir() + "/embedding_cluster_trained.onnx";
  std::vector<TrainingResult> got = RunCluster(o, /*num_ps=*/2, /*num_workers=*/2);
  ASSERT_EQ(got[0].global_step, k);
  EXPECT_LE(RelativeDifference(got[0].parameters, expected->parameters), 1e-5);
  ASSERT_EQ(got[0].table_rows.size(), 3u);
  for (int t = 0; t < 3; ++t) {
    ASSERT_EQ(got[0].table_rows[t].size(), expected->table_rows[t].size()) << t;
    EXPECT_LE(RelativeDifference(got[0].table_rows[t], expected->table_rows[t]), 1e-5) << "table " << t;
    // Trained: no longer the file's rows.
    const int64_t rows[] = {7, 5, 9};
    EXPECT_GT(RelativeDifference(expected->table_rows[t], Ramp(rows[t] * 2, 0.1f)), 1e-3) << "table " << t;
  }
  EXPECT_TRUE(got[1].table_rows.empty());  // only the chief exports
}

}  // namespace
}  // namespace dtrain::worker
