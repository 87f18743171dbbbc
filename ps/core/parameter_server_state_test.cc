// ParameterServer's hand-over of state trained outside it (local mode with GPU towers): ExportState gives the
// restored or initialized state, CheckpointDue follows the save schedule, ImportState replaces the state at a
// step and saves it as a regular checkpoint, the final checkpoint at Done holds the imported state, and a
// restart restores it.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "ps/checkpoint/checkpoint_test_util.h"
#include "ps/core/parameter_server.h"
#include "ps/testing/ps_test_util.h"

namespace dtrain::ps {
namespace {

using ::dtrain::ps::testing::MakeConfig;
using ::dtrain::ps::testing::ScratchDir;
using ::dtrain::ps::testing::SimCluster;
using ::dtrain::ps::testing::SimClusterOptions;
using ::dtrain::ps::testing::SimWorker;

SimClusterOptions Options(const std::string& dir) {
  SimClusterOptions o;
  o.variables = {{"fc/w", 300}, {"fc/b", 6}};
  o.num_ps = 1;
  o.config = MakeConfig("sync", 1, 1, /*learning_rate=*/0.05f);
  o.config.optimizer.name = "adam";
  o.config.moving_average_decay = 0.9f;
  o.initial.resize(306);
  for (size_t i = 0; i < o.initial.size(); ++i) o.initial[i] = 0.01f * static_cast<float>(i % 13);
  o.checkpoint.dir = dir;
  o.checkpoint.save_steps = 5;
  return o;
}

// The state a device trainer would hand back: every float changed.
std::vector<SliceState> Trained(std::vector<SliceState> state, float shift) {
  for (SliceState& s : state) {
    for (float& v : s.values) v += shift;
    for (auto& slot : s.slots) {
      for (float& v : slot) v = shift * 0.5f;
    }
    for (float& v : s.moving_average) v = shift * 2.0f;
  }
  return state;
}

TEST(ParameterServerStateTest, ExportImportSaveAndRestore) {
  ScratchDir dir("ps_state");
  {
    auto cluster = SimCluster::Start(Options(dir.path()));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    ParameterServer& ps = (*cluster)->task(0);
    absl::StatusOr<CheckpointData> start = ps.ExportState();
    ASSERT_TRUE(start.ok()) << start.status();
    EXPECT_EQ(start->global_step, 0);
    EXPECT_EQ(start->num_slots, 2);
    EXPECT_TRUE(start->has_moving_averages);
    ASSERT_EQ(start->slices.size(), 2u);
    std::vector<float> flat(306);
    for (const SliceState& s : start->slices) {
      std::copy(s.values.begin(), s.values.end(), flat.begin() + s.spec.flat_offset);
      EXPECT_EQ(s.moving_average, s.values) << "averages start at the values";
      for (const auto& slot : s.slots) EXPECT_EQ(slot, std::vector<float>(s.values.size(), 0.0f));
    }
    EXPECT_EQ(flat, (*cluster)->initial());

    EXPECT_FALSE(ps.CheckpointDue(3));
    EXPECT_TRUE(ps.CheckpointDue(5));
    const std::vector<SliceState> at5 = Trained(start->slices, 1.0f);
    ASSERT_TRUE(ps.ImportState(5, at5, /*save=*/true).ok());
    EXPECT_EQ(ps.step(), 5);
    EXPECT_FALSE(ps.CheckpointDue(5)) << "just saved";
    EXPECT_TRUE(ps.CheckpointDue(10));
    absl::StatusOr<std::vector<CheckpointData>> saved = ReadCheckpointSet(Env::Default(), CheckpointPrefix(dir.path(), 5));
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_EQ(saved->size(), 1u);
    EXPECT_EQ((*saved)[0].global_step, 5);
    ASSERT_EQ((*saved)[0].slices.size(), 2u);
    EXPECT_EQ((*saved)[0].slices[0].slots, at5[0].slots);
    EXPECT_EQ((*saved)[0].slices[1].moving_average, at5[1].moving_average);

    // Pulls see the imported values at the imported step.
    PullRequest request;
    request.session = (*cluster)->Session(0, 0);
    absl::StatusOr<testing::Pulled> pulled = testing::PullSlices(ps, request);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_EQ(pulled->header.step, 5);
    EXPECT_EQ(pulled->slices.begin()->second, at5[0].values);

    // A state that does not fit is refused and changes nothing.
    std::vector<SliceState> bad = Trained(start->slices, 9.0f);
    bad[1].values.pop_back();
    EXPECT_EQ(ps.ImportState(6, bad, false).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ps.step(), 5);
    EXPECT_EQ(ps.ImportState(-1, at5, false).code(), absl::StatusCode::kInvalidArgument);

    // Training ends at step 7: the final checkpoint at Done holds the imported state.
    ASSERT_TRUE(ps.ImportState(7, Trained(start->slices, 2.0f), /*save=*/false).ok());
    ASSERT_TRUE(SimWorker(cluster->get(), 0).Done().ok());
    EXPECT_TRUE(ps.finished());
  }
  auto restarted = SimCluster::Start(Options(dir.path()));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ((*restarted)->restored_step(), 7);
  absl::StatusOr<CheckpointData> restored = (*restarted)->task(0).ExportState();
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(restored->global_step, 7);
  absl::StatusOr<std::vector<CheckpointData>> at7 = ReadCheckpointSet(Env::Default(), CheckpointPrefix(dir.path(), 7));
  ASSERT_TRUE(at7.ok()) << at7.status();
  for (size_t i = 0; i < restored->slices.size(); ++i) {
    EXPECT_EQ(restored->slices[i].values, (*at7)[0].slices[i].values);
    EXPECT_EQ(restored->slices[i].slots, (*at7)[0].slices[i].slots);
    EXPECT_EQ(restored->slices[i].moving_average, (*at7)[0].slices[i].moving_average);
    EXPECT_EQ(restored->slices[i].slots[0], std::vector<float>(restored->slices[i].values.size(), 1.0f));
  }
}

TEST(ParameterServerStateTest, NothingBeforeRegistrationAndNoScheduleWithoutADirectory) {
  auto ps = ParameterServer::Create(ParameterServerOptions{});
  ASSERT_TRUE(ps.ok());
  EXPECT_EQ((*ps)->ExportState().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ((*ps)->ImportState(1, {}, false).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE((*ps)->CheckpointDue(5));
  SimClusterOptions o = Options("");
  o.checkpoint.save_steps = 0;
  auto cluster = SimCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_FALSE((*cluster)->task(0).CheckpointDue(5));
  absl::StatusOr<CheckpointData> state = (*cluster)->task(0).ExportState();
  ASSERT_TRUE(state.ok());
  EXPECT_TRUE((*cluster)->task(0).ImportState(3, state->slices, /*save=*/true).ok())
      << "no directory: not saved";
  EXPECT_EQ((*cluster)->task(0).step(), 3);
}

}  // namespace
}  // namespace dtrain::ps
