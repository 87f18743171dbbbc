// Online training through the whole loop (local mode, dlrm): the input follows a directory of arriving parts
// (worker/data/batch_stream_follow.h) until no new part comes, the chief scores each batch before training on it
// (progressive validation, reported every eval_every steps or with each progress line), the in-process ps writes
// deltas by step and a final checkpoint; a run stopped half-way resumes from its checkpoint at the input position
// it held and ends exactly as an uninterrupted run; the tables' online settings (expiry, admission, 16-bit rows)
// reach the ps; a bad part is set aside (--bad_records=skip) or
// ends the run with its error after the in-process ps saved the final checkpoint (fail).
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/env.h"
#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "ps/checkpoint/delta_format.h"
#include "worker/data/synthetic_ctr.h"
#include "worker/train/trainer.h"

namespace dtrain::worker {
namespace {

class OnlineTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/online." + std::to_string(::getpid()) + "." +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    data::SyntheticCtrOptions s;
    s.examples = 3000;
    s.test_examples = 300;
    s.num_dense = 4;
    s.num_sparse = 5;
    s.vocab = {50};
    s.stream_parts = 3;
    s.drift = 0.5;
    absl::StatusOr<data::SyntheticCtrReport> r = data::WriteSyntheticCtr(s, root_ + "/data");
    ASSERT_TRUE(r.ok()) << r.status();
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  WorkerOptions Options(const std::string& ckpt) {
    WorkerOptions o;
    o.model = "dlrm";
    o.dlrm.embedding_dim = 4;
    o.dlrm.bottom = {8};
    o.dlrm.top = {8};
    o.data_dir = root_ + "/data/stream";
    o.follow = true;
    o.follow_poll_secs = 0.02;
    o.follow_idle_secs = 0.3;
    o.train_steps = 0;
    o.batch_size = 100;
    o.shuffle = false;
    o.optimizer = "sgd";
    o.learning_rate = 0.1f;
    o.sparse_optimizer = "adagrad";
    o.sparse_learning_rate = 0.1f;
    o.quiet = true;
    o.eval_every = 5;
    o.eval_window = 1000;
    o.checkpoint.dir = ckpt;
    o.delta.dir = ckpt;
    o.delta.every_steps = 10;
    o.startup_wait_secs = 30;
    return o;
  }
  // Table -> id -> row of the newest checkpoint in `dir`.
  static std::map<std::string, std::map<int64_t, std::vector<float>>> Rows(const std::string& dir) {
    std::map<std::string, std::map<int64_t, std::vector<float>>> out;
    absl::StatusOr<std::vector<ps::CheckpointData>> parts = ps::ReadCheckpointSet(Env::Default(), dir);
    EXPECT_TRUE(parts.ok()) << parts.status();
    if (!parts.ok()) return out;
    absl::StatusOr<std::vector<ps::SparseTableRows>> tables = ps::ReadSparseTables(*parts);
    EXPECT_TRUE(tables.ok()) << tables.status();
    for (const ps::SparseTableRows& t : *tables) {
      for (size_t i = 0; i < t.ids.size(); ++i) {
        out[t.spec.name][t.ids[i]].assign(t.values.begin() + i * t.spec.dim, t.values.begin() + (i + 1) * t.spec.dim);
      }
    }
    return out;
  }

