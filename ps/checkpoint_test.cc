#include "ps/checkpoint.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "ps/checkpoint_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::LogCapture;
using ::dtrain::ps::testing::ScratchDir;

// Bitwise equality, so -0.0, NaN payloads and denormals count.
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

CheckpointData MakeData(int num_slices, int num_slots, bool averages, int64_t step = 1200) {
  CheckpointData d;
  d.task_index = 1;
  d.num_ps = 2;
  d.global_step = step;
  d.task_step = step;
  d.model_signature = "mlp/v1/784x500,500/abcd";
  d.optimizer = num_slots == 2 ? "adam" : num_slots == 1 ? "momentum" : "sgd";
  d.num_slots = num_slots;
  d.has_moving_averages = averages;
  int64_t offset = 0;
  for (int i = 0; i < num_slices; ++i) {
    SliceState s;
    s.spec = SliceSpec{static_cast<uint32_t>(3 * i + 1), absl::StrCat("layer", i, "/weights"), offset, 5 + 3 * i};
    offset += s.spec.length + 7;
    for (int64_t j = 0; j < s.spec.length; ++j) s.values.push_back(0.25f * i - 0.01f * j);
    s.slots.resize(num_slots);
    for (int k = 0; k < num_slots; ++k) {
      for (int64_t j = 0; j < s.spec.length; ++j) s.slots[k].push_back(1e-3f * (k + 1) * (j + i));
    }
    if (averages) {
      for (int64_t j = 0; j < s.spec.length; ++j) s.moving_average.push_back(-0.5f * j + i);
    }
    d.slices.push_back(std::move(s));
  }
  d.slices[0].values[0] = -0.0f;
  d.slices[0].values[1] = std::numeric_limits<float>::denorm_min();
  d.slices[0].values[2] = std::numeric_limits<float>::quiet_NaN();
  return d;
}

void ExpectSame(const CheckpointData& a, const CheckpointData& b) {
  EXPECT_EQ(a.task_index, b.task_index);
  EXPECT_EQ(a.num_ps, b.num_ps);
  EXPECT_EQ(a.global_step, b.global_step);
  EXPECT_EQ(a.task_step, b.task_step);
  EXPECT_EQ(a.model_signature, b.model_signature);
  EXPECT_EQ(a.optimizer, b.optimizer);
  EXPECT_EQ(a.num_slots, b.num_slots);
  EXPECT_EQ(a.has_moving_averages, b.has_moving_averages);
  ASSERT_EQ(a.slices.size(), b.slices.size());
  for (size_t i = 0; i < a.slices.size(); ++i) {
    EXPECT_EQ(a.slices[i].spec, b.slices[i].spec) << i;
    EXPECT_TRUE(SameBits(a.slices[i].values, b.slices[i].values)) << i;
    ASSERT_EQ(a.slices[i].slots.size(), b.slices[i].slots.size()) << i;
    for (size_t k = 0; k < a.slices[i].slots.size(); ++k) {
      EXPECT_TRUE(SameBits(a.slices[i].slots[k], b.slices[i].slots[k])) << i << " slot " << k;
    }
    EXPECT_TRUE(SameBits(a.slices[i].moving_average, b.slices[i].moving_average)) << i;
  }
}

TEST(CheckpointTest, RoundTripIsExact) {
  for (int slots : {0, 1, 2}) {
    for (bool averages : {false, true}) {
      const CheckpointData d = MakeData(4, slots, averages);
      absl::StatusOr<CheckpointData> back = ParseCheckpoint(SerializeCheckpoint(d), "mem");
      ASSERT_TRUE(back.ok()) << back.status();
      ExpectSame(d, *back);
    }
  }
}

TEST(CheckpointTest, WriteAndReadFile) {
  ScratchDir dir("write_read");
  const CheckpointData d = MakeData(3, 2, true, 300);
  const std::string path = CheckpointPath(dir.path() + "/sub", 300, 1, 2);
  EXPECT_TRUE(absl::EndsWith(path, "/sub/model.ckpt-300.ps1-of-2")) << path;
  ASSERT_TRUE(WriteCheckpoint(path, d).ok());  // creates the missing directory
  absl::StatusOr<CheckpointData> back = ReadCheckpoint(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSame(d, *back);
  // No temporary file left behind.
  absl::StatusOr<std::vector<CheckpointFile>> files = ListCheckpointFiles(dir.path() + "/sub");
  ASSERT_TRUE(files.ok());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path() + "/sub"), {}), 1);
}

