// GPU towers end to end, against the CPU towers as the oracle: local training with the state on the device
// (eager and as a replayed CUDA graph, one tower and two sharing gpu:0), checkpoints written on the GPU
// resuming on either path, the previous host path (--device_resident=false), and a cluster worker whose GPU
// tower uploads parameters and downloads gradients layer by layer. Every test skips without a usable CUDA
// device (the binary then exits 77: ctest reports it Skipped).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/testing/relative_difference.h"
#include "kernels/device.h"
#include "ps/core/parameter_server.h"
#include "ps/client/placement.h"
#include "ps/client/worker_client.h"
#include "worker/models/registry.h"
#include "worker/train/resident_steps.h"
#include "worker/data/synthetic_data.h"
#include "worker/train/trainer.h"
#include "worker/train/make_training_steps.h"

namespace dtrain::worker {
namespace {

// The tests name their models; Towers take the resolved value.
models::ModelRef ResolvedModel(const std::string& name) {
  absl::StatusOr<models::ModelRef> spec = models::ResolveModel(name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : nullptr;
}

bool HaveGpu() { return kernels::CudaDeviceCount() > 0; }

WorkerOptions CnnOptions(const data::DatasetPair* data, const std::string& towers) {
  WorkerOptions o;
  o.model = "cnn";
  o.dataset = data;
  o.shuffle = true;
  o.optimizer = "adam";
  o.learning_rate = 1e-3f;
  o.decay_steps = 10;
  o.decay_rate = 0.8f;
  o.moving_average_decay = 0.99f;
  o.batch_size = 16;
  o.towers = towers;
  o.threads = 2;
  o.train_steps = 30;
  o.log_every = 7;
  o.eval_every = 20;
  o.quiet = true;
  o.startup_wait_secs = 30;
  return o;
}

using ::dtrain::testing::RelativeDifference;

// GPU and CPU compute in fp32 with different summation orders: the runs agree to fp32 accumulation, not
// bit for bit.
void ExpectClose(const TrainingResult& gpu, const TrainingResult& cpu, double loss_rel, double params_rel) {
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], loss_rel * std::abs(cpu.losses[i]) + 1e-4) << "step " << i;
  }
  ASSERT_EQ(gpu.parameters.size(), cpu.parameters.size());
  EXPECT_LE(RelativeDifference(gpu.parameters, cpu.parameters), params_rel);
  EXPECT_NEAR(gpu.test_accuracy, cpu.test_accuracy, 0.02);
  EXPECT_NEAR(gpu.test_accuracy_averaged, cpu.test_accuracy_averaged, 0.02);
}

// Local mode on gpu:0 with the state on the device, eager and with the step as a replayed CUDA graph, trains
// like the CPU's local mode; the graph replays exactly what the eager steps compute.
TEST(GpuTrainingTest, DeviceResidentLocalModeMatchesCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable CUDA device";
  const data::DatasetPair data = MakeSyntheticDataset(800, 300);
  absl::StatusOr<TrainingResult> cpu = RunTraining(CnnOptions(&data, ""), {});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  WorkerOptions eager = CnnOptions(&data, "gpu:0");
  eager.cuda_graphs = false;
  absl::StatusOr<TrainingResult> gpu_eager = RunTraining(eager, {});
  ASSERT_TRUE(gpu_eager.ok()) << gpu_eager.status();
  absl::StatusOr<TrainingResult> gpu_graph = RunTraining(CnnOptions(&data, "gpu:0"), {});
  ASSERT_TRUE(gpu_graph.ok()) << gpu_graph.status();
  EXPECT_EQ(gpu_graph->global_step, 30);
  ExpectClose(*gpu_eager, *cpu, 1e-2, 1e-2);
  ExpectClose(*gpu_graph, *cpu, 1e-2, 1e-2);
  // Separate runs may pick different cuDNN algorithms (cudnnFind times them), so even these differ in the
  // last bits; a replay that missed the counters (repeated dropout masks, a stuck Adam step) would differ by
  // far more.
  ExpectClose(*gpu_graph, *gpu_eager, 1e-3, 1e-3);
  EXPECT_LT(gpu_graph->losses.back(), gpu_graph->losses.front());
}

