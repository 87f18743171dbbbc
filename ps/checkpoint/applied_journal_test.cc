#include "ps/checkpoint/applied_journal.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/testing/fault_injection_env.h"
#include "common/testing/scratch_dir.h"

namespace dtrain::ps {
namespace {

std::vector<std::string> Lines(const std::string& path) {
  absl::StatusOr<std::string> text = Env::Default()->ReadFile(path);
  EXPECT_TRUE(text.ok()) << text.status();
  return absl::StrSplit(text.value_or(""), '\n', absl::SkipEmpty());
}

TEST(AppliedJournalTest, RecordsOneLineEachInAFileOfItsOwn) {
  testing::ScratchDir dir("journal");
  auto journal = AppliedJournal::Open(Env::Default(), dir.path() + "/ckpt", 1, 3);
  ASSERT_TRUE(journal.ok()) << journal.status();
  (*journal)->Initialized();
  (*journal)->Accepted(2, 7, 123456789012345ull);
  (*journal)->Applied(2, 7, 123456789012345ull, 8);
  (*journal)->Checkpointed(8);
  (*journal)->Restored(8);
  (*journal)->Resharded(5, 2);
  ASSERT_TRUE((*journal)->Sync().ok());
  const std::vector<std::string> lines = Lines((*journal)->path());
  ASSERT_EQ(lines.size(), 7u);
  EXPECT_EQ(lines[0].rfind("# dtrain applied journal v1 task=1 num_ps=3 pid=", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1], "I");
  EXPECT_EQ(lines[2], "K 2 7 123456789012345");
  EXPECT_EQ(lines[3], "A 2 7 123456789012345 8");
  EXPECT_EQ(lines[4], "C 8");
  EXPECT_EQ(lines[5], "R 8");
  EXPECT_EQ(lines[6], "X 5 2");

  // A second process (a restarted task) writes a file of its own, once it has something to record, and the
  // names say whose they are.
  auto again = AppliedJournal::Open(Env::Default(), dir.path() + "/ckpt", 1, 3);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Sync().ok());
  EXPECT_EQ((*again)->path(), "");
  EXPECT_EQ(Env::Default()->GetChildren(dir.path() + "/ckpt")->size(), 1u);  // nothing recorded: no file
  (*again)->Restored(8);
  EXPECT_NE((*again)->path(), "");
  EXPECT_NE((*again)->path(), (*journal)->path());
  EXPECT_EQ(Lines((*again)->path()).back(), "R 8");
  const std::string name = (*journal)->path().substr((*journal)->path().rfind('/') + 1);
  int task = -1, num_ps = -1;
  EXPECT_TRUE(AppliedJournal::ParseFileName(name, &task, &num_ps)) << name;
  EXPECT_EQ(task, 1);
  EXPECT_EQ(num_ps, 3);
  for (const char* bad : {"model.ckpt-5.ps0-of-1", "applied.ps0-of-1.journal", "applied.ps3-of-2.1-2.journal",
                          "applied.ps0-of-1.12-34.journal.tmp"}) {
    EXPECT_FALSE(AppliedJournal::ParseFileName(bad, &task, &num_ps)) << bad;
  }
}

TEST(AppliedJournalTest, AFullDiskStopsTheJournalAndSyncSaysSo) {
  testing::ScratchDir dir("journal_full");
  testing::FaultInjectionEnv env(Env::Default());
  auto journal = AppliedJournal::Open(&env, dir.path(), 0, 1);
  ASSERT_TRUE(journal.ok()) << journal.status();
  (*journal)->Initialized();  // the file and its first line
  env.FailWritesAfter(12);
  (*journal)->Accepted(0, 1, 2);    // 8 bytes: written
  (*journal)->Accepted(0, 10, 20);  // does not fit
  (*journal)->Checkpointed(3);      // not written either: the journal stopped
  const absl::Status s = (*journal)->Sync();
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  env.ClearFaults();
  const std::vector<std::string> lines = Lines((*journal)->path());
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[2], "K 0 1 2");
  for (const std::string& l : lines) EXPECT_NE(l, "C 3");
}

}  // namespace
}  // namespace dtrain::ps