TEST(CheckpointTest, FileNames) {
  CheckpointFile f;
  ASSERT_TRUE(ParseCheckpointFileName("model.ckpt-1500.ps2-of-3", &f));
  EXPECT_EQ(f.step, 1500);
  EXPECT_EQ(f.task, 2);
  EXPECT_EQ(f.num_ps, 3);
  for (const char* bad : {"model.ckpt-1500.ps3-of-3", "model.ckpt-x.ps0-of-1", "model.ckpt-15.ps0-of-1.tmp.123",
                          "model.ckpt-15.ps0-of-0", "checkpoint", "model.ckpt-15", "model.ckpt-.ps0-of-1"}) {
    EXPECT_FALSE(ParseCheckpointFileName(bad, &f)) << bad;
  }
  EXPECT_EQ(CheckpointPrefix("/a/b/", 7), "/a/b/model.ckpt-7");
}

TEST(CheckpointTest, TruncatedFileIsDataLossWithTheByte) {
  const std::string bytes = SerializeCheckpoint(MakeData(4, 1, true));
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<CheckpointData> r = ParseCheckpoint(bytes.substr(0, n), "/ckpt/model.ckpt-1200.ps1-of-2");
    ASSERT_FALSE(r.ok()) << "accepted a file truncated to " << n << " bytes";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_TRUE(absl::StartsWith(r.status().message(), "/ckpt/model.ckpt-1200.ps1-of-2: ")) << r.status();
    if (n >= 8) {
      EXPECT_TRUE(absl::StrContains(r.status().message(), absl::StrCat("truncated at byte ", n)) ||
                  absl::StrContains(r.status().message(), "checksum mismatch"))
          << n << ": " << r.status();
    }
  }
  // Cut inside the values of the last slice: named as truncation.
  absl::StatusOr<CheckpointData> r = ParseCheckpoint(bytes.substr(0, bytes.size() - 30), "f");
  EXPECT_TRUE(absl::StrContains(r.status().message(), absl::StrCat("truncated at byte ", bytes.size() - 30)))
      << r.status();
}

TEST(CheckpointTest, EveryCorruptedByteIsDetected) {
  const std::string bytes = SerializeCheckpoint(MakeData(3, 2, true));
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x20;
    absl::StatusOr<CheckpointData> r = ParseCheckpoint(bad, "f");
    ASSERT_FALSE(r.ok()) << "accepted a file with byte " << i << " flipped";
    if (i >= 8 && i < 12) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();  // the version
    } else {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << i << ": " << r.status();
    }
  }
}

TEST(CheckpointTest, MessagesNameTheDamagedPart) {
  const CheckpointData d = MakeData(5, 0, false);
  const std::string bytes = SerializeCheckpoint(d);
  // Locate slice 3's values by re-serializing a prefix: header + slices 0..2, then into slice 3's body.
  CheckpointData first3 = d;
  first3.slices.resize(3);
  const size_t slice3_start = SerializeCheckpoint(first3).size() - 20;  // minus the trailer
  std::string bad = bytes;
  bad[slice3_start + 40] ^= 0x01;
  absl::StatusOr<CheckpointData> r = ParseCheckpoint(bad, "x.ckpt");
  EXPECT_EQ(r.status().message(), "x.ckpt: checksum mismatch in slice 3") << r.status();

  bad = bytes;
  bad[20] ^= 0x01;  // inside the header body
  r = ParseCheckpoint(bad, "x.ckpt");
  EXPECT_EQ(r.status().message(), "x.ckpt: checksum mismatch in header") << r.status();

  bad = bytes;
  std::memcpy(bad.data(), "GARBAGE!", 8);
  r = ParseCheckpoint(bad, "x.ckpt");
  EXPECT_EQ(r.status().message(), "x.ckpt: bad magic: not a dtrain checkpoint");

  r = ParseCheckpoint(bytes + "extra", "x.ckpt");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "unexpected bytes after the trailer")) << r.status();
}