// Two towers sharing gpu:0: gradients averaged per layer while backward runs, every tower applying the update
// to its own state, one graph over both towers' streams.
TEST(GpuTrainingTest, TwoTowersDeviceResidentMatchCpuTowers) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable CUDA device";
  const data::DatasetPair data = MakeSyntheticDataset(800, 300);
  absl::StatusOr<TrainingResult> cpu = RunTraining(CnnOptions(&data, "2"), {});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  for (bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "graph" : "eager");
    WorkerOptions o = CnnOptions(&data, "gpu:0,gpu:0");
    o.cuda_graphs = graphs;
    absl::StatusOr<TrainingResult> gpu = RunTraining(o, {});
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ExpectClose(*gpu, *cpu, 1e-2, 1e-2);
  }
}

// The step really is replayed as a graph (one tower and two), and steps keep their losses in order.
TEST(GpuTrainingTest, ResidentStepsCaptureTheStep) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable CUDA device";
  const data::DatasetPair data = MakeSyntheticDataset(64, 10);
  for (int n_towers : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << n_towers << " towers");
    models::ModelOptions mo;
    mo.batch_size = 16;
    TowersOptions topt;
    topt.replicated = true;
    auto towers = Towers::Create(*ResolvedModel("cnn"), mo, std::vector<kernels::DeviceSpec>(n_towers, kernels::DeviceSpec::Gpu(0)), topt);
    ASSERT_TRUE(towers.ok()) << towers.status();
    std::vector<ps::VariableInfo> vars;
    for (const auto& v : (*towers)->tower(0)->variables()) vars.push_back({v.name, v.size()});
    auto placement = ps::PlaceVariables(vars, 1);
    auto server = ps::ParameterServer::Create(ps::ParameterServerOptions{});
    ASSERT_TRUE(placement.ok() && server.ok());
    ps::WorkerClientOptions copt;
    copt.background = false;
    ps::WorkerClient client({server->get()}, placement->task_slices, 0, true, copt);
    ps::TrainConfig config;
    config.model_signature = models::Signature("cnn", (*towers)->tower(0)->variables());
    config.optimizer.name = "sgd";
    config.optimizer.learning_rate = 0.01f;
    const std::vector<float> init = models::InitialParameters((*towers)->tower(0)->variables(), 1);
    std::copy(init.begin(), init.end(), (*towers)->host_params());
    ASSERT_TRUE(client.Connect(config, (*towers)->host_params(), absl::Seconds(10)).ok());
    TrainingStepsOptions so;
    so.local_ps = server->get();
    so.config = config;
    auto steps = MakeTrainingSteps(towers->get(), &client, so);
    ASSERT_TRUE(steps.ok()) << steps.status();
    auto at = (*steps)->Start();
    ASSERT_TRUE(at.ok());
    std::vector<data::Batch> batches = data::EvalBatches(data.train, 16, data::Preprocess::kScale01);
    for (int s = 0; s < 6; ++s) {
      std::vector<models::HostBatch> views;
      for (int t = 0; t < n_towers; ++t) {
        const data::Batch& b = batches[(s + t) % batches.size()];
        views.push_back({b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()});
      }
      ASSERT_TRUE((*steps)->Step(views, at->step).ok());
      at = (*steps)->NextStep();
      ASSERT_TRUE(at.ok());
    }
    auto losses = (*steps)->TakeLosses();
    ASSERT_TRUE(losses.ok()) << losses.status();
    EXPECT_EQ(losses->size(), 6u);
    EXPECT_TRUE(dynamic_cast<ResidentSteps*>(steps->get())->graph_captured());
    ASSERT_TRUE((*steps)->Settle().ok());
  }
}

