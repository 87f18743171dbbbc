// DeltaFollower: a snapshot of two tasks and the deltas after it, advanced as deltas arrive (to the newest step
// both tasks reach), stopped at --until_step, started from a fresh start's deltas, and moved to a newer snapshot.
#include "ps/checkpoint/delta_follower.h"

#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_test_util.h"
#include "ps/checkpoint/delta_format.h"

namespace dtrain::ps {
namespace {

using testing::AddTables;
using testing::MakeData;
using testing::ScratchDir;

class DeltaFollowerTest : public ::testing::Test {
 protected:
  // Task t's state at `step`, its first slice value = step.
  CheckpointData State(int t, int64_t step) {
    CheckpointData d = MakeData(2, 1, false, step);
    d.task_index = t;
    AddTables(&d, 0);
    d.slices[0].values[0] = static_cast<float>(step);
    return d;
  }
  void Snapshot(int64_t step) {
    for (int t = 0; t < 2; ++t) testing::WriteCheckpointFile(CheckpointPath(dir_.path(), step, t, 2), State(t, step));
  }
  void Delta(int t, int64_t prev, int64_t step, int64_t id) {
    DeltaData d;
    d.prev_step = prev;
    d.state = State(t, step);
    d.state.tables[0].ids = {id};
    d.state.tables[0].values = {1, 2, 3};
    d.state.tables[0].slots[0] = {4, 5, 6};
    d.removed = {{}, {}};
    ASSERT_TRUE(WriteFileAtomically(Env::Default(), DeltaPath(dir_.path(), step, t, 2), SerializeDelta(d)).ok());
  }
  DeltaFollowerOptions Options(int64_t until = -1) {
    DeltaFollowerOptions o;
    o.checkpoint_dir = dir_.path();
    o.until_step = until;
    return o;
  }

  ScratchDir dir_{"delta_follower"};
};

TEST_F(DeltaFollowerTest, FollowsBothTasksToTheNewestStepTheyReach) {
  Snapshot(100);
  for (int t = 0; t < 2; ++t) {
    Delta(t, 100, 110, 1);
    Delta(t, 110, 120, 2);
  }
  absl::StatusOr<std::unique_ptr<DeltaFollower>> f = DeltaFollower::Open(Options());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->step(), 120);
  EXPECT_EQ((*f)->description(), "model.ckpt-100 + 4 deltas");
  ASSERT_EQ((*f)->parts().size(), 2u);
  EXPECT_EQ((*f)->parts()[1].slices[0].values[0], 120.0f);
  EXPECT_EQ((*f)->parts()[1].tables[0].ids, std::vector<int64_t>({1, 2}));
  EXPECT_FALSE(*(*f)->Advance());
  Delta(0, 120, 130, 3);  // only task 0 so far: the copy waits for task 1
  EXPECT_FALSE(*(*f)->Advance());
  EXPECT_EQ((*f)->step(), 120);
  Delta(1, 120, 130, 3);
  EXPECT_TRUE(*(*f)->Advance());
  EXPECT_EQ((*f)->step(), 130);
  EXPECT_EQ((*f)->parts()[0].slices[0].values[0], 130.0f);
  // The end of training writes a snapshot: the copy moves to it.
  Snapshot(140);
  EXPECT_TRUE(*(*f)->Advance());
  EXPECT_EQ((*f)->step(), 140);
  EXPECT_EQ((*f)->description(), "model.ckpt-140");
}

TEST_F(DeltaFollowerTest, UntilStepStopsThereAndAFreshStartNeedsNoSnapshot) {
  for (int t = 0; t < 2; ++t) {
    Delta(t, -1, 10, 1);
    Delta(t, 10, 20, 2);
    Delta(t, 20, 30, 3);
  }
  absl::StatusOr<std::unique_ptr<DeltaFollower>> f = DeltaFollower::Open(Options(20));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->step(), 20);
  EXPECT_EQ((*f)->description(), "4 deltas from a fresh start");
  EXPECT_FALSE(*(*f)->Advance());
  f = DeltaFollower::Open(Options());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->step(), 30);
  EXPECT_EQ((*f)->parts()[0].tables[0].ids, std::vector<int64_t>({1, 2, 3}));
  ScratchDir empty("delta_follower_empty");
  DeltaFollowerOptions o;
  o.checkpoint_dir = empty.path();
  EXPECT_TRUE(absl::IsNotFound(DeltaFollower::Open(o).status()));
}

}  // namespace
}  // namespace dtrain::ps
