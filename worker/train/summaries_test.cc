#include "worker/train/summaries.h"

#include <stdlib.h>

#include <map>
#include <string>
#include <vector>

#include "common/event_test_decoder.h"
#include "common/file_util.h"
#include "common/testing/scratch_dir.h"
#include "gtest/gtest.h"

namespace dtrain::worker {
namespace {

using testing_decoder::AsDouble;
using testing_decoder::AsFloat;
using testing_decoder::Decode;
using testing_decoder::Message;
using testing_decoder::Only;
using testing_decoder::ReadRecords;

struct Value {
  int64_t step;
  float scalar = 0;
  bool is_histogram = false;
  double min = 0, max = 0, num = 0, sum = 0;
};

// tag → values in file order.
std::multimap<std::string, Value> ReadSummaries(const std::string& path) {
  std::multimap<std::string, Value> out;
  absl::StatusOr<std::string> file = ReadFileToString(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return out;
  std::vector<std::string> records = ReadRecords(*file);
  for (size_t i = 1; i < records.size(); ++i) {
    Message event = Decode(records[i]);
    Message value = Decode(Only(Decode(Only(event, 5).bytes), 1).bytes);
    Value v;
    v.step = static_cast<int64_t>(Only(event, 2).number);
    if (value.count(2)) {
      v.scalar = AsFloat(Only(value, 2).number);
    } else {
      Message h = Decode(Only(value, 5).bytes);
      v.is_histogram = true;
      v.min = AsDouble(Only(h, 1).number);
      v.max = AsDouble(Only(h, 2).number);
      v.num = AsDouble(Only(h, 3).number);
      v.sum = AsDouble(Only(h, 4).number);
    }
    out.emplace(Only(value, 1).bytes, v);
  }
  return out;
}

class SummariesTest : public ::testing::Test {
 protected:
  ::dtrain::testing::ScratchDir scratch_{"summaries_test"};
  const std::string dir_ = scratch_.path();
};

TEST_F(SummariesTest, WritesLearningRateTrafficStalenessAndHistograms) {
  auto writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<models::VariableInfo> vars(2);
  vars[0].name = "layer/weights";
  vars[0].shape = {2, 3};
  vars[1].name = "layer/biases";
  vars[1].shape = {3};
  const std::vector<float> params = {1, 2, 3, 4, 5, 6, -1, 0, 1};
  const std::vector<float> grads = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, -2, -2, -2};
  ps::OptimizerConfig opt;
  opt.name = "sgd";
  opt.learning_rate = 0.1f;
  opt.decay_steps = 10;
  opt.decay_rate = 0.5f;
  opt.staircase = true;

  // Two ps tasks: task 0 has received 3 MB and sent 6 MB by the first summary, 4 MB / 10 MB by the second.
  int call = 0;
  auto stats = [&call](int task) -> absl::StatusOr<ps::TrainingStats> {
    ps::TrainingStats s;
    const int64_t round = call++ / 2;  // two tasks per Write
    s.bytes_received = (task + 1) * (round == 0 ? 3'000'000 : 4'000'000);
    s.bytes_sent = (task + 1) * (round == 0 ? 6'000'000 : 10'000'000);
    if (task == 0) s.staleness_histogram = {2, 5, 0, 1};
    return s;
  };
  const absl::Time start = absl::FromUnixSeconds(1000);
  auto summaries = TrainingSummaries::Create(writer->get(), vars, opt, 2, stats, start);
  ASSERT_TRUE(summaries.ok()) << summaries.status();
  ASSERT_TRUE((*summaries)->Write(10, params.data(), grads.data(), start + absl::Seconds(2)).ok());
  ASSERT_TRUE((*summaries)->Write(20, params.data(), grads.data(), start + absl::Seconds(4)).ok());
  const std::string path = (*writer)->path();
  writer->reset();

  std::multimap<std::string, Value> got = ReadSummaries(path);
  auto values = [&got](const std::string& tag) {
    std::vector<Value> v;
    for (auto [it, end] = got.equal_range(tag); it != end; ++it) v.push_back(it->second);
    return v;
  };
  ASSERT_EQ(values("learning_rate").size(), 2u);
  EXPECT_FLOAT_EQ(values("learning_rate")[0].scalar, 0.05f);  // 0.1 * 0.5^1 at step 10
  EXPECT_FLOAT_EQ(values("learning_rate")[1].scalar, 0.025f);  // 0.1 * 0.5^2 at step 20
  EXPECT_EQ(values("learning_rate")[1].step, 20);
  // Rates: bytes since the previous summary (or since start) over the seconds between them.
  EXPECT_FLOAT_EQ(values("ps/task_0/received_bytes_per_sec")[0].scalar, 1.5e6f);
  EXPECT_FLOAT_EQ(values("ps/task_0/received_bytes_per_sec")[1].scalar, 0.5e6f);
  EXPECT_FLOAT_EQ(values("ps/task_0/sent_bytes_per_sec")[1].scalar, 2e6f);
  EXPECT_FLOAT_EQ(values("ps/task_1/sent_bytes_per_sec")[0].scalar, 6e6f);
  // Staleness: 2 pushes at 0, 5 at 1, 1 at 3.
  ASSERT_EQ(values("staleness").size(), 2u);
  EXPECT_EQ(values("staleness")[0].num, 8);
  EXPECT_EQ(values("staleness")[0].sum, 8);
  EXPECT_EQ(values("staleness")[0].max, 3);
  // Histograms of each variable's own slice of the flat buffers.
  ASSERT_EQ(values("weights/layer/weights").size(), 2u);
  EXPECT_EQ(values("weights/layer/weights")[0].num, 6);
  EXPECT_EQ(values("weights/layer/weights")[0].sum, 21);
  EXPECT_EQ(values("weights/layer/biases")[0].min, -1);
  EXPECT_EQ(values("weights/layer/biases")[0].max, 1);
  EXPECT_EQ(values("gradients/layer/weights")[0].sum, 3);
  EXPECT_EQ(values("gradients/layer/biases")[0].sum, -6);
}

// Sparse tables: rows held summed over the tasks, rows created and evicted per second (a task that restarted
// counts from zero again), and the worker's unique ids per step.
TEST_F(SummariesTest, WritesEachTablesRowsAndTheUniqueIdsPerStep) {
  auto writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<models::VariableInfo> vars(1);
  vars[0].name = "w";
  vars[0].shape = {1};
  const std::vector<float> params = {1};
  int call = 0;
  auto stats = [&call](int task) -> absl::StatusOr<ps::TrainingStats> {
    const int64_t round = call++ / 2;
    ps::TrainingStats s;
    ps::SparseTableStats a, b;
    a.name = "emb/a";
    b.name = "emb/b";
    // Task 0: a created 100 then 300 rows (2 evicted then 6); task 1 restarts before the second round.
    a.rows = task == 0 ? (round == 0 ? 100 : 296) : (round == 0 ? 50 : 20);
    a.created = task == 0 ? (round == 0 ? 100 : 300) : (round == 0 ? 50 : 20);
    a.evicted = task == 0 ? (round == 0 ? 2 : 6) : 0;
    a.expired = task == 0 ? (round == 0 ? 4 : 10) : 0;
    a.not_admitted = task == 1 ? (round == 0 ? 8 : 12) : 0;
    b.rows = b.created = 10 * (task + 1);
    s.tables = {a, b};
    return s;
  };
  int64_t unique = 0;
  const absl::Time start = absl::FromUnixSeconds(1000);
  auto summaries = TrainingSummaries::Create(writer->get(), vars, ps::OptimizerConfig(), 2, stats, start,
                                             [&unique] { return unique; });
  ASSERT_TRUE(summaries.ok()) << summaries.status();
  unique = 700;
  ASSERT_TRUE((*summaries)->Write(10, params.data(), nullptr, start + absl::Seconds(2)).ok());
  unique = 650;
  ASSERT_TRUE((*summaries)->Write(20, params.data(), nullptr, start + absl::Seconds(4)).ok());
  const std::string path = (*writer)->path();
  writer->reset();

  std::multimap<std::string, Value> got = ReadSummaries(path);
  auto scalars = [&got](const std::string& tag) {
    std::vector<float> v;
    for (auto [it, end] = got.equal_range(tag); it != end; ++it) v.push_back(it->second.scalar);
    return v;
  };
  EXPECT_EQ(scalars("sparse/emb/a/rows"), (std::vector<float>{150, 316}));
  EXPECT_EQ(scalars("sparse/emb/b/rows"), (std::vector<float>{30, 30}));
  // (100 + 50) / 2 s, then (200 + 20 since task 1's restart) / 2 s.
  EXPECT_EQ(scalars("sparse/emb/a/rows_created_per_sec"), (std::vector<float>{75, 110}));
  EXPECT_EQ(scalars("sparse/emb/a/rows_evicted_per_sec"), (std::vector<float>{1, 2}));
  EXPECT_EQ(scalars("sparse/emb/a/rows_expired_per_sec"), (std::vector<float>{2, 3}));
  EXPECT_EQ(scalars("sparse/emb/a/lookups_not_admitted_per_sec"), (std::vector<float>{4, 2}));
  EXPECT_EQ(scalars("sparse/emb/b/rows_created_per_sec"), (std::vector<float>{15, 0}));
  EXPECT_EQ(scalars("sparse/unique_ids_per_step"), (std::vector<float>{700, 650}));
}

TEST_F(SummariesTest, SyncHasNoStalenessAndErrorsPropagate) {
  auto writer = EventWriter::Create(dir_);
  ASSERT_TRUE(writer.ok());
  std::vector<models::VariableInfo> vars(1);
  vars[0].name = "w";
  vars[0].shape = {1};
  const float one = 1;
  bool fail = false;
  auto stats = [&fail](int) -> absl::StatusOr<ps::TrainingStats> {
    if (fail) return absl::UnavailableError("ps task 0 is gone");
    return ps::TrainingStats();
  };
  auto summaries = TrainingSummaries::Create(writer->get(), vars, ps::OptimizerConfig(), 1, stats, absl::Now());
  ASSERT_TRUE(summaries.ok());
  ASSERT_TRUE((*summaries)->Write(1, &one, &one).ok());
  fail = true;
  EXPECT_EQ((*summaries)->Write(2, &one, &one).code(), absl::StatusCode::kUnavailable);
  const std::string path = (*writer)->path();
  writer->reset();
  std::multimap<std::string, Value> got = ReadSummaries(path);
  EXPECT_EQ(got.count("staleness"), 0u);
  EXPECT_EQ(got.count("learning_rate"), 2u);

  ps::OptimizerConfig bad;
  bad.name = "adadelta";
  auto w2 = EventWriter::Create(dir_);
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ(TrainingSummaries::Create(w2->get(), vars, bad, 1, stats, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TrainingSummaries::Create(nullptr, vars, ps::OptimizerConfig(), 1, stats, absl::Now()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::worker
