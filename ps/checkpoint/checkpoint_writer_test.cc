#include "ps/checkpoint/checkpoint_writer.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "common/testing/fault_injection_env.h"
#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::ExpectSame;
using ::dtrain::ps::testing::LogCapture;
using ::dtrain::ps::testing::MakeData;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::testing::FaultInjectionEnv;

// Task 1 of 2, as MakeData builds it.
class CheckpointWriterTest : public ::testing::Test {
 protected:
  CheckpointWriterTest() : dir_("writer"), env_(Env::Default()) {
    options_.dir = dir_.path() + "/ckpt";  // created by the first save
    options_.keep = 2;
    options_.env = &env_;
  }

  std::vector<std::string> Names() {
    absl::StatusOr<std::vector<std::string>> names = Env::Default()->GetChildren(options_.dir);
    EXPECT_TRUE(names.ok()) << names.status();
    std::vector<std::string> sorted = names.ok() ? *names : std::vector<std::string>{};
    std::sort(sorted.begin(), sorted.end());
    return sorted;
  }

  // The checkpoint task 1 restores: it must be `want`, bit for bit.
  void ExpectRestores(const CheckpointData& want) {
    TrainConfig config;
    config.model_signature = want.model_signature;
    config.optimizer.name = want.optimizer;
    for (const SliceState& s : want.slices) config.slices.push_back(s.spec);
    absl::StatusOr<std::optional<RestorableCheckpoint>> r =
        FindCheckpointToRestore(Env::Default(), options_.dir, config, 1, 2, kRestoreNewest);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value());
    ExpectSame(want, (*r)->data);
  }

  ScratchDir dir_;
  FaultInjectionEnv env_;
  CheckpointOptions options_;
};

TEST_F(CheckpointWriterTest, SavesAndKeepsTheNewest) {
  CheckpointWriter writer(options_, 1, 2);
  for (int64_t step : {10, 20, 30}) {
    ASSERT_TRUE(writer.Save(MakeData(2, 1, true, step)).ok());
  }
  EXPECT_EQ(Names(), (std::vector<std::string>{"model.ckpt-20.ps1-of-2", "model.ckpt-30.ps1-of-2"}));
  EXPECT_TRUE(writer.last_status().ok());
  EXPECT_TRUE(writer.last_prune_status().ok());
  EXPECT_EQ(writer.failed_saves(), 0);
  EXPECT_TRUE(env_.sleeps().empty());
  ExpectRestores(MakeData(2, 1, true, 30));
}

// The disk fills up: every attempt fails, the error comes back and is logged, the checkpoint saved before is
// intact and restorable, no temporary file is left, and a save after the disk has room again succeeds.
TEST_F(CheckpointWriterTest, FullDiskIsRetriedReportedAndLosesNothing) {
  CheckpointWriter writer(options_, 1, 2);
  const CheckpointData before = MakeData(3, 2, true, 100);
  ASSERT_TRUE(writer.Save(before).ok());

  env_.FailWritesAfter(50);
  LogCapture log;
  const absl::Status s = writer.Save(MakeData(3, 2, true, 200));
  const std::string path = CheckpointPath(options_.dir, 200, 1, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(
      absl::StartsWith(s.message(), "ps task 1: cannot save checkpoint " + path + " after 3 attempts: "))
      << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "No space left on device")) << s;
  EXPECT_TRUE(log.Contains("ERROR: ps task 1: cannot save checkpoint " + path)) << log.text();
  EXPECT_TRUE(log.Contains("older checkpoints in " + options_.dir + " are kept")) << log.text();
  EXPECT_TRUE(log.Contains("attempt 1 of 3 failed")) << log.text();
  EXPECT_EQ(writer.last_status(), s);
  EXPECT_EQ(writer.failed_saves(), 1);
  // Backoff between the attempts: 200 ms, then doubled.
  EXPECT_EQ(env_.sleeps(), (std::vector<absl::Duration>{absl::Milliseconds(200), absl::Milliseconds(400)}));
  EXPECT_EQ(Names(), (std::vector<std::string>{"model.ckpt-100.ps1-of-2"}));
  ExpectRestores(before);

  env_.ClearFaults();
  const CheckpointData after = MakeData(3, 2, true, 300);
  ASSERT_TRUE(writer.Save(after).ok());
  EXPECT_TRUE(writer.last_status().ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"model.ckpt-100.ps1-of-2", "model.ckpt-300.ps1-of-2"}));
  ExpectRestores(after);
}

