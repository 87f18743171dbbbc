#include "kernels/cuda/nccl_allreduce.h"

#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {
namespace {

TEST(GradientAllReducerTest, RejectsEmptyDeviceList) {
  auto r = CreateGradientAllReducer({}, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

TEST(GradientAllReducerTest, RejectsCpuDevice) {
  auto cpu = CreateCpuDevice(DeviceSpec::Cpu(1));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto r = CreateGradientAllReducer({cpu->get()}, 10);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("not a CUDA device"), std::string::npos) << r.status();
}

// Fills each tower's buffer with its own random values, averages, and checks every tower holds the mean.
void CheckAverage(const std::vector<int>& gpus, int64_t n) {
  std::vector<std::unique_ptr<Device>> owned;
  std::vector<Device*> devices;
  for (int g : gpus) {
    auto d = CreateCudaDevice(DeviceSpec::Gpu(g));
    ASSERT_TRUE(d.ok()) << d.status();
    devices.push_back(d->get());
    owned.push_back(std::move(*d));
  }
  auto reducer = CreateGradientAllReducer(devices, n);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  EXPECT_EQ((*reducer)->num_towers(), static_cast<int>(gpus.size()));

  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<double> sum(n, 0.0);
  std::vector<float*> buffers;
  for (Device* d : devices) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) {
      v[i] = dist(gen);
      sum[i] += v[i];
    }
    auto p = d->Alloc(n);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(d->CopyToDevice(v.data(), *p, n).ok());
    buffers.push_back(*p);
  }
  for (int round = 0; round < 2; ++round) {  // the second round averages already-equal buffers: a fixed point
    ASSERT_TRUE((*reducer)->AverageInPlace(buffers).ok());
    for (size_t t = 0; t < devices.size(); ++t) {
      std::vector<float> got(n);
      ASSERT_TRUE(devices[t]->CopyToHost(buffers[t], got.data(), n).ok());
      int bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const double want = sum[i] / static_cast<double>(devices.size());
        if (std::abs(got[i] - want) > 1e-5 + 1e-5 * std::abs(want) && bad++ < 3) {
          ADD_FAILURE() << "tower " << t << " round " << round << " [" << i << "] = " << got[i] << ", want " << want;
        }
      }
      EXPECT_EQ(bad, 0) << "tower " << t << " round " << round;
    }
  }
  EXPECT_EQ((*reducer)->AverageInPlace({buffers[0]}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GradientAllReducerTest, TwoTowersOnOneGpuAverage) {
  if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  CheckAverage({0, 0}, 100003);
}

TEST(GradientAllReducerTest, ThreeTowersOnOneGpuAverage) {
  if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  CheckAverage({0, 0, 0}, 4097);
}

TEST(GradientAllReducerTest, TowersOnSeveralGpusAverageThroughNccl) {
  if (UsableDeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  CheckAverage({0, 1, 0}, 100003);
}

}  // namespace
}  // namespace dtrain::kernels::cuda
