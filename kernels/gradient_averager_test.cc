// The device-neutral GradientAverager on CPU towers (the CUDA one is tested against a host mean in
// kernels/cuda/nccl_allreduce_test.cc): the mean in every buffer (or tower 0's), whole or per range, the same
// bits for any thread count, and the argument checks of the factory and the calls.
#include "kernels/gradient_averager.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/gradient_check.h"

namespace dtrain::kernels {
namespace {

struct CpuTowers {
  std::vector<std::unique_ptr<Device>> owned;
  std::vector<Device*> devices;
  std::vector<std::vector<float>> data;
  std::vector<float*> buffers;
};

CpuTowers Make(int towers, int threads_each, int64_t n) {
  CpuTowers t;
  for (int k = 0; k < towers; ++k) {
    auto d = CreateDevice(DeviceSpec::Cpu(threads_each));
    EXPECT_TRUE(d.ok());
    t.devices.push_back(d->get());
    t.owned.push_back(std::move(*d));
    t.data.push_back(testing::RandomVector(n, 10 + k));
  }
  for (auto& v : t.data) t.buffers.push_back(v.data());
  return t;
}

// The towers' old host loop (worker/towers/towers.cc before the averager): sum into tower 0 in tower order, then
// scale.
std::vector<float> ExpectedMean(const std::vector<std::vector<float>>& data) {
  std::vector<float> mean = data[0];
  for (size_t k = 1; k < data.size(); ++k) {
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += data[k][i];
  }
  const float inv = 1.0f / static_cast<float>(data.size());
  for (float& x : mean) x *= inv;
  return mean;
}

TEST(CpuGradientAveragerTest, EveryTowerHoldsTheMeanBitForBitForAnyThreadCount) {
  const int64_t n = 300007;  // several chunks
  for (int threads : {1, 2}) {
    CpuTowers t = Make(3, threads, n);
    const std::vector<float> want = ExpectedMean(t.data);
    auto avg = CreateGradientAverager(t.devices, n);
    ASSERT_TRUE(avg.ok()) << avg.status();
    EXPECT_EQ((*avg)->num_towers(), 3);
    EXPECT_EQ((*avg)->size(), n);
    ASSERT_TRUE((*avg)->AverageInPlace(t.buffers).ok());
    for (int k = 0; k < 3; ++k) EXPECT_EQ(t.data[k], want) << "tower " << k << ", threads " << threads;
  }
}

TEST(CpuGradientAveragerTest, RangesAverageOnlyTheirRangeAndFirstTowerTargetLeavesTheOthers) {
  const int64_t n = 1000;
  CpuTowers t = Make(2, 1, n);
  const std::vector<float> want = ExpectedMean(t.data);
  const std::vector<float> tower0 = t.data[0], tower1 = t.data[1];
  auto avg = CreateGradientAverager(t.devices, n, AverageTarget::kFirstTower);
  ASSERT_TRUE(avg.ok());
  ASSERT_TRUE((*avg)->AverageRange(t.buffers, 100, 300).ok());
  for (int64_t i = 0; i < n; ++i) {
    const bool inside = i >= 100 && i < 400;
    ASSERT_EQ(t.data[0][i], inside ? want[i] : tower0[i]) << i;
    ASSERT_EQ(t.data[1][i], tower1[i]) << "kFirstTower leaves tower 1 alone, " << i;
  }
  ASSERT_TRUE((*avg)->AverageRange(t.buffers, 0, 100).ok());
  ASSERT_TRUE((*avg)->AverageRange(t.buffers, 400, n - 400).ok());
  ASSERT_TRUE((*avg)->Join().ok());
  EXPECT_EQ(t.data[0], want);
}

TEST(CpuGradientAveragerTest, OneTowerIsUnchanged) {
  CpuTowers t = Make(1, 1, 100);
  const std::vector<float> before = t.data[0];
  auto avg = CreateGradientAverager(t.devices, 100);
  ASSERT_TRUE(avg.ok());
  ASSERT_TRUE((*avg)->AverageInPlace(t.buffers).ok());
  EXPECT_EQ(t.data[0], before);
}

TEST(CpuGradientAveragerTest, BadArgumentsAreInvalidArgument) {
  CpuTowers t = Make(2, 1, 10);
  EXPECT_EQ(CreateGradientAverager({}, 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGradientAverager(t.devices, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGradientAverager({t.devices[0], t.devices[0]}, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGradientAverager({t.devices[0], nullptr}, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto avg = CreateGradientAverager(t.devices, 10);
  ASSERT_TRUE(avg.ok());
  EXPECT_EQ((*avg)->AverageInPlace({t.buffers[0]}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*avg)->AverageInPlace({t.buffers[0], nullptr}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*avg)->AverageRange(t.buffers, 5, 6).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*avg)->AverageRange(t.buffers, -1, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*avg)->WaitForAverages(1, Queue::kCopy).ok()) << "synchronous averages: nothing to wait for";
  EXPECT_EQ((*avg)->WaitForAverages(2, Queue::kCopy).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*avg)->WaitForAverages(-1, Queue::kCompute).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::kernels
