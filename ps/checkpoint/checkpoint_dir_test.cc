#include "ps/checkpoint/checkpoint_dir.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::ExpectSame;
using ::dtrain::ps::testing::LogCapture;
using ::dtrain::ps::testing::MakeData;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::ps::testing::WriteCheckpointFile;

TEST(CheckpointDirTest, FileNames) {
  CheckpointFile f;
  ASSERT_TRUE(ParseCheckpointFileName("model.ckpt-1500.ps2-of-3", &f));
  EXPECT_EQ(f.step, 1500);
  EXPECT_EQ(f.task, 2);
  EXPECT_EQ(f.num_ps, 3);
  for (const char* bad : {"model.ckpt-1500.ps3-of-3", "model.ckpt-x.ps0-of-1", "model.ckpt-15.ps0-of-1.tmp.123", "model.ckpt-15.ps0-of-1.tmp.123.4",
                          "model.ckpt-15.ps0-of-0", "checkpoint", "model.ckpt-15", "model.ckpt-.ps0-of-1"}) {
    EXPECT_FALSE(ParseCheckpointFileName(bad, &f)) << bad;
  }
  EXPECT_EQ(CheckpointPrefix("/a/b/", 7), "/a/b/model.ckpt-7");
}

TEST(CheckpointDirTest, ListAndReadFiles) {
  ScratchDir dir("write_read");
  const CheckpointData d = MakeData(3, 2, true, 300);
  const std::string path = CheckpointPath(dir.path() + "/sub", 300, 1, 2);
  EXPECT_TRUE(absl::EndsWith(path, "/sub/model.ckpt-300.ps1-of-2")) << path;
  WriteCheckpointFile(path, d);
  absl::StatusOr<CheckpointData> back = ReadCheckpoint(Env::Default(), path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
  absl::StatusOr<std::vector<CheckpointFile>> files = ListCheckpointFiles(Env::Default(), dir.path() + "/sub");
  ASSERT_TRUE(files.ok());
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ((*files)[0].path, path);
  EXPECT_EQ((*files)[0].step, 300);
  EXPECT_EQ(ReadCheckpoint(Env::Default(), path + "x").status().code(), absl::StatusCode::kNotFound);
}

TrainConfig ConfigFor(const CheckpointData& d) {
  TrainConfig c;
  c.model_signature = d.model_signature;
  c.optimizer.name = d.optimizer;
  for (const SliceState& s : d.slices) c.slices.push_back(s.spec);
  return c;
}

TEST(CheckpointDirTest, CompatibilityChecks) {
  const CheckpointData d = MakeData(3, 1, false);
  TrainConfig c = ConfigFor(d);
  EXPECT_TRUE(CheckCompatible(d, "p", c, 1, 2).ok());

  absl::Status s = CheckCompatible(d, "p", c, 0, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "ps task 1 of 2")) << s;

  TrainConfig other = c;
  other.model_signature = "cnn/v1/xyz";
  s = CheckCompatible(d, "p", other, 1, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "another model")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "--checkpoint_dir")) << s;

  other = c;
  other.optimizer.name = "adam";
  s = CheckCompatible(d, "p", other, 1, 2);
  EXPECT_TRUE(absl::StrContains(s.message(), "optimizer 'momentum'")) << s;

  other = c;
  other.slices[1].length += 1;
  s = CheckCompatible(d, "p", other, 1, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "placement")) << s;

  other = c;
  other.slices.pop_back();
  EXPECT_EQ(CheckCompatible(d, "p", other, 1, 2).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CheckpointDirTest, SparseTablesMustMatch) {
  CheckpointData d = MakeData(2, 1, false);
  testing::AddTables(&d);
  TrainConfig c = ConfigFor(d);
  for (const SparseTableState& t : d.tables) c.tables.push_back(t.spec);
  c.sparse_optimizer.name = "adagrad";
  EXPECT_TRUE(CheckCompatible(d, "p", c, 1, 2).ok());
  // Memory settings may change between runs.
  TrainConfig other = c;
  other.tables[0].max_rows = 10;
  other.tables[0].admit_after = 0;
  EXPECT_TRUE(CheckCompatible(d, "p", other, 1, 2).ok());

  other = c;
  other.tables[1].dim = 3;
  absl::Status s = CheckCompatible(d, "p", other, 1, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "sparse table 1 differs: dim 2 vs 3")) << s;
  other = c;
  other.tables[0].init_seed = 1;
  EXPECT_TRUE(absl::StrContains(CheckCompatible(d, "p", other, 1, 2).message(), "init_seed 99 vs 1"));
  other = c;
  other.sparse_optimizer.name = "ftrl";
  s = CheckCompatible(d, "p", other, 1, 2);
  EXPECT_TRUE(absl::StrContains(s.message(), "trained with 'adagrad'")) << s;
  other = c;
  other.tables.pop_back();
  s = CheckCompatible(d, "p", other, 1, 2);
  EXPECT_TRUE(absl::StrContains(s.message(), "holds 2 sparse tables, this run has 1")) << s;
  // A file without tables (format 3, or a model without them) for a run with tables.
  const CheckpointData v3 = MakeData(2, 1, false);
  s = CheckCompatible(v3, "p", c, 1, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(s.message(), "holds 0 sparse tables, this run has 2")) << s;
}

void WriteStep(const std::string& dir, int64_t step, int task, int num_ps, const std::string& signature = "sig") {
  CheckpointData d = MakeData(2, 0, false, step);
  d.task_index = task;
  d.num_ps = num_ps;
  d.model_signature = signature;
  d.slices[0].values.assign(d.slices[0].values.size(), static_cast<float>(step));
  WriteCheckpointFile(CheckpointPath(dir, step, task, num_ps), d);
}

