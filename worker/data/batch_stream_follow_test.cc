// FollowFiles: batches over files in name order that span files, each worker its shard of every file, a file that
// arrives later picked up, late and unfinished files left alone, the end by idleness or stop, a resumed position
// that gives the same batches, and the errors of bad files and positions.
#include "worker/data/batch_stream_follow.h"

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "worker/data/criteo.h"

namespace dtrain::data {
namespace {

class FollowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/follow." + std::to_string(::getpid()) + "." +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(WriteCriteoLayout(dir_, CriteoLayout{1, 2}).ok());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // `n` examples whose dense feature is first, first + 1, ... (as log1p values) and label their parity.
  void WriteFile(const std::string& name, int first, int n) {
    std::string text;
    for (int i = first; i < first + n; ++i) absl::StrAppend(&text, i % 2, "\t", i, "\t", "a", i, "\tb", i % 7, "\n");
    ASSERT_TRUE(WriteFileAtomically(dir_ + "/" + name, text).ok());
  }
  // The examples of a batch, by their dense feature (the integer written).
  static std::vector<int> Examples(const Batch& b) {
    std::vector<int> v;
    for (int i = 0; i < b.batch; ++i) v.push_back(static_cast<int>(std::lround(std::expm1(b.dense[i]))));
    return v;
  }
  FollowOptions Options(absl::Duration idle = absl::Milliseconds(300)) {
    FollowOptions o;
    o.dir = dir_;
    o.poll = absl::Milliseconds(20);
    o.idle_timeout = idle;
    return o;
  }
  static BatchStreamOptions Batches(int batch, int shard = 0, int shards = 1) {
    BatchStreamOptions b;
    b.batch_size = batch;
    b.shard_index = shard;
    b.num_shards = shards;
    b.shuffle = false;
    return b;
  }

  std::string dir_;
};

TEST_F(FollowTest, ReadsFilesInNameOrderAcrossBatchesAndPicksUpNewOnes) {
  WriteFile("part-001", 10, 5);
  WriteFile("part-000", 1, 5);  // written second, read first: the names decide
  Dataset shape;
  auto s = FollowFiles(Options(absl::Seconds(2)), Batches(4), &shape);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(shape.num_dense, 1);
  EXPECT_EQ(shape.num_sparse, 2);
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({1, 2, 3, 4}));
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({5, 10, 11, 12}));  // across two files
  std::thread later([this] {
    absl::SleepFor(absl::Milliseconds(200));
    WriteFile("part-002.tmp", 90, 3);  // unfinished: never read
    WriteFile(".hidden", 90, 3);
    WriteFile("part-002", 20, 7);
  });
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({13, 14, 20, 21}));
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({22, 23, 24, 25}));
  later.join();
  // Then nothing new: 26 waits in a partial batch, and the input ends (OK) after the idle time.
  EXPECT_EQ((*s)->Next().batch, 0);
  EXPECT_TRUE((*s)->status().ok()) << (*s)->status();
  EXPECT_EQ((*s)->batches_read(), 4);
}

TEST_F(FollowTest, EachWorkerTakesItsShardOfEveryFile) {
  WriteFile("a", 0, 6);
  WriteFile("b", 100, 6);
  for (int shard = 0; shard < 2; ++shard) {
    Dataset shape;
    auto s = FollowFiles(Options(), Batches(3, shard, 2), &shape);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(Examples((*s)->Next()), shard == 0 ? std::vector<int>({0, 2, 4}) : std::vector<int>({1, 3, 5}));
    EXPECT_EQ(Examples((*s)->Next()),
              shard == 0 ? std::vector<int>({100, 102, 104}) : std::vector<int>({101, 103, 105}));
  }
}

TEST_F(FollowTest, ARestoredPositionGivesTheSameBatches) {
  WriteFile("p0", 0, 7);
  WriteFile("p1", 50, 9);
  BatchStreamOptions b = Batches(3);
  b.shuffle = true;
  Dataset shape;
  auto a = FollowFiles(Options(), b, &shape);
  ASSERT_TRUE(a.ok());
  (*a)->Next();
  (*a)->Next();
  const std::string pos = (*a)->SaveState();
  std::vector<std::vector<int>> rest;
  for (int i = 0; i < 3; ++i) rest.push_back(Examples((*a)->Next()));
  auto again = FollowFiles(Options(), b, &shape);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Restore(pos).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Examples((*again)->Next()), rest[i]) << i;
  EXPECT_EQ((*again)->batches_read(), 5);
  // Another stream's position, a damaged one, one whose file is gone.
  auto other = FollowFiles(Options(), Batches(4), &shape);
  EXPECT_TRUE(absl::IsFailedPrecondition((*other)->Restore(pos)));
  std::string bad = pos;
  bad[bad.size() - 6] ^= 1;
  EXPECT_TRUE(absl::IsDataLoss((*again)->Restore(bad)));
  std::filesystem::remove(dir_ + "/p0");  // the file the position is in
  EXPECT_TRUE(absl::IsFailedPrecondition((*again)->Restore(pos)));
}

TEST_F(FollowTest, ALateFileIsSkippedAndABadFileEndsTheInputWithItsError) {
  WriteFile("m", 0, 4);
  Dataset shape;
  auto s = FollowFiles(Options(absl::Seconds(2)), Batches(4), &shape);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({0, 1, 2, 3}));
  WriteFile("n", 10, 4);
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({10, 11, 12, 13}));
  WriteFile("a-late", 90, 4);  // sorts before what was read
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/z", "1\t2\tx\n").ok());  // 3 fields, the layout wants 4
  EXPECT_EQ((*s)->Next().batch, 0);
  EXPECT_TRUE(absl::IsDataLoss((*s)->status())) << (*s)->status();
  EXPECT_NE((*s)->status().message().find("/z:1"), std::string::npos) << (*s)->status();
}

TEST_F(FollowTest, StopEndsTheInputAndNoFileIsNotFound) {
  std::atomic<bool> stop{false};
  FollowOptions o = Options(absl::InfiniteDuration());
  o.stop = [&stop] { return stop.load(); };
  Dataset shape;
  std::thread stopper([&stop] {
    absl::SleepFor(absl::Milliseconds(100));
    stop = true;
  });
  EXPECT_TRUE(absl::IsNotFound(FollowFiles(o, Batches(2), &shape).status()));
  stopper.join();
  stop = false;
  WriteFile("x", 0, 3);
  auto s = FollowFiles(o, Batches(2), &shape);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Next().batch, 2);
  stop = true;
  EXPECT_EQ((*s)->Next().batch, 0);
  EXPECT_TRUE((*s)->status().ok());
  o.dir = dir_ + "/missing";
  EXPECT_TRUE(absl::IsInvalidArgument(FollowFiles(o, Batches(2), &shape).status()));
}

}  // namespace
}  // namespace dtrain::data