  std::string root_;
};

TEST_F(OnlineTrainingTest, FollowsThePartsToTheEndWithProgressiveValidationAndDeltas) {
  const std::string ckpt = root_ + "/ckpt";
  absl::StatusOr<TrainingResult> r = RunTraining(Options(ckpt), {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->input_ended);
  // 3000 examples in batches of 100, read one batch ahead: the last batch is drawn but not trained on.
  EXPECT_EQ(r->global_step, 29);
  EXPECT_EQ(r->window_examples, 1000);
  EXPECT_GT(r->window_auc, 0.0);
  EXPECT_LT(r->window_auc, 1.0);
  EXPECT_GT(r->window_log_loss, 0.0);
  EXPECT_LT(r->test_auc, 0.0);  // no test set in an online run
  std::vector<int64_t> deltas;
  const std::vector<ps::DeltaFile> files = *ps::ListDeltaFiles(Env::Default(), ckpt);
  for (const ps::DeltaFile& f : files) deltas.push_back(f.step);
  // Every 10 steps, and a last one of the final state when training ends (serving sees where training stopped).
  EXPECT_EQ(deltas, std::vector<int64_t>({10, 20, 29}));
  EXPECT_TRUE(Env::Default()->FileExists(ckpt + "/model.ckpt-29.ps0-of-1"));
}

// A stream has no end to wait for: without --eval_every the chief reports the progressive validation with each of
// its progress lines (every 10 local steps here: steps 10 and 20 of 29), then once more at the end.
TEST_F(OnlineTrainingTest, WithoutEvalEveryTheWindowComesWithEachProgressLine) {
  WorkerOptions o = Options(root_ + "/lines");
  o.eval_every = 0;
  o.log_every = 10;
  o.quiet = false;
  ::testing::internal::CaptureStdout();
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->global_step, 29);
  for (int step : {10, 20}) {
    const std::string progress = absl::StrCat("step ", step, ", loss = ");
    const std::string window =
        absl::StrCat("step ", step, ": newest 1000 examples (scored before training on them): log loss = ");
    ASSERT_NE(out.find(progress), std::string::npos) << out;
    EXPECT_GT(out.find(window), out.find(progress)) << out;
  }
  EXPECT_NE(out.find("step 29: newest 1000 examples (scored before training on them)"), std::string::npos) << out;
}

TEST_F(OnlineTrainingTest, AStoppedRunResumesAtItsInputPositionAndEndsAsAnUninterruptedOne) {
  const absl::StatusOr<TrainingResult> straight = RunTraining(Options(root_ + "/straight"), {});
  ASSERT_TRUE(straight.ok()) << straight.status();
  std::atomic<int> polls{0};
  WorkerOptions o = Options(root_ + "/resumed");
  o.input_stop = [&polls] { return ++polls > 12; };  // polled before each step: 12 steps, then the input "stops"
  absl::StatusOr<TrainingResult> first = RunTraining(o, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->input_ended);
  EXPECT_EQ(first->global_step, 12);
  o.input_stop = nullptr;
  absl::StatusOr<TrainingResult> second = RunTraining(o, {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->first_step, 12);
  EXPECT_EQ(second->global_step, straight->global_step);
  EXPECT_EQ(Rows(root_ + "/resumed"), Rows(root_ + "/straight"));
}

// A part written in place by a producer with a bad line halfway (and older than a second: finished).
TEST_F(OnlineTrainingTest, ABadPartIsSetAsideOrWithFailEndsTheRunAfterAFinalCheckpoint) {
  const std::string bad = root_ + "/data/stream/part-00000b.txt";
  {
    std::ifstream in(root_ + "/data/stream/part-00001.txt");
    std::ofstream out(bad);
    std::string line;
    for (int i = 0; i < 300 && std::getline(in, line); ++i) out << (i == 150 ? "1\t2\t3" : line) << "\n";
  }
  std::filesystem::last_write_time(bad, std::filesystem::last_write_time(bad) - std::chrono::seconds(10));
  WorkerOptions o = Options(root_ + "/skip");
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->global_step, 29);  // the three good parts, as without the bad one
  EXPECT_EQ(r->input_files_set_aside, 1);
  EXPECT_EQ(r->input_lines_set_aside, 300);
  o = Options(root_ + "/fail");
  o.bad_records = data::BadExamples::kFail;
  r = RunTraining(o, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("part-00000b.txt:151: 3 fields"), std::string::npos) << r.status();
  // The first part's 10 batches, read one ahead: 9 steps trained, and on disk.
  EXPECT_NE(r.status().message().find("the final checkpoint of step 9 was saved"), std::string::npos) << r.status();
  EXPECT_TRUE(Env::Default()->FileExists(root_ + "/fail/model.ckpt-9.ps0-of-1"));
  EXPECT_EQ(HowTrainingFailed(r.status()), ps::Leaving::kFailed);
}

TEST_F(OnlineTrainingTest, TheTablesOnlineSettingsReachThePs) {
  WorkerOptions o = Options(root_ + "/settings");
  o.row_ttl_steps = 3;
  o.admit_probability = 0.5f;
  o.row_dtype = "bf16";
  o.eval_window = 0;
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t expired = 0, not_admitted = 0;
  for (const ps::SparseTableStats& t : r->stats.tables) {
    expired += t.expired;
    not_admitted += t.not_admitted;
  }
  EXPECT_GT(expired, 0);
  EXPECT_GT(not_admitted, 0);
  EXPECT_EQ(r->window_examples, 0);
  o.row_dtype = "fp12";
  EXPECT_EQ(RunTraining(o, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::worker
