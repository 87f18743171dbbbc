#include "ps/checkpoint/checkpoint_set.h"

#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::ExpectSame;
using ::dtrain::ps::testing::LogCapture;
using ::dtrain::ps::testing::MakeData;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::ps::testing::WriteCheckpointFile;

// Two tasks' files covering a 10-float model: task 0 holds [0, 4) and [7, 10), task 1 [4, 7).
void WriteModelStep(const std::string& dir, int64_t step) {
  for (int task = 0; task < 2; ++task) {
    CheckpointData d;
    d.task_index = task;
    d.num_ps = 2;
    d.global_step = d.task_step = step;
    d.model_signature = "m";
    d.optimizer = "sgd";
    d.has_moving_averages = true;
    std::vector<SliceSpec> specs = task == 0 ? std::vector<SliceSpec>{{0, "a", 0, 4}, {2, "b", 7, 3}}
                                             : std::vector<SliceSpec>{{1, "a", 4, 3}};
    for (const SliceSpec& spec : specs) {
      SliceState s;
      s.spec = spec;
      for (int64_t j = 0; j < spec.length; ++j) {
        s.values.push_back(static_cast<float>(step + spec.flat_offset + j));
        s.moving_average.push_back(-static_cast<float>(spec.flat_offset + j));
      }
      d.slices.push_back(std::move(s));
    }
    WriteCheckpointFile(CheckpointPath(dir, step, task, 2), d);
  }
}