TEST_F(CheckpointWriterTest, FailedRenameIsRetriedReportedAndLosesNothing) {
  CheckpointWriter writer(options_, 1, 2);
  const CheckpointData before = MakeData(2, 0, false, 7);
  ASSERT_TRUE(writer.Save(before).ok());
  env_.FailRenames(3);
  const absl::Status s = writer.Save(MakeData(2, 0, false, 8));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "cannot rename")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "after 3 attempts")) << s;
  EXPECT_EQ(Names(), (std::vector<std::string>{"model.ckpt-7.ps1-of-2"}));
  ExpectRestores(before);
  // The fault has cleared (three renames failed): the next save works.
  ASSERT_TRUE(writer.Save(MakeData(2, 0, false, 9)).ok());
  ExpectRestores(MakeData(2, 0, false, 9));
}

TEST_F(CheckpointWriterTest, FailedFsyncIsRetriedReportedAndLosesNothing) {
  CheckpointWriter writer(options_, 1, 2);
  const CheckpointData before = MakeData(2, 1, false, 7);
  ASSERT_TRUE(writer.Save(before).ok());
  env_.FailSyncs(3);
  const absl::Status s = writer.Save(MakeData(2, 1, false, 8));
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "cannot fsync")) << s;
  EXPECT_EQ(Names(), (std::vector<std::string>{"model.ckpt-7.ps1-of-2"}));
  ExpectRestores(before);
}

// A fault that clears before the attempts run out costs a retry, not the checkpoint.
TEST_F(CheckpointWriterTest, TransientFaultSucceedsOnALaterAttempt) {
  CheckpointWriter writer(options_, 1, 2);
  env_.FailRenames(2);
  LogCapture log;
  ASSERT_TRUE(writer.Save(MakeData(2, 1, true, 5)).ok());
  EXPECT_EQ(env_.sleeps().size(), 2u);
  EXPECT_TRUE(log.Contains("attempt 2 of 3 failed")) << log.text();
  EXPECT_TRUE(log.Contains("(attempt 3)")) << log.text();
  EXPECT_EQ(writer.failed_saves(), 0);
  ExpectRestores(MakeData(2, 1, true, 5));
}

TEST_F(CheckpointWriterTest, BackoffDoublesUpToItsCap) {
  options_.max_attempts = 5;
  options_.initial_backoff = absl::Seconds(1);
  options_.max_backoff = absl::Seconds(3);
  CheckpointWriter writer(options_, 1, 2);
  env_.FailRenames(100);
  EXPECT_FALSE(writer.Save(MakeData(1, 0, false, 1)).ok());
  EXPECT_EQ(env_.sleeps(), (std::vector<absl::Duration>{absl::Seconds(1), absl::Seconds(2), absl::Seconds(3),
                                                        absl::Seconds(3)}));
}

// A failed pruning does not fail the save: it is logged and kept apart.
TEST_F(CheckpointWriterTest, FailedPruningIsReportedSeparately) {
  options_.keep = 1;
  CheckpointWriter writer(options_, 1, 2);
  ASSERT_TRUE(writer.Save(MakeData(1, 0, false, 1)).ok());
  env_.FailRemoves(1);
  LogCapture log;
  EXPECT_TRUE(writer.Save(MakeData(1, 0, false, 2)).ok());
  EXPECT_FALSE(writer.last_prune_status().ok());
  EXPECT_TRUE(absl::StrContains(writer.last_prune_status().message(), "cannot delete old checkpoint"))
      << log.text();
  EXPECT_TRUE(log.Contains("pruning old checkpoints")) << log.text();
  EXPECT_EQ(Names(), (std::vector<std::string>{"model.ckpt-1.ps1-of-2", "model.ckpt-2.ps1-of-2"}));
  ASSERT_TRUE(writer.Save(MakeData(1, 0, false, 3)).ok());
  EXPECT_TRUE(writer.last_prune_status().ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"model.ckpt-3.ps1-of-2"}));
}

TEST(CheckpointOptionsTest, Validation) {
  CheckpointOptions o;
  EXPECT_TRUE(ValidateCheckpointOptions(o).ok());
  auto message = [](const CheckpointOptions& bad) {
    const absl::Status s = ValidateCheckpointOptions(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    return std::string(s.message());
  };
  CheckpointOptions bad = o;
  bad.save_steps = -1;
  EXPECT_TRUE(absl::StrContains(message(bad), "save_steps -1")) << message(bad);
  bad = o;
  bad.save_secs = -0.5;
  EXPECT_TRUE(absl::StrContains(message(bad), "save_secs -0.5")) << message(bad);
  bad = o;
  bad.keep = -2;
  EXPECT_TRUE(absl::StrContains(message(bad), "keep -2")) << message(bad);
  bad = o;
  bad.max_attempts = 0;
  EXPECT_TRUE(absl::StrContains(message(bad), "max_attempts 0")) << message(bad);
  bad = o;
  bad.max_backoff = absl::Milliseconds(1);
  EXPECT_TRUE(absl::StrContains(message(bad), "max_backoff")) << message(bad);
  bad = o;
  bad.env = nullptr;
  EXPECT_TRUE(absl::StrContains(message(bad), "env")) << message(bad);
}

}  // namespace
}  // namespace dtrain::ps