TrainConfig ConfigFor(const CheckpointData& d) {
  TrainConfig c;
  c.model_signature = d.model_signature;
  c.optimizer.name = d.optimizer;
  for (const SliceState& s : d.slices) c.slices.push_back(s.spec);
  return c;
}

TEST(CheckpointTest, CompatibilityChecks) {
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

void WriteStep(const std::string& dir, int64_t step, int task, int num_ps, const std::string& signature = "sig") {
  CheckpointData d = MakeData(2, 0, false, step);
  d.task_index = task;
  d.num_ps = num_ps;
  d.model_signature = signature;
  d.slices[0].values.assign(d.slices[0].values.size(), static_cast<float>(step));
  ASSERT_TRUE(WriteCheckpoint(CheckpointPath(dir, step, task, num_ps), d).ok());
}

TrainConfig RestoreConfig(const std::string& mode = "sync") {
  TrainConfig c = ConfigFor(MakeData(2, 0, false));
  c.model_signature = "sig";
  c.mode = mode;
  return c;
}

TEST(CheckpointTest, PruneKeepsTheNewestOfThisTask) {
  ScratchDir dir("prune");
  for (int64_t step : {100, 200, 300, 400, 1000}) {
    WriteStep(dir.path(), step, 0, 2);
    WriteStep(dir.path(), step, 1, 2);
  }
  ASSERT_TRUE(PruneCheckpoints(dir.path(), 1, 2, 2).ok());
  absl::StatusOr<std::vector<CheckpointFile>> files = ListCheckpointFiles(dir.path());
  ASSERT_TRUE(files.ok());
  std::vector<std::string> names;
  for (const CheckpointFile& f : *files) names.push_back(std::filesystem::path(f.path).filename().string());
  EXPECT_EQ(names, (std::vector<std::string>{"model.ckpt-100.ps0-of-2", "model.ckpt-200.ps0-of-2",
                                              "model.ckpt-300.ps0-of-2", "model.ckpt-400.ps0-of-2",
                                              "model.ckpt-400.ps1-of-2", "model.ckpt-1000.ps0-of-2",
                                              "model.ckpt-1000.ps1-of-2"}));
}

TEST(CheckpointTest, RestoreSkipsCorruptNewestWithWarning) {
  ScratchDir dir("restore_corrupt");
  WriteStep(dir.path(), 100, 1, 2);
  WriteStep(dir.path(), 200, 1, 2);
  WriteStep(dir.path(), 300, 1, 2);
  // Newest truncated, the one before corrupted in place.
  const std::string p300 = CheckpointPath(dir.path(), 300, 1, 2);
  std::filesystem::resize_file(p300, std::filesystem::file_size(p300) - 9);
  const std::string p200 = CheckpointPath(dir.path(), 200, 1, 2);
  std::string bytes = *ReadFileToString(p200);
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(WriteFileAtomically(p200, bytes).ok());

  LogCapture log;
  absl::StatusOr<std::optional<RestorableCheckpoint>> r =
      FindCheckpointToRestore(dir.path(), RestoreConfig(), 1, 2, kRestoreNewest);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->data.global_step, 100);
  EXPECT_EQ((*r)->path, CheckpointPath(dir.path(), 100, 1, 2));
  EXPECT_TRUE(log.Contains(absl::StrCat("skipping corrupt checkpoint ", p300, ": ", p300, ": truncated at byte")))
      << log.text();
  EXPECT_TRUE(log.Contains("; trying the previous one")) << log.text();
  EXPECT_TRUE(log.Contains(absl::StrCat("skipping corrupt checkpoint ", p200))) << log.text();
}