TEST(CheckpointSetTest, ReadsAPrefixOrTheNewestCompleteStepOfADirectory) {
  ScratchDir dir("set");
  WriteModelStep(dir.path(), 10);
  WriteModelStep(dir.path(), 20);
  WriteModelStep(dir.path(), 30);
  std::filesystem::remove(CheckpointPath(dir.path(), 30, 1, 2));  // step 30 incomplete
  const std::string p20 = CheckpointPath(dir.path(), 20, 0, 2);
  std::filesystem::resize_file(p20, std::filesystem::file_size(p20) - 1);  // step 20 corrupt

  absl::StatusOr<std::vector<CheckpointData>> parts = ReadCheckpointSet(Env::Default(), dir.path());
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].global_step, 10);
  absl::StatusOr<std::vector<float>> flat = AssembleFlatBuffer(*parts, 10, false);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(*flat, (std::vector<float>{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  flat = AssembleFlatBuffer(*parts, 10, true);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(*flat, (std::vector<float>{0, -1, -2, -3, -4, -5, -6, -7, -8, -9}));

  parts = ReadCheckpointSet(Env::Default(), CheckpointPrefix(dir.path(), 10));
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ((*parts)[1].task_index, 1);
  EXPECT_EQ(ReadCheckpointSet(Env::Default(), CheckpointPrefix(dir.path(), 20)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpointSet(Env::Default(), CheckpointPrefix(dir.path(), 30)).status().code(), absl::StatusCode::kNotFound);
  absl::Status missing = ReadCheckpointSet(Env::Default(), CheckpointPrefix(dir.path(), 40)).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.message(), "10, 20, 30")) << missing;
  EXPECT_EQ(ReadCheckpointSet(Env::Default(), dir.path() + "/nonsense").status().code(), absl::StatusCode::kInvalidArgument);

  // Coverage: a missing task leaves a gap; a bigger model is not covered; a smaller one is exceeded.
  parts = ReadCheckpointSet(Env::Default(), CheckpointPrefix(dir.path(), 10));
  std::vector<CheckpointData> only0 = {(*parts)[0]};
  absl::Status gap = AssembleFlatBuffer(only0, 10, false).status();
  EXPECT_EQ(gap.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(gap.message(), "does not cover parameter 4")) << gap;
  EXPECT_EQ(AssembleFlatBuffer(*parts, 11, false).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(AssembleFlatBuffer(*parts, 9, false).status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<CheckpointData> twice = {(*parts)[0], (*parts)[1], (*parts)[1]};
  EXPECT_TRUE(absl::StrContains(AssembleFlatBuffer(twice, 10, false).status().message(), "overlaps"));
}

// A slice whose flat offset lies near INT64_MAX: offset + length overflowed in the range check (undefined
// behaviour); it is reported as beyond the model instead.
TEST(CheckpointSetTest, SliceOffsetNearTheInt64LimitIsBeyondTheModel) {
  CheckpointData d = MakeData(1, 0, false);
  d.slices[0].spec.flat_offset = std::numeric_limits<int64_t>::max() - 2;
  absl::StatusOr<CheckpointData> parsed = ParseCheckpoint(SerializeCheckpoint(d), "f");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const absl::Status s = AssembleFlatBuffer({*parsed}, 16, false).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "lies beyond the model's 16 parameters")) << s;
}

// Two tasks' shards of a hash table and of a fixed-size [8, 2] table, merged as dtrain_eval reads them.
std::vector<CheckpointData> TableParts() {
  std::vector<CheckpointData> parts(2);
  for (int task = 0; task < 2; ++task) {
    CheckpointData& d = parts[task];
    d.task_index = task;
    d.num_ps = 2;
    d.global_step = d.task_step = 5;
    d.model_signature = "m";
    d.sparse_optimizer = "sgd";
    SparseTableState hash, fixed;
    hash.spec.table = 0;
    hash.spec.name = "h";
    hash.spec.dim = 2;
    fixed.spec.table = 1;
    fixed.spec.name = "f";
    fixed.spec.dim = 2;
    fixed.spec.rows = 8;
    fixed.spec.init_scale = 0.5f;
    for (int64_t id : {900, -3, 17, 5, 2, 41}) {
      if (ShardOfId(id, 2) != task) continue;
      hash.ids.push_back(id);
      hash.values.insert(hash.values.end(), {static_cast<float>(id), -static_cast<float>(id)});
    }
    for (int64_t id : {1, 6, 3}) {
      if (ShardOfId(id, 2) != task) continue;
      fixed.ids.push_back(id);
      fixed.values.insert(fixed.values.end(), {100.0f + id, 200.0f + id});
    }
    d.tables = {hash, fixed};
  }
  return parts;
}

TEST(CheckpointSetTest, SparseTablesAreMergedAcrossTasks) {
  std::vector<CheckpointData> parts = TableParts();
  absl::StatusOr<std::vector<SparseTableRows>> tables = ReadSparseTables(parts);
  ASSERT_TRUE(tables.ok()) << tables.status();
  ASSERT_EQ(tables->size(), 2u);
  EXPECT_EQ((*tables)[0].ids, std::vector<int64_t>({-3, 2, 5, 17, 41, 900}));
  EXPECT_EQ((*tables)[0].values, std::vector<float>({-3, 3, 2, -2, 5, -5, 17, -17, 41, -41, 900, -900}));
  absl::StatusOr<std::vector<float>> fixed = AssembleFixedTable((*tables)[1]);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  ASSERT_EQ(fixed->size(), 16u);
  EXPECT_EQ((*fixed)[2], 101.0f);
  EXPECT_EQ((*fixed)[13], 206.0f);
  std::vector<float> initial(2);
  SparseInitialRow((*tables)[1].spec, 0, initial.data());
  EXPECT_EQ((*fixed)[0], initial[0]);
  EXPECT_EQ((*fixed)[1], initial[1]);
  EXPECT_EQ(AssembleFixedTable((*tables)[0]).status().code(), absl::StatusCode::kInvalidArgument);
  // A table with initial values: the rows the checkpoint lacks come from them.
  std::vector<float> file(16);
  for (size_t i = 0; i < file.size(); ++i) file[i] = -0.5f * static_cast<float>(i);
  absl::StatusOr<std::vector<float>> from_file = AssembleFixedTable((*tables)[1], file);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  for (size_t i = 0; i < file.size(); ++i) {
    const bool held = i / 2 == 1 || i / 2 == 3 || i / 2 == 6;  // rows 1, 3 and 6
    EXPECT_EQ((*from_file)[i], held ? (*fixed)[i] : file[i]) << i;
  }
  EXPECT_EQ(AssembleFixedTable((*tables)[1], absl::MakeConstSpan(file).subspan(1)).status().code(),
            absl::StatusCode::kInvalidArgument);

  // An id on the wrong task, or tasks that disagree, are refused.
  std::vector<CheckpointData> bad = TableParts();
  bad[0].tables[0].ids.push_back(bad[1].tables[0].ids[0]);
  bad[0].tables[0].values.insert(bad[0].tables[0].values.end(), {0, 0});
  absl::Status s = ReadSparseTables(bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "not its own")) << s;
  bad = TableParts();
  bad[1].tables[1].spec.dim = 3;
  EXPECT_EQ(ReadSparseTables(bad).status().code(), absl::StatusCode::kFailedPrecondition);
  bad = TableParts();
  bad[1].tables.pop_back();
  EXPECT_EQ(ReadSparseTables(bad).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dtrain::ps