// A checkpoint saved from the device resumes on the device, and on the CPU path, to the uninterrupted run.
TEST(GpuTrainingTest, CheckpointsFromTheDeviceResume) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable CUDA device";
  const data::DatasetPair data = MakeSyntheticDataset(16, 100);  // one batch, repeated
  auto options = [&](const std::string& dir, const std::string& towers, int64_t steps) {
    WorkerOptions o = CnnOptions(&data, towers);
    o.shuffle = false;
    o.eval_every = 0;
    o.checkpoint.dir = dir;
    o.checkpoint.save_steps = 10;
    o.train_steps = steps;
    return o;
  };
  absl::StatusOr<TrainingResult> want = RunTraining(options("", "gpu:0", 40), {});
  ASSERT_TRUE(want.ok()) << want.status();
  const std::string dir = ::testing::TempDir() + "/gpu_training_test_ckpt";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(RunTraining(options(dir, "gpu:0", 20), {}).ok());
  absl::StatusOr<TrainingResult> resumed = RunTraining(options(dir, "gpu:0", 40), {});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->first_step, 20);
  EXPECT_LE(RelativeDifference(resumed->parameters, want->parameters), 1e-3);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(RunTraining(options(dir, "gpu:0", 20), {}).ok());
  absl::StatusOr<TrainingResult> on_cpu = RunTraining(options(dir, "", 40), {});
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_EQ(on_cpu->first_step, 20);
  EXPECT_LE(RelativeDifference(on_cpu->parameters, want->parameters), 1e-2);
}

// --device_resident=false (every step through the in-process ps, with per-layer uploads and downloads)
// trains like the device-resident path.
TEST(GpuTrainingTest, HostPathMatchesDeviceResidentPath) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable CUDA device";
  const data::DatasetPair data = MakeSyntheticDataset(800, 300);
  WorkerOptions host = CnnOptions(&data, "gpu:0");
  host.device_resident = false;
  absl::StatusOr<TrainingResult> a = RunTraining(host, {});
  absl::StatusOr<TrainingResult> b = RunTraining(CnnOptions(&data, "gpu:0"), {});
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ExpectClose(*b, *a, 1e-3, 1e-3);
}

// A GPU worker against a ps task (the cluster path: parameters uploaded layer by layer as the pull brings
// them, gradients downloaded and pushed layer by layer) trains like a CPU worker, with one and two towers.
TEST(GpuTrainingTest, ClusterWorkerMatchesCpuWorker) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable CUDA device";
  const data::DatasetPair data = MakeSyntheticDataset(800, 300);
  for (const std::string& towers : {std::string("gpu:0"), std::string("gpu:0,gpu:0")}) {
    SCOPED_TRACE(towers);
    auto run = [&](const std::string& t) -> absl::StatusOr<TrainingResult> {
      auto server = ps::ParameterServer::Create(ps::ParameterServerOptions{});
      if (!server.ok()) return server.status();
      WorkerOptions o = CnnOptions(&data, t);
      o.train_steps = 20;
      return RunTraining(o, {server->get()});
    };
    absl::StatusOr<TrainingResult> cpu = run(towers == "gpu:0" ? "" : "2");
    absl::StatusOr<TrainingResult> gpu = run(towers);
    ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
    EXPECT_EQ(gpu->global_step, 20);
    ExpectClose(*gpu, *cpu, 1e-2, 1e-2);
  }
}

// A bad label is InvalidArgument at once on the device-resident path too (checked on the host when staged).
TEST(GpuTrainingTest, BadLabelIsInvalidArgument) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable CUDA device";
  data::DatasetPair data = MakeSyntheticDataset(64, 10);
  data.train.num_classes = 5;  // labels up to 9 are out of range for a 5-class model
  WorkerOptions o = CnnOptions(&data, "gpu:0");
  o.evaluate = false;
  o.eval_every = 0;
  absl::StatusOr<TrainingResult> r = RunTraining(o, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("is not a class index in [0, 5)"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace dtrain::worker
