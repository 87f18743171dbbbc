// FollowFiles: batches over files in name order that span files, each worker its shard of every file, a file that
// arrives later picked up, late and unfinished files left alone, the end by idleness or stop, a resumed position
// that gives the same batches, bad files set aside (--bad_records=skip) or ending the input (fail), a file read
// while it is written in place read again once finished, and the errors of positions.
#include "worker/data/batch_stream_follow.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/file_util.h"
#include "absl/synchronization/mutex.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "worker/data/criteo.h"

namespace dtrain::data {
namespace {

// The WARNING lines logged while it is registered.
class Warnings : public google::LogSink {
 public:
  Warnings() { google::AddLogSink(this); }
  ~Warnings() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity severity, const char*, const char*, int, const struct ::tm*, const char* message,
            size_t length) override {
    if (severity != google::GLOG_WARNING) return;
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(message, length);
  }
  std::vector<std::string> lines() {
    absl::MutexLock lock(&mu_);
    return lines_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> lines_;
};

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

TEST_F(FollowTest, ALateFileIsSkippedAndWithFailABadFileEndsTheInputWithItsError) {
  WriteFile("m", 0, 4);
  Dataset shape;
  FollowOptions o = Options(absl::Seconds(2));
  o.bad_files = BadExamples::kFail;
  auto s = FollowFiles(o, Batches(4), &shape);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({0, 1, 2, 3}));
  WriteFile("n", 10, 4);
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({10, 11, 12, 13}));
  WriteFile("a-late", 90, 4);  // sorts before what was read
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/z", "1\t2\ta\n").ok());  // 3 fields, the layout wants 4
  EXPECT_EQ((*s)->Next().batch, 0);
  EXPECT_TRUE(absl::IsDataLoss((*s)->status())) << (*s)->status();
  EXPECT_NE((*s)->status().message().find("/z:1: 3 fields"), std::string::npos) << (*s)->status();
  EXPECT_NE((*s)->status().message().find("--bad_records=fail"), std::string::npos) << (*s)->status();
}

// Good, bad, good: the stream yields the good files' examples, sets the bad one aside (counted) and a restore from
// before the bad file reads on after it as the first stream did.
TEST_F(FollowTest, ABadFileIsSetAsideAndTheInputGoesOn) {
  WriteFile("a", 0, 4);
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/b", "0\t1\ta\tb\n1\t2\ta\n0\t3\ta\tb\n").ok());  // line 2: 3 fields
  WriteFile("c", 10, 4);
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/d", "0\t1\ta\tb\n1\tmany\ta\tb\n").ok());  // not an integer
  WriteFile("e", 20, 4);
  SetAsideCounts counts;
  FollowOptions o = Options();
  o.set_aside = &counts;
  Dataset shape;
  Warnings warnings;
  auto s = FollowFiles(o, Batches(4), &shape);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({0, 1, 2, 3}));
  const std::string before_b = (*s)->SaveState();
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({10, 11, 12, 13}));
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({20, 21, 22, 23}));
  EXPECT_EQ((*s)->Next().batch, 0);  // then the input ends by idleness, not by an error
  EXPECT_TRUE((*s)->status().ok()) << (*s)->status();
  EXPECT_EQ((*s)->batches_read(), 3);
  EXPECT_EQ(counts.files.load(), 2);
  EXPECT_EQ(counts.lines.load(), 5);
  // One line each: the file, the line and what is wrong, how much of it is not trained on.
  const std::vector<std::string> lines = warnings.lines();
  ASSERT_EQ(lines.size(), 2u) << absl::StrJoin(lines, "\n");
  EXPECT_NE(lines[0].find("set aside b: " + dir_ + "/b:2: 3 fields, expected 4"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("its 3 lines not trained on"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("/d:2: field 2 (I1): \"many\" is not an integer"), std::string::npos) << lines[1];
  // The position before the bad files: they are set aside again, the batches and their indices are the same.
  auto again = FollowFiles(Options(), Batches(4), &shape);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Restore(before_b).ok());
  EXPECT_EQ((*again)->batches_read(), 1);
  EXPECT_EQ(Examples((*again)->Next()), std::vector<int>({10, 11, 12, 13}));
  EXPECT_EQ(Examples((*again)->Next()), std::vector<int>({20, 21, 22, 23}));
  EXPECT_EQ((*again)->batches_read(), 3);
}

TEST_F(FollowTest, ABadFirstFileIsSetAsideOrWithFailIsTheError) {
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/a", "0\t1\ta\tb\n1\t2\n").ok());
  WriteFile("b", 5, 3);
  SetAsideCounts counts;
  FollowOptions o = Options();
  o.set_aside = &counts;
  Dataset shape;
  auto s = FollowFiles(o, Batches(3), &shape);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(shape.num_sparse, 2);
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({5, 6, 7}));
  EXPECT_EQ(counts.files.load(), 1);
  o.bad_files = BadExamples::kFail;
  absl::Status failed = FollowFiles(o, Batches(3), &shape).status();
  EXPECT_TRUE(absl::IsDataLoss(failed)) << failed;
  EXPECT_NE(failed.message().find("/a:2: 2 fields"), std::string::npos) << failed;
}

// A producer writing in place: the file is read while its last line is cut short, then again once it is whole.
TEST_F(FollowTest, AFileReadWhileItIsWrittenInPlaceIsReadAgainOnceFinished) {
  WriteFile("a", 0, 2);
  Dataset shape;
  FollowOptions o = Options(absl::Seconds(3));
  o.bad_files = BadExamples::kFail;  // a file that fails only while it is written is no bad file
  auto s = FollowFiles(o, Batches(2), &shape);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({0, 1}));
  {
    std::ofstream f(dir_ + "/b");
    f << "0\t10\ta\tb\n1\t11\ta" << std::flush;  // the second line cut short
  }
  std::thread writer([this] {
    absl::SleepFor(absl::Milliseconds(300));
    std::ofstream f(dir_ + "/b", std::ios::app);
    f << "\tb\n";
  });
  EXPECT_EQ(Examples((*s)->Next()), std::vector<int>({10, 11}));
  writer.join();
  EXPECT_TRUE((*s)->status().ok()) << (*s)->status();
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
