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

}  // namespace
}  // namespace dtrain::worker
