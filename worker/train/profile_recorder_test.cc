#include "worker/train/profile_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"

namespace dtrain::worker {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

void Pass(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

ProfiledRun TwoLayers() {
  ProfiledRun run;
  run.model = "test";
  run.batch_size = 10;
  run.threads = 1;
  run.mode = "local";
  run.optimizer.name = "sgd";
  run.optimizer.learning_rate = 0.1f;
  // Layer l0: floats [0, 1010); layer l1: [1010, 1510).
  run.variables = {{"l0/w", 1000, true}, {"l0/b", 10, true}, {"l1/w", 500, true}};
  return run;
}

TEST(ProfileRecorderTest, Quantile) {
  EXPECT_DOUBLE_EQ(ProfileRecorder::Quantile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(ProfileRecorder::Quantile({4, 1, 3, 2}, 0), 1);
  EXPECT_DOUBLE_EQ(ProfileRecorder::Quantile({4, 1, 3, 2}, 1), 4);
  EXPECT_NEAR(ProfileRecorder::Quantile({4, 1, 3, 2}, 0.9), 3.7, 1e-12);
  EXPECT_DOUBLE_EQ(ProfileRecorder::Quantile({}, 0.5), 0);
}

TEST(ProfileRecorderTest, NothingMeasuredIsAnError) {
  ProfileRecorder profile;
  EXPECT_EQ(profile.ToJson().status().code(), absl::StatusCode::kFailedPrecondition);  // no run
  profile.SetRun(TwoLayers());
  absl::StatusOr<std::string> text = profile.ToJson();
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(text.status().message().find("--train_steps"), std::string::npos) << text.status();
}

// Steps whose layers take known times: forward 3 ms (l0) and 1 ms (l1), backward 2 ms (l1) and 4 ms (l0), the
// transport's calls inside the hooks 2 ms each (not compute), the in-process update 1 ms.
TEST(ProfileRecorderTest, LayersComputeAndStepsFromTheHooks) {
  ProfileRecorder::Options options;
  options.warmup_steps = 1;
  ProfileRecorder profile(options);
  ProfiledRun run = TwoLayers();
  run.tables = {{"emb", 4, 0}};
  profile.SetRun(run);
  models::StepHooks inner;
  inner.before_forward = [](int64_t, int64_t) {
    Pass(0.002);
    return absl::OkStatus();
  };
  inner.gradients_ready = [](int64_t, int64_t) {
    Pass(0.002);
    return absl::OkStatus();
  };
  int forward_calls = 0;
  inner.after_forward = [&forward_calls](float) {
    ++forward_calls;
    return absl::OkStatus();
  };
  std::vector<double> walls;
  constexpr int kSteps = 5;
  for (int step = 0; step < kSteps; ++step) {
    profile.AddInputWait(0.0005);
    profile.StepBegin();
    models::StepHooks h = profile.TimeHooks(inner);
    profile.ComputeBegin();
    const Clock::time_point t0 = Clock::now();
    ASSERT_TRUE(h.before_forward(0, 1010).ok());
    Pass(0.003);
    ASSERT_TRUE(h.before_forward(1010, 1510).ok());
    Pass(0.001);
    ASSERT_TRUE(h.after_forward(0.5f).ok());
    Pass(0.002);
    ASSERT_TRUE(h.gradients_ready(1010, 1510).ok());
    Pass(0.004);
    ASSERT_TRUE(h.gradients_ready(0, 1010).ok());
    walls.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    profile.ComputeEnd();
    profile.AddSparseRows(0, 7);
    ps::ParameterServerOptions::TimedUpdate update;
    update.floats = 1510;
    update.gradients = 1;
    update.dense_seconds = 0.001;
    profile.AddUpdate(update);
    profile.StepEnd();
  }
  EXPECT_EQ(forward_calls, kSteps);  // the inner hooks stay in force
  profile.MarkTrainEnd();
  profile.MarkEnd();
  ASSERT_TRUE(profile.MeasurePsCosts().ok());
  absl::StatusOr<std::string> text = profile.ToJson();
  ASSERT_TRUE(text.ok()) << text.status();
  const json j = json::parse(*text);
  EXPECT_EQ(j["format"], "dtrain-profile");
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["steps"]["measured"], kSteps - 1);     // the warm-up step left out
  EXPECT_EQ(j["steps"]["step_s"]["n"], kSteps - 2);  // a cycle is known once the next step begins
  ASSERT_EQ(j["layers"].size(), 2u);
  const json& l0 = j["layers"][0];
  const json& l1 = j["layers"][1];
  EXPECT_EQ(l0["name"], "l0");
  EXPECT_EQ(l1["name"], "l1");
  EXPECT_EQ(l0["begin"], 0);
  EXPECT_EQ(l1["end"], 1510);
  // Sleeps last at least what they ask; the hooks' 2 ms are not the layers'.
  EXPECT_GE(l0["forward_s"].get<double>(), 0.003);
  EXPECT_GE(l1["forward_s"].get<double>(), 0.001);
  EXPECT_GE(l1["backward_s"].get<double>(), 0.002);
  EXPECT_GE(l0["backward_s"].get<double>(), 0.004);
  // Compute: the wall time of the step's compute less the 4 hook calls (8 ms).
  const double compute = j["steps"]["compute_s"]["median"];
  EXPECT_GE(compute, 0.010);
  EXPECT_LE(compute, ProfileRecorder::Quantile(walls, 1.0) - 0.008 + 1e-3);
  EXPECT_EQ(j["steps"]["compute_s"]["quantiles"].size(), 101u);
  EXPECT_GE(j["steps"]["process_cpu_s"].get<double>(), 0);  // the steps sleep: little CPU, but counted
  EXPECT_NEAR(j["steps"]["input_s"]["median"].get<double>(), 0.0005, 1e-12);
  EXPECT_NEAR(j["steps"]["update_s"]["median"].get<double>(), 0.001, 1e-12);
  EXPECT_NEAR(j["ps"]["in_run_update_s"]["median"].get<double>(), 0.001, 1e-12);
  EXPECT_GT(j["ps"]["apply_s_per_byte"].get<double>(), 0);
  EXPECT_GE(j["ps"]["sum_s_per_byte"].get<double>(), 0);
  EXPECT_EQ(j["sparse"]["tables"][0]["rows_per_step"], 7);
  EXPECT_EQ(j["sparse"]["tables"][0]["bytes_per_row"], 16);
  // Placements for every count of tasks from 1 to 16, by the placement code, each holding the whole model.
  EXPECT_EQ(j["placement"].size(), 16u);
  for (int n = 1; n <= 16; ++n) {
    const std::string p = std::to_string(n);
    int64_t bytes = 0;
    for (const json& b : j["placement"][p]["task_bytes"]) bytes += b.get<int64_t>();
    EXPECT_EQ(bytes, 1510 * 4) << p;
    EXPECT_EQ(j["placement"][p]["task_bytes"].size(), static_cast<size_t>(std::stoi(p)));
  }
  EXPECT_GE(j["phases"]["train_s"].get<double>(), 0);
  EXPECT_GE(j["phases"]["total_s"].get<double>(), j["phases"]["train_s"].get<double>());
  EXPECT_GT(j["host"]["cpus_available"].get<double>(), 0);
  EXPECT_EQ(j["run"]["compute_cores"], 1.0);
}

TEST(ProfileRecorderTest, TransportsAndWrite) {
  ProfileRecorder::Options options;
  options.warmup_steps = 0;
  ProfileRecorder profile(options);
  profile.SetRun(TwoLayers());
  for (int step = 0; step < 3; ++step) {
    profile.StepBegin();
    models::StepHooks h = profile.TimeHooks({});
    profile.ComputeBegin();
    ASSERT_TRUE(h.before_forward(0, 1510).ok());
    ASSERT_TRUE(h.after_forward(1.0f).ok());
    ASSERT_TRUE(h.gradients_ready(0, 1510).ok());
    profile.ComputeEnd();
    profile.StepEnd();
  }
  TransportCost grpc;
  grpc.transport = "grpc";
  grpc.bytes = 6040;
  grpc.push_worker_cpu_per_byte = 1e-9;
  grpc.cluster_start_seconds = 0.5;
  TransportCost shm;
  shm.transport = "shm";
  shm.skipped = "no shared memory";
  profile.SetTransportCosts({grpc, shm});
  char dir[] = "/tmp/profile_recorder_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/p.json";
  ASSERT_TRUE(profile.Write(path).ok());
  std::ifstream in(path);
  const json j = json::parse(in);
  std::remove(path.c_str());
  rmdir(dir);
  EXPECT_EQ(j["transports"]["grpc"]["push_worker_cpu_s_per_byte"], 1e-9);
  EXPECT_EQ(j["transports"]["grpc"]["cluster_start_s"], 0.5);
  EXPECT_EQ(j["transports"]["shm"]["skipped"], "no shared memory");
  EXPECT_FALSE(j["transports"]["shm"].contains("push_worker_cpu_s_per_byte"));
  EXPECT_FALSE(j["ps"].contains("apply_s_per_byte"));  // MeasurePsCosts not run
}

TEST(ProfileRecorderTest, TimeUpdateChecksItsArguments) {
  ProfiledRun run = TwoLayers();
  EXPECT_EQ(TimeUpdate(run.variables, run.optimizer, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TimeUpdate(run.variables, run.optimizer, 5).status().code(), absl::StatusCode::kInvalidArgument);
  ps::OptimizerConfig bad;
  bad.name = "no_such_optimizer";
  EXPECT_EQ(TimeUpdate(run.variables, bad, 1).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<double> secs = TimeUpdate(run.variables, run.optimizer, 2);
  ASSERT_TRUE(secs.ok()) << secs.status();
  EXPECT_GT(*secs, 0);
}

}  // namespace
}  // namespace dtrain::worker
