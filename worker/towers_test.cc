#include "worker/towers.h"

#include <cmath>

#include <gtest/gtest.h>

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
  std::vector<float> g1(n), g2(n);
  auto l1 = (*one)->ComputeGradients({whole}, 0, g1.data());
  auto l2 = (*two)->ComputeGradients({first, second}, 0, g2.data());
  ASSERT_TRUE(l1.ok()) << l1.status();
  ASSERT_TRUE(l2.ok()) << l2.status();
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
  std::vector<float> grads(params.size());
  std::vector<data::Batch> batches = data::EvalBatches(data.train, batch, data::Preprocess::kScale01);
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    EXPECT_TRUE((*towers)->SetParameters(params.data()).ok());
    std::vector<models::HostBatch> views;
    for (size_t t = 0; t < specs.size(); ++t) {
      const data::Batch& b = batches[(s * specs.size() + t) % batches.size()];
      views.push_back({b.batch, b.height, b.width, b.channels, b.images.data(), b.labels.data()});
    }
    auto loss = (*towers)->ComputeGradients(views, s, grads.data());
    EXPECT_TRUE(loss.ok()) << loss.status();
    if (!loss.ok()) return {};
    losses.push_back(*loss);
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

}  // namespace
}  // namespace dtrain::worker