TrainConfig RestoreConfig(const std::string& mode = "sync") {
  TrainConfig c = ConfigFor(MakeData(2, 0, false));
  c.model_signature = "sig";
  c.mode = mode;
  return c;
}

TEST(CheckpointDirTest, PruneKeepsTheNewestOfThisTask) {
  ScratchDir dir("prune");
  for (int64_t step : {100, 200, 300, 400, 1000}) {
    WriteStep(dir.path(), step, 0, 2);
    WriteStep(dir.path(), step, 1, 2);
  }
  ASSERT_TRUE(PruneCheckpoints(Env::Default(), dir.path(), 1, 2, 2).ok());
  absl::StatusOr<std::vector<CheckpointFile>> files = ListCheckpointFiles(Env::Default(), dir.path());
  ASSERT_TRUE(files.ok());
  std::vector<std::string> names;
  for (const CheckpointFile& f : *files) names.push_back(std::filesystem::path(f.path).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"model.ckpt-100.ps0-of-2", "model.ckpt-200.ps0-of-2",
                                              "model.ckpt-300.ps0-of-2", "model.ckpt-400.ps0-of-2",
                                              "model.ckpt-400.ps1-of-2", "model.ckpt-1000.ps0-of-2",
                                              "model.ckpt-1000.ps1-of-2"}));
}

TEST(CheckpointDirTest, RestoreSkipsCorruptNewestWithWarning) {
  ScratchDir dir("restore_corrupt");
  WriteStep(dir.path(), 100, 1, 2);
  WriteStep(dir.path(), 200, 1, 2);
  WriteStep(dir.path(), 300, 1, 2);
  // Newest truncated, the one before corrupted in place.
  const std::string p300 = CheckpointPath(dir.path(), 300, 1, 2);
  std::filesystem::resize_file(p300, std::filesystem::file_size(p300) - 9);
  const std::string p200 = CheckpointPath(dir.path(), 200, 1, 2);
  std::string bytes = *Env::Default()->ReadFile(p200);
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), p200, bytes).ok());

  LogCapture log;
  absl::StatusOr<std::optional<RestorableCheckpoint>> r =
      FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig(), 1, 2, kRestoreNewest);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->data.global_step, 100);
  EXPECT_EQ((*r)->path, CheckpointPath(dir.path(), 100, 1, 2));
  EXPECT_TRUE(log.Contains(absl::StrCat("skipping corrupt checkpoint ", p300, ": ", p300, ": truncated at byte")))
      << log.text();
  EXPECT_TRUE(log.Contains("; trying the previous one")) << log.text();
  EXPECT_TRUE(log.Contains(absl::StrCat("skipping corrupt checkpoint ", p200))) << log.text();
}

TEST(CheckpointDirTest, RestoreChoices) {
  ScratchDir dir("restore_choices");
  EXPECT_FALSE(FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig(), 0, 1, kRestoreNewest)->has_value());
  WriteStep(dir.path(), 100, 0, 1);
  WriteStep(dir.path(), 200, 0, 1);
  EXPECT_FALSE(FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig(), 0, 1, kRestoreNone)->has_value());
  EXPECT_EQ((*FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig(), 0, 1, kRestoreNewest))->data.global_step, 200);
  EXPECT_EQ((*FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig(), 0, 1, 100))->data.global_step, 100);

  // Sync: the exact step is required.
  absl::StatusOr<std::optional<RestorableCheckpoint>> r =
      FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig(), 0, 1, 150);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no checkpoint for step 150")) << r.status();
  // Async: falls back to the newest.
  r = FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig("async"), 0, 1, 150);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->data.global_step, 200);

  // Another model's checkpoint is refused, not skipped.
  TrainConfig other = RestoreConfig();
  other.model_signature = "cnn";
  r = FindCheckpointToRestore(Env::Default(), dir.path(), other, 0, 1, kRestoreNewest);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "another model")) << r.status();

  // Another number of ps tasks: the complete checkpoint of 1 task is resharded (checkpoint_reshard_test has the
  // details); an incomplete one of 3 tasks, newer, is not a candidate.
  WriteStep(dir.path(), 300, 0, 3);
  WriteStep(dir.path(), 300, 2, 3);
  r = FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig(), 0, 2, kRestoreNewest);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->resharded_from, 1);
  EXPECT_EQ((*r)->data.global_step, 200);
  EXPECT_EQ((*r)->data.task_index, 0);
  EXPECT_EQ((*r)->data.num_ps, 2);
  EXPECT_EQ((*r)->path, CheckpointPrefix(dir.path(), 200) + ".ps*-of-1");
  // Only the incomplete one: refused, naming it.
  ScratchDir partial("restore_partial_layout");
  WriteStep(partial.path(), 300, 0, 3);
  r = FindCheckpointToRestore(Env::Default(), partial.path(), RestoreConfig(), 0, 2, kRestoreNewest);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "written by 3 ps tasks")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "none complete")) << r.status();
}

TEST(CheckpointDirTest, RestoreOfACorruptExactStepFailsInSync) {
  ScratchDir dir("restore_exact_corrupt");
  WriteStep(dir.path(), 100, 1, 2);
  WriteStep(dir.path(), 200, 1, 2);
  const std::string p = CheckpointPath(dir.path(), 200, 1, 2);
  std::filesystem::resize_file(p, 40);
  absl::StatusOr<std::optional<RestorableCheckpoint>> r =
      FindCheckpointToRestore(Env::Default(), dir.path(), RestoreConfig(), 1, 2, 200);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), p)) << r.status();
}

}  // namespace
}  // namespace dtrain::ps