TEST(CheckpointTest, RestoreChoices) {
  ScratchDir dir("restore_choices");
  EXPECT_FALSE(FindCheckpointToRestore(dir.path(), RestoreConfig(), 0, 1, kRestoreNewest)->has_value());
  WriteStep(dir.path(), 100, 0, 1);
  WriteStep(dir.path(), 200, 0, 1);
  EXPECT_FALSE(FindCheckpointToRestore(dir.path(), RestoreConfig(), 0, 1, kRestoreNone)->has_value());
  EXPECT_EQ((*FindCheckpointToRestore(dir.path(), RestoreConfig(), 0, 1, kRestoreNewest))->data.global_step, 200);
  EXPECT_EQ((*FindCheckpointToRestore(dir.path(), RestoreConfig(), 0, 1, 100))->data.global_step, 100);

  // Sync: the exact step is required.
  absl::StatusOr<std::optional<RestorableCheckpoint>> r =
      FindCheckpointToRestore(dir.path(), RestoreConfig(), 0, 1, 150);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "no checkpoint for step 150")) << r.status();
  // Async: falls back to the newest.
  r = FindCheckpointToRestore(dir.path(), RestoreConfig("async"), 0, 1, 150);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->data.global_step, 200);

  // Another model's checkpoint is refused, not skipped.
  TrainConfig other = RestoreConfig();
  other.model_signature = "cnn";
  r = FindCheckpointToRestore(dir.path(), other, 0, 1, kRestoreNewest);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "another model")) << r.status();

  // Another number of ps tasks.
  r = FindCheckpointToRestore(dir.path(), RestoreConfig(), 0, 2, kRestoreNewest);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "written by 1 ps tasks")) << r.status();
}

TEST(CheckpointTest, RestoreOfACorruptExactStepFailsInSync) {
  ScratchDir dir("restore_exact_corrupt");
  WriteStep(dir.path(), 100, 1, 2);
  WriteStep(dir.path(), 200, 1, 2);
  const std::string p = CheckpointPath(dir.path(), 200, 1, 2);
  std::filesystem::resize_file(p, 40);
  absl::StatusOr<std::optional<RestorableCheckpoint>> r =
      FindCheckpointToRestore(dir.path(), RestoreConfig(), 1, 2, 200);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), p)) << r.status();
}

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
    ASSERT_TRUE(WriteCheckpoint(CheckpointPath(dir, step, task, 2), d).ok());
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

  absl::StatusOr<std::vector<CheckpointData>> parts = ReadCheckpointSet(dir.path());
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].global_step, 10);
  absl::StatusOr<std::vector<float>> flat = AssembleFlatBuffer(*parts, 10, false);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(*flat, (std::vector<float>{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  flat = AssembleFlatBuffer(*parts, 10, true);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(*flat, (std::vector<float>{0, -1, -2, -3, -4, -5, -6, -7, -8, -9}));

  parts = ReadCheckpointSet(CheckpointPrefix(dir.path(), 10));
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ((*parts)[1].task_index, 1);
  EXPECT_EQ(ReadCheckpointSet(CheckpointPrefix(dir.path(), 20)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpointSet(CheckpointPrefix(dir.path(), 30)).status().code(), absl::StatusCode::kNotFound);
  absl::Status missing = ReadCheckpointSet(CheckpointPrefix(dir.path(), 40)).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.message(), "10, 20, 30")) << missing;
  EXPECT_EQ(ReadCheckpointSet(dir.path() + "/nonsense").status().code(), absl::StatusCode::kInvalidArgument);

  // Coverage: a missing task leaves a gap; a bigger model is not covered; a smaller one is exceeded.
  parts = ReadCheckpointSet(CheckpointPrefix(dir.path(), 10));
  std::vector<CheckpointData> only0 = {(*parts)[0]};
  absl::Status gap = AssembleFlatBuffer(only0, 10, false).status();
  EXPECT_EQ(gap.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(gap.message(), "does not cover parameter 4")) << gap;
  EXPECT_EQ(AssembleFlatBuffer(*parts, 11, false).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(AssembleFlatBuffer(*parts, 9, false).status().code(), absl::StatusCode::kFailedPrecondition);
  std::vector<CheckpointData> twice = {(*parts)[0], (*parts)[1], (*parts)[1]};
  EXPECT_TRUE(absl::StrContains(AssembleFlatBuffer(twice, 10, false).status().message(), "overlaps"));
}

}  // namespace
}  // namespace dtrain::ps
