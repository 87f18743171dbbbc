// Chains of deltas: what a task restores (newest, an exact step, from a fresh start), where a chain ends (a gap, a
// corrupt delta), the steps a probe reports, removing deltas, and the DeltaWriter (atomic files, pruning).
#include "ps/checkpoint/delta_chain.h"

#include <string>

#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_test_util.h"
#include "ps/checkpoint/delta_writer.h"

namespace dtrain::ps {
namespace {

using testing::AddTables;
using testing::LogCapture;
using testing::MakeData;
using testing::ScratchDir;

class DeltaChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.model_signature = MakeData(2, 1, false).model_signature;
    config_.optimizer.name = "momentum";
    for (const SliceState& s : MakeData(2, 1, false).slices) config_.slices.push_back(s.spec);
    CheckpointData d = MakeData(2, 1, false);
    AddTables(&d);
    for (const SparseTableState& t : d.tables) config_.tables.push_back(t.spec);
    config_.sparse_optimizer.name = "adagrad";
  }
  // A state of task 1 of 2 at `step` whose table 0 holds ids [0, rows) with values step + id.
  CheckpointData State(int64_t step, int64_t rows) const {
    CheckpointData d = MakeData(2, 1, false, step);
    AddTables(&d, 0);
    d.tables[0].ids.clear();
    for (int64_t id = 0; id < rows; ++id) {
      d.tables[0].ids.push_back(id);
      for (int k = 0; k < 3; ++k) {
        d.tables[0].values.push_back(static_cast<float>(step + id));
        d.tables[0].slots[0].push_back(1.0f);
      }
    }
    d.slices[0].values[0] = static_cast<float>(step);
    return d;
  }
  // A delta from `prev` to `step` that sets ids [from, to) to step + id and removes `removed`.
  DeltaData Delta(int64_t prev, int64_t step, int64_t from, int64_t to, std::vector<int64_t> removed = {}) const {
    DeltaData d;
    d.prev_step = prev;
    d.state = State(step, 0);
    for (int64_t id = from; id < to; ++id) {
      d.state.tables[0].ids.push_back(id);
      for (int k = 0; k < 3; ++k) {
        d.state.tables[0].values.push_back(static_cast<float>(step + id));
        d.state.tables[0].slots[0].push_back(1.0f);
      }
    }
    d.removed = {std::move(removed), {}};
    return d;
  }
  void Write(const DeltaData& d) {
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), DeltaPath(dir_.path(), d.state.global_step, 1, 2),
                                    SerializeDelta(d)).ok());
  }
  void Checkpoint(const CheckpointData& d) {
    testing::WriteCheckpointFile(CheckpointPath(dir_.path(), d.global_step, 1, 2), d);
  }
  absl::StatusOr<std::optional<RestorableCheckpoint>> Find(int64_t restore_step) {
    return FindStateToRestore(Env::Default(), dir_.path(), dir_.path(), config_, 1, 2, restore_step);
  }
  // id -> first value of its row.
  static std::map<int64_t, float> Rows(const CheckpointData& d) {
    std::map<int64_t, float> m;
    for (size_t i = 0; i < d.tables[0].ids.size(); ++i) m[d.tables[0].ids[i]] = d.tables[0].values[3 * i];
    return m;
  }

  ScratchDir dir_{"delta_chain"};
  TrainConfig config_;
};

TEST_F(DeltaChainTest, NewestIsTheCheckpointAndEveryDeltaThatChains) {
  Checkpoint(State(100, 5));
  Write(Delta(90, 110, 3, 7, {0}));  // applies after 90 <= 100
  Write(Delta(110, 120, 6, 8));
  Write(Delta(120, 130, 0, 1, {4}));
  absl::StatusOr<std::optional<RestorableCheckpoint>> r = Find(kRestoreNewest);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->data.global_step, 130);
  EXPECT_EQ((*r)->path, CheckpointPath(dir_.path(), 100, 1, 2) + " + 3 deltas to step 130");
  EXPECT_EQ((*r)->data.slices[0].values[0], 130.0f);
  const std::map<int64_t, float> want = {{0, 130}, {1, 101}, {2, 102}, {3, 113}, {5, 115}, {6, 126}, {7, 127}};
  EXPECT_EQ(Rows((*r)->data), want);
  absl::StatusOr<std::vector<int64_t>> steps = DeltaStepsReachable(Env::Default(), dir_.path(), 1, 2, {100});
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>({110, 120, 130}));
}

TEST_F(DeltaChainTest, AnExactStepComesFromTheCheckpointBeforeItAndTheDeltasUpToIt) {
  Checkpoint(State(100, 5));
  Checkpoint(State(125, 2));  // after the step asked for: not the base
  Write(Delta(100, 110, 0, 1));
  Write(Delta(110, 120, 1, 2));
  Write(Delta(120, 130, 2, 3));
  absl::StatusOr<std::optional<RestorableCheckpoint>> r = Find(120);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->data.global_step, 120);
  EXPECT_EQ(Rows((*r)->data), (std::map<int64_t, float>{{0, 110}, {1, 121}, {2, 102}, {3, 103}, {4, 104}}));
  r = Find(125);  // a checkpoint step: the checkpoint itself
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->path, CheckpointPath(dir_.path(), 125, 1, 2));
  r = Find(115);  // nothing reaches it
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("no chain of deltas"), std::string::npos);
  config_.mode = "async";  // async: the newest instead
  r = Find(115);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->data.global_step, 130);
}

