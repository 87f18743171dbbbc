#include "ps/core/train_config.h"

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
  c.optimizer.name = "rmsprop";
  expect_invalid(c, "rmsprop");
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

  // 0 and num_workers mean the same R.
  w = Valid();
  ps.replicas_to_aggregate = 3;
  w.replicas_to_aggregate = 0;
  EXPECT_TRUE(CompareTrainConfigs(ps, w, 1).ok());
  w.replicas_to_aggregate = 1;
  EXPECT_EQ(CompareTrainConfigs(ps, w, 1).message(), "replicas_to_aggregate mismatch: ps has 3, worker 1 has 1");
}

}  // namespace
}  // namespace dtrain::ps
