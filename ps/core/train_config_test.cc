#include "ps/core/train_config.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

TrainConfig Valid() {
  TrainConfig c;
  c.model_signature = "cnn:abc";
  c.mode = "sync";
  c.num_workers = 3;
  c.replicas_to_aggregate = 2;
  c.total_num_replicas = 3;
  c.slices = {{0, "w", 0, 10}, {2, "b", 15, 5}};
  return c;
}

TEST(TrainConfigTest, ValidConfigPasses) {
  EXPECT_TRUE(ValidateTrainConfig(Valid(), 3).ok());
  EXPECT_TRUE(ValidateTrainConfig(Valid(), 0).ok());  // 0: no cluster size to check against
}

TEST(TrainConfigTest, ResolvesDefaults) {
  TrainConfig c = Valid();
  c.replicas_to_aggregate = 0;
  c.total_num_replicas = 0;
  EXPECT_EQ(ResolvedReplicasToAggregate(c), 3);
  EXPECT_EQ(ResolvedTotalNumReplicas(c), 3);
  EXPECT_TRUE(ValidateTrainConfig(c, 3).ok());
}

TEST(TrainConfigTest, RejectsBadFields) {
  auto expect_invalid = [](const TrainConfig& c, const std::string& word) {
    absl::Status s = ValidateTrainConfig(c, 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << word;
    EXPECT_NE(s.message().find(word), std::string::npos) << s.message();
  };
  TrainConfig c = Valid();
  c.mode = "semi";
  expect_invalid(c, "mode");
  c = Valid();
  c.replicas_to_aggregate = 3;
  c.total_num_replicas = 2;
  expect_invalid(c, "replicas_to_aggregate");
  c = Valid();
  c.num_workers = 4;
  expect_invalid(c, "cluster spec");
  c = Valid();
  c.max_staleness = -2;
  expect_invalid(c, "max_staleness");
  c = Valid();
  c.optimizer.name = "adadelta";
  expect_invalid(c, "adadelta");
  c = Valid();
  c.moving_average_decay = 1.0f;
  expect_invalid(c, "moving_average_decay");
  c = Valid();
  c.slices.push_back({5, "x", 12, 4});  // [12, 16) overlaps b [15, 20)
  expect_invalid(c, "overlap");
  c = Valid();
  c.slices.push_back({0, "x", 40, 4});
  expect_invalid(c, "twice");
  c = Valid();
  c.slices[0].length = 0;
  expect_invalid(c, "length");
}

TEST(TrainConfigTest, MismatchNamesFieldAndBothValues) {
  TrainConfig ps = Valid(), w = Valid();
  EXPECT_TRUE(CompareTrainConfigs(ps, w, 1).ok());
  w.model_signature = "cnn:xyz";
  absl::Status s = CompareTrainConfigs(ps, w, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "model_signature mismatch: ps has 'cnn:abc', worker 1 has 'cnn:xyz'");

  w = Valid();
  w.optimizer.learning_rate = 0.5f;
  s = CompareTrainConfigs(ps, w, 2);
  EXPECT_EQ(s.message(), "optimizer.learning_rate mismatch: ps has 0.00999999978, worker 2 has 0.5");

  w = Valid();
  w.optimizer.staircase = true;
  EXPECT_EQ(CompareTrainConfigs(ps, w, 2).message(), "optimizer.staircase mismatch: ps has false, worker 2 has true");

  w = Valid();
  w.slices[1].flat_offset = 16;
  s = CompareTrainConfigs(ps, w, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("slices[1] mismatch"), std::string::npos) << s.message();

  // Every optimizer field is compared, by name.
  const std::vector<std::pair<std::string, std::function<void(OptimizerConfig&)>>> fields = {
      {"lr_schedule", [](OptimizerConfig& o) { o.lr_schedule = "cosine"; }},
      {"min_learning_rate", [](OptimizerConfig& o) { o.min_learning_rate = 1e-3f; }},
      {"warmup_steps", [](OptimizerConfig& o) { o.warmup_steps = 10; }},
      {"warmup_start_factor", [](OptimizerConfig& o) { o.warmup_start_factor = 0.5f; }},
      {"nesterov", [](OptimizerConfig& o) { o.nesterov = true; }},
      {"weight_decay", [](OptimizerConfig& o) { o.weight_decay = 0.01f; }},
      {"rho", [](OptimizerConfig& o) { o.rho = 0.5f; }},
      {"centered", [](OptimizerConfig& o) { o.centered = true; }},
      {"initial_accumulator", [](OptimizerConfig& o) { o.initial_accumulator = 0.5f; }},
      {"clip_norm", [](OptimizerConfig& o) { o.clip_norm = 1.0f; }},
  };
  for (const auto& [field, edit] : fields) {
    w = Valid();
    edit(w.optimizer);
    s = CompareTrainConfigs(ps, w, 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << field;
    EXPECT_NE(s.message().find("optimizer." + field + " mismatch"), std::string::npos) << s.message();
  }

  // 0 and num_workers mean the same R.
  w = Valid();
  ps.replicas_to_aggregate = 3;
  w.replicas_to_aggregate = 0;
  EXPECT_TRUE(CompareTrainConfigs(ps, w, 1).ok());
  w.replicas_to_aggregate = 1;
  EXPECT_EQ(CompareTrainConfigs(ps, w, 1).message(), "replicas_to_aggregate mismatch: ps has 3, worker 1 has 1");
}

TrainConfig WithTables() {
  TrainConfig c = Valid();
  c.tables.resize(2);
  c.tables[0].table = 0;
  c.tables[0].name = "emb_a";
  c.tables[0].dim = 8;
  c.tables[1].table = 1;
  c.tables[1].name = "emb_b";
  c.tables[1].dim = 4;
  c.tables[1].rows = 1000;
  c.sparse_optimizer.name = "ftrl";
  return c;
}

TEST(TrainConfigTest, SparseTablesAndTheirOptimizerAreChecked) {
  EXPECT_TRUE(ValidateTrainConfig(WithTables(), 3).ok());
  auto expect_invalid = [](const TrainConfig& c, const std::string& needle) {
    const absl::Status s = ValidateTrainConfig(c, 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  TrainConfig c = WithTables();
  c.tables[1].table = 0;
  expect_invalid(c, "has index 0, expected 1");
  c = WithTables();
  c.tables[1].name = "emb_a";
  expect_invalid(c, "unique");
  c = WithTables();
  c.tables[0].dim = 0;
  expect_invalid(c, "dim 0");
  c = WithTables();
  c.tables[0].admit_after = 300;
  expect_invalid(c, "admit_after 300");
  c = WithTables();
  c.sparse_optimizer.name = "momentum";
  expect_invalid(c, "sparse_optimizer");
  // Without tables the sparse optimizer is not used (an old worker sends none).
  c = Valid();
  c.sparse_optimizer.name = "";
  EXPECT_TRUE(ValidateTrainConfig(c, 3).ok());
  // A model of tables only: no slices.
  c = WithTables();
  c.slices.clear();
  EXPECT_TRUE(ValidateTrainConfig(c, 3).ok());
}

TEST(TrainConfigTest, SparseMismatchesNameTheTableField) {
  TrainConfig ps = WithTables(), w = WithTables();
  EXPECT_TRUE(CompareTrainConfigs(ps, w, 1).ok());
  w.tables[1].max_rows = 10;
  absl::Status s = CompareTrainConfigs(ps, w, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("tables[1] mismatch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("max_rows 10"), std::string::npos) << s.message();
  w = WithTables();
  w.tables.pop_back();
  EXPECT_EQ(CompareTrainConfigs(ps, w, 1).message(), "number of sparse tables mismatch: ps has 2, worker 1 has 1");
  w = WithTables();
  w.sparse_optimizer.l1 = 0.5f;
  EXPECT_EQ(CompareTrainConfigs(ps, w, 4).message(), "sparse_optimizer.l1 mismatch: ps has 0, worker 4 has 0.5");
}

}  // namespace
}  // namespace dtrain::ps