TEST_F(DeltaChainTest, AChainEndsAtAGapOrAtACorruptDelta) {
  Checkpoint(State(100, 1));
  Write(Delta(100, 110, 0, 1));
  Write(Delta(115, 120, 0, 1));  // after 115: the delta of 115 is missing
  LogCapture log;
  absl::StatusOr<std::optional<RestorableCheckpoint>> r = Find(kRestoreNewest);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->data.global_step, 110);
  EXPECT_TRUE(log.Contains("one is missing")) << log.text();
  // A corrupt delta ends the chain before it.
  const std::string path = DeltaPath(dir_.path(), 110, 1, 2);
  std::string bytes = *Env::Default()->ReadFile(path);
  bytes[bytes.size() - 30] ^= 1;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, bytes).ok());
  r = Find(kRestoreNewest);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->data.global_step, 100);
  EXPECT_EQ((*r)->path, CheckpointPath(dir_.path(), 100, 1, 2));
  EXPECT_EQ(*DeltaStepsReachable(Env::Default(), dir_.path(), 1, 2, {100}), std::vector<int64_t>());
}

TEST_F(DeltaChainTest, WithoutACheckpointAFreshStartsDeltasRestore) {
  Write(Delta(-1, 10, 0, 3));
  Write(Delta(10, 20, 2, 4, {0}));
  absl::StatusOr<std::optional<RestorableCheckpoint>> r = Find(kRestoreNewest);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ((*r)->data.global_step, 20);
  EXPECT_EQ((*r)->path, dir_.path() + ": 2 deltas from a fresh start to step 20");
  EXPECT_EQ(Rows((*r)->data), (std::map<int64_t, float>{{1, 11}, {2, 22}, {3, 23}}));
  EXPECT_EQ(*DeltaStepsReachable(Env::Default(), dir_.path(), 1, 2, {}), std::vector<int64_t>({10, 20}));
  // kRestoreNone and no delta directory: as FindCheckpointToRestore.
  EXPECT_FALSE(Find(kRestoreNone)->has_value());
  EXPECT_FALSE(FindStateToRestore(Env::Default(), dir_.path(), "", config_, 1, 2, kRestoreNewest)->has_value());
}

TEST_F(DeltaChainTest, RemovingDeltasBeforeAndAfterAStep) {
  for (int64_t s : {10, 20, 30, 40}) Write(Delta(s - 10, s, 0, 1));
  ASSERT_TRUE(RemoveDeltasAfter(Env::Default(), dir_.path(), 1, 2, 30).ok());
  ASSERT_TRUE(RemoveDeltasUpTo(Env::Default(), dir_.path(), 1, 2, 10).ok());
  std::vector<int64_t> left;
  const std::vector<DeltaFile> files = *ListDeltaFiles(Env::Default(), dir_.path());
  for (const DeltaFile& f : files) left.push_back(f.step);
  EXPECT_EQ(left, std::vector<int64_t>({20, 30}));
}

TEST_F(DeltaChainTest, TheWriterWritesAtomicallyAndPrunesBehindTheSnapshots) {
  DeltaOptions o;
  o.dir = dir_.path() + "/deltas";
  o.every_secs = 1;
  {
    DeltaWriter w(o, Env::Default(), 1, 2);
    EXPECT_TRUE(w.TakeSpare().state.tables.empty());  // nothing written yet: an empty one
    for (int64_t s : {10, 20, 30, 40}) w.Submit(Delta(s - 10, s, 0, 2));
    w.Flush();
    EXPECT_EQ(w.written(), 4);
    // The last delta written comes back empty, its buffers kept for the next.
    DeltaData spare = w.TakeSpare();
    ASSERT_EQ(spare.state.tables.size(), 2u);
    EXPECT_TRUE(spare.state.tables[0].ids.empty());
    EXPECT_GE(spare.state.tables[0].ids.capacity(), 2u);
    EXPECT_TRUE(spare.state.tables[0].values.empty());
    EXPECT_TRUE(spare.state.tables[0].slots[0].empty());
    EXPECT_TRUE(w.TakeSpare().state.tables.empty());  // taken once
    EXPECT_FALSE(w.busy());
    EXPECT_GT(w.bytes_written(), 0);
    w.NoteSnapshot(15);
    w.NoteSnapshot(35);  // the deltas up to 15 go; those after it stay for a chain from 15
    w.Flush();
    absl::SleepFor(absl::Milliseconds(50));  // the pruning runs on the writer's thread
    w.Flush();
  }
  std::vector<int64_t> left;
  const std::vector<DeltaFile> files = *ListDeltaFiles(Env::Default(), o.dir);
  for (const DeltaFile& f : files) left.push_back(f.step);
  EXPECT_EQ(left, std::vector<int64_t>({20, 30, 40}));
  absl::StatusOr<DeltaData> d = ReadDelta(Env::Default(), DeltaPath(o.dir, 40, 1, 2));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->prev_step, 30);
  EXPECT_EQ(ValidateDeltaOptions(DeltaOptions{"", 5, 0}).message(),
            "--delta_every_secs needs --delta_dir (or --checkpoint_dir, its default)");
  EXPECT_FALSE(ValidateDeltaOptions(DeltaOptions{"/x", -1, 0}).ok());
}

}  // namespace
}  // namespace dtrain::ps
