#include "worker/towers.h"

#include <cmath>

#include <gtest/gtest.h>

#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/denormals.h"

#include "worker/synthetic_data.h"

namespace dtrain::worker {
namespace {

TEST(ParseTowersTest, Forms) {
  auto one = ParseTowers("", 0, 2);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].threads, 2);

  auto three = ParseTowers("3", 0, 4);
  ASSERT_TRUE(three.ok());
  ASSERT_EQ(three->size(), 3u);
  EXPECT_EQ((*three)[0].threads + (*three)[1].threads + (*three)[2].threads, 4);

  auto gpus = ParseTowers("gpu:0,gpu:0,gpu:1", 0, 1);
  ASSERT_TRUE(gpus.ok());
  ASSERT_EQ(gpus->size(), 3u);
  EXPECT_EQ((*gpus)[2].kind, kernels::DeviceSpec::Kind::kGpu);
  EXPECT_EQ((*gpus)[2].gpu_index, 1);

  auto num_gpus = ParseTowers("", 2, 1);
  ASSERT_TRUE(num_gpus.ok());
  EXPECT_EQ(num_gpus->size(), 2u);

  EXPECT_EQ(ParseTowers("gpu:x", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTowers("0", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTowers("cpu,gpu:0", 0, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTowers("", 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TowersTest, GpuTowerWithoutGpuFailsClearly) {
  if (kernels::CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present";
  models::ModelOptions mo;
  mo.batch_size = 4;
  auto towers = Towers::Create("mlp", mo, {kernels::DeviceSpec::Gpu(0)});
  ASSERT_FALSE(towers.ok());
  EXPECT_EQ(towers.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(towers.status().message().rfind("no CUDA device available", 0), 0u) << towers.status();
}

// Averaging two towers' gradients on batches A and B equals one tower's gradient on A ∪ B (the seeds'
// average_gradients): the mean loss over 2b examples.
TEST(TowersTest, TwoTowerAverageEqualsOneTowerOnConcatenatedBatch) {
  const int b = 8;
  const data::DatasetPair data = MakeSyntheticDataset(2 * b, 1);
  models::ModelOptions mo;
  mo.batch_size = b;
  auto two = Towers::Create("mlp", mo, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(two.ok()) << two.status();
  mo.batch_size = 2 * b;
  auto one = Towers::Create("mlp", mo, {kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(one.ok()) << one.status();

  const std::vector<float> params = models::InitialParameters((*one)->tower(0)->variables(), 3);
  ASSERT_TRUE((*one)->SetParameters(params.data()).ok());
  ASSERT_TRUE((*two)->SetParameters(params.data()).ok());

  std::vector<data::Batch> all = data::EvalBatches(data.train, 2 * b, data::Preprocess::kScale01);
  ASSERT_EQ(all.size(), 1u);
  const data::Batch& full = all[0];
  const int64_t image = static_cast<int64_t>(full.height) * full.width * full.channels;
  models::HostBatch whole{2 * b, full.height, full.width, full.channels, full.images.data(), full.labels.data()};
  models::HostBatch first{b, full.height, full.width, full.channels, full.images.data(), full.labels.data()};
  models::HostBatch second{b, full.height, full.width, full.channels, full.images.data() + b * image,
                           full.labels.data() + b};

  const int64_t n = (*one)->num_parameters();
  auto l1 = (*one)->ComputeGradients({whole}, 0);
  auto l2 = (*two)->ComputeGradients({first, second}, 0);
  ASSERT_TRUE(l1.ok()) << l1.status();
  ASSERT_TRUE(l2.ok()) << l2.status();
  const float* g1 = (*one)->host_grads();
  const float* g2 = (*two)->host_grads();
  EXPECT_NEAR(*l1, *l2, 1e-5 * std::abs(*l1));
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (g1[i] - g2[i]) * static_cast<double>(g1[i] - g2[i]);
    den += g1[i] * static_cast<double>(g1[i]);
  }
  ASSERT_GT(den, 0);
  EXPECT_LE(std::sqrt(num / den), 1e-5);
}

// Losses of `steps` SGD steps of `model` on fixed synthetic batches with the given towers.
std::vector<float> LossCurve(const std::string& model, int batch, const std::vector<kernels::DeviceSpec>& specs,
                             int steps, float lr) {
  const data::DatasetPair data = MakeSyntheticDataset(batch * static_cast<int>(specs.size()) * 4, 1);
  models::ModelOptions mo;
  mo.batch_size = batch;
  auto towers = Towers::Create(model, mo, specs);
  EXPECT_TRUE(towers.ok()) << towers.status();
  if (!towers.ok()) return {};
  std::vector<float> params = models::InitialParameters((*towers)->tower(0)->variables(), 5);
  std::vector<data::Batch> batches = data::EvalBatches(data.train, batch, data::Preprocess::kScale01);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE((*towers)->SetParameters(params.data()).ok());
    std::vector<models::HostBatch> views;
    for (size_t t = 0; t < specs.size(); ++t) {
      const data::Batch& b = batches[(s * specs.size() + t) % batches.size()];
      views.push_back({b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()});
    }
    auto loss = (*towers)->ComputeGradients(views, s);
    EXPECT_TRUE(loss.ok()) << loss.status();
    if (!loss.ok()) return {};
    losses.push_back(*loss);
    const float* grads = (*towers)->host_grads();
    for (size_t i = 0; i < params.size(); ++i) params[i] -= lr * grads[i];
  }
  return losses;
}

// The GPU tower trains like the CPU tower: same initial values, same batches, same dropout masks (the shared
// counter-based RNG), so the loss curves agree within fp32 tolerance.
TEST(TowersTest, GpuCnnLossCurveMatchesCpu) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> cpu = LossCurve("cnn", 16, {kernels::DeviceSpec::Cpu(2)}, 8, 0.01f);
  const std::vector<float> gpu = LossCurve("cnn", 16, {kernels::DeviceSpec::Gpu(0)}, 8, 0.01f);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(cpu[i], gpu[i], 2e-3 * std::abs(cpu[i]) + 1e-4) << "step " << i;
  EXPECT_LT(cpu.back(), cpu.front());
}

// Two GPU towers (sharing GPU 0) averaged on the device equal the CPU's two-tower average.
TEST(TowersTest, TwoGpuTowersMatchTwoCpuTowers) {
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<float> cpu =
      LossCurve("mlp", 32, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)}, 6, 0.1f);
  const std::vector<float> gpu =
      LossCurve("mlp", 32, {kernels::DeviceSpec::Gpu(0), kernels::DeviceSpec::Gpu(0)}, 6, 0.1f);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_NEAR(cpu[i], gpu[i], 1e-3 * std::abs(cpu[i]) + 1e-4) << "step " << i;
}

// The CPU two-tower loop itself trains (the helper the GPU tests rely on is sound).
TEST(TowersTest, LossCurveFallsOnCpu) {
  const std::vector<float> cpu =
      LossCurve("mlp", 32, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)}, 10, 0.1f);
  ASSERT_EQ(cpu.size(), 10u);
  EXPECT_LT(cpu.back(), 0.7f * cpu.front());
}

// CPU towers compute on the host buffers in place, and a step's hooks see it layer by layer: every tower waits
// for each layer's parameters before reading them (forward order), and each layer's gradient is handed on once,
// already averaged over the towers, last layer first.
TEST(TowersTest, PerLayerHooksSeeAveragedGradientsLastLayerFirst) {
  const int b = 8;
  const data::DatasetPair data = MakeSyntheticDataset(4 * b, 1);
  models::ModelOptions mo;
  mo.batch_size = b;
  auto towers = Towers::Create("cnn", mo, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(towers.ok()) << towers.status();
  EXPECT_TRUE((*towers)->host_resident());
  const std::vector<float> params = models::InitialParameters((*towers)->tower(0)->variables(), 3);
  std::copy(params.begin(), params.end(), (*towers)->host_params());
  std::vector<data::Batch> batches = data::EvalBatches(data.train, b, data::Preprocess::kScale01);
  std::vector<models::HostBatch> views;
  for (int t = 0; t < 2; ++t) {
    const data::Batch& x = batches[t];
    views.push_back({x.batch, x.height, x.width, x.channels, x.images.data(), x.labels.data()});
  }
  absl::Mutex mu;
  std::vector<std::pair<int64_t, int64_t>> waited, ready;
  std::vector<std::vector<float>> at_ready;
  models::StepHooks hooks;
  hooks.before_forward = [&](int64_t begin, int64_t end) {
    absl::MutexLock lock(&mu);
    waited.emplace_back(begin, end);
    return absl::OkStatus();
  };
  hooks.gradients_ready = [&](int64_t begin, int64_t end) {
    absl::MutexLock lock(&mu);
    ready.emplace_back(begin, end);
    const float* g = (*towers)->host_grads();
    at_ready.emplace_back(g + begin, g + end);
    return absl::OkStatus();
  };
  ASSERT_TRUE((*towers)->ComputeGradients(views, 0, &hooks).ok());
  // cnn: conv1, conv2, fc1, fc2, each [weights, biases]: 4 ranges, waited for by both towers.
  ASSERT_EQ(waited.size(), 8u);
  ASSERT_EQ(ready.size(), 4u);
  for (size_t i = 1; i < ready.size(); ++i) EXPECT_EQ(ready[i].second, ready[i - 1].first) << "last layer first";
  EXPECT_EQ(ready.back().first, 0);
  EXPECT_EQ(ready.front().second, (*towers)->num_parameters());
  const float* final_grads = (*towers)->host_grads();
  for (size_t i = 0; i < ready.size(); ++i) {
    EXPECT_EQ(at_ready[i], std::vector<float>(final_grads + ready[i].first, final_grads + ready[i].second))
        << "range " << i << " changed after it was handed on";
  }
  // The same as computing without hooks.
  std::vector<float> hooked(final_grads, final_grads + (*towers)->num_parameters());
  ASSERT_TRUE((*towers)->ComputeGradients(views, 0).ok());
  EXPECT_EQ(hooked, std::vector<float>((*towers)->host_grads(), (*towers)->host_grads() + (*towers)->num_parameters()));
}

// Denormal floats are flushed on the towers' threads: with denormal inputs (and so denormal products) the
// first convolution's weight gradient (the cnn has no weight decay) is exactly zero.
TEST(TowersTest, TowerThreadsFlushDenormals) {
  const int b = 2;
  models::ModelOptions mo;
  mo.batch_size = b;
  auto towers = Towers::Create("cnn", mo, {kernels::DeviceSpec::Cpu(1), kernels::DeviceSpec::Cpu(1)});
  ASSERT_TRUE(towers.ok()) << towers.status();
  const std::vector<models::VariableInfo> vars = (*towers)->tower(0)->variables();
  const std::vector<float> params = models::InitialParameters(vars, 3);
  std::copy(params.begin(), params.end(), (*towers)->host_params());
  std::vector<float> images(b * 28 * 28, 1e-39f), labels(b, 1.0f);  // 1e-39: denormal
  const models::HostBatch batch{b, 28, 28, 1, images.data(), labels.data()};
  std::thread t([&] {
    ClearFlushDenormals();  // as if the caller had never set it (threads inherit the mode)
    ASSERT_TRUE((*towers)->ComputeGradients({batch, batch}, 0).ok());
  });
  t.join();
  const float* g = (*towers)->host_grads();
  ASSERT_EQ(vars[0].name, "conv1/weights");
  int64_t nonzero = 0;
  for (int64_t i = 0; i < vars[0].size(); ++i) nonzero += g[i] != 0.0f;
  EXPECT_EQ(nonzero, 0) << "denormal products survived on a tower thread";
}

}  // namespace
}  // namespace dtrain::worker
