// The CUDA GradientAverager (device Axpy for towers sharing a GPU, NCCL across GPUs) against a host average,
// whole and per bucket while the towers' streams keep producing later buckets. Every test skips without a
// usable GPU (and the multi-GPU one without two).
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/device.h"
#include "kernels/gradient_averager.h"

namespace dtrain::kernels::cuda {
namespace {

struct Towers {
  std::vector<std::unique_ptr<Device>> owned;
  std::vector<Device*> devices;
  std::vector<float*> buffers;
  std::vector<std::vector<float>> values;  // what each tower's buffer held before averaging
};

Towers MakeTowers(const std::vector<int>& gpus, int64_t n) {
  Towers t;
  std::mt19937 gen(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int g : gpus) {
    auto d = CreateDevice(DeviceSpec::Gpu(g));
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return t;
    std::vector<float> v(n);
    for (float& x : v) x = dist(gen);
    auto p = (*d)->Alloc(n);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE((*d)->CopyToDevice(v.data(), *p, n).ok());
    t.devices.push_back(d->get());
    t.buffers.push_back(*p);
    t.values.push_back(std::move(v));
    t.owned.push_back(std::move(*d));
  }
  return t;
}

// Expects towers `which` to hold the mean of t.values.
void ExpectMean(Towers& t, const std::vector<size_t>& which, int64_t n, const char* what) {
  for (size_t k : which) {
    std::vector<float> got(n);
    ASSERT_TRUE(t.devices[k]->CopyToHost(t.buffers[k], got.data(), n).ok());
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0;
      for (const auto& v : t.values) sum += v[i];
      const double want = sum / static_cast<double>(t.values.size());
      if (std::abs(got[i] - want) > 1e-5 + 1e-5 * std::abs(want) && bad++ < 3) {
        ADD_FAILURE() << what << ": tower " << k << " [" << i << "] = " << got[i] << ", want " << want;
      }
    }
    EXPECT_EQ(bad, 0) << what << ": tower " << k;
  }
}

std::vector<size_t> All(const Towers& t) {
  std::vector<size_t> all;
  for (size_t k = 0; k < t.devices.size(); ++k) all.push_back(k);
  return all;
}

void CheckWholeAverage(const std::vector<int>& gpus, int64_t n) {
  Towers t = MakeTowers(gpus, n);
  ASSERT_EQ(t.devices.size(), gpus.size());
  auto avg = CreateGradientAverager(t.devices, n);
  ASSERT_TRUE(avg.ok()) << avg.status();
  EXPECT_EQ((*avg)->num_towers(), static_cast<int>(gpus.size()));
  ASSERT_TRUE((*avg)->AverageInPlace(t.buffers).ok());
  ExpectMean(t, All(t), n, "first average");
  ASSERT_TRUE((*avg)->AverageInPlace(t.buffers).ok());  // averaging equal buffers is a fixed point
  ExpectMean(t, All(t), n, "second average");
  EXPECT_EQ((*avg)->AverageInPlace({t.buffers[0]}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*avg)->AverageRange(t.buffers, n - 1, 2).code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclGradientAveragerTest, TwoTowersOnOneGpuAverage) {
  if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  CheckWholeAverage({0, 0}, 100003);
}

TEST(NcclGradientAveragerTest, ThreeTowersOnOneGpuAverage) {
  if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  CheckWholeAverage({0, 0, 0}, 4097);
}

TEST(NcclGradientAveragerTest, TowersOnSeveralGpusAverageThroughNccl) {
  if (UsableDeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
  CheckWholeAverage({0, 1, 0}, 100003);
}

// Buckets: the second half of every tower's gradient is still being written on the towers' compute streams
// (as by a backward pass) after the first half's average was enqueued; after Join both halves hold the mean.
TEST(NcclGradientAveragerTest, BucketsAverageWhileTheStreamsKeepWorking) {
  if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  std::vector<int> gpus = {0, 0};
  if (UsableDeviceCount() >= 2) gpus = {0, 1, 0};
  const int64_t n = 200000, half = n / 2;
  Towers t = MakeTowers(gpus, n);
  ASSERT_EQ(t.devices.size(), gpus.size());
  // The second halves start as garbage; the "backward" below writes their real values later.
  for (size_t k = 0; k < t.devices.size(); ++k)
    ASSERT_TRUE(t.devices[k]->Fill(1e6f, t.buffers[k] + half, n - half).ok());
  auto avg = CreateGradientAverager(t.devices, n, AverageTarget::kEveryTower);
  ASSERT_TRUE(avg.ok()) << avg.status();
  ASSERT_TRUE((*avg)->AverageRange(t.buffers, 0, half).ok());
  for (size_t k = 0; k < t.devices.size(); ++k) {
    auto staging = t.devices[k]->Alloc(n - half);
    ASSERT_TRUE(staging.ok());
    ASSERT_TRUE(t.devices[k]->CopyToDevice(t.values[k].data() + half, *staging, n - half).ok());
    ASSERT_TRUE(t.devices[k]->CopyOnDevice(*staging, t.buffers[k] + half, n - half).ok());
  }
  ASSERT_TRUE((*avg)->AverageRange(t.buffers, half, n - half).ok());
  ASSERT_TRUE((*avg)->Join().ok());
  ExpectMean(t, All(t), n, "bucketed average");
}

TEST(NcclGradientAveragerTest, FirstTowerTargetAveragesIntoTowerZero) {
  if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  const int64_t n = 30011;
  Towers t = MakeTowers({0, 0, 0}, n);
  ASSERT_EQ(t.devices.size(), 3u);
  auto avg = CreateGradientAverager(t.devices, n, AverageTarget::kFirstTower);
  ASSERT_TRUE(avg.ok()) << avg.status();
  ASSERT_TRUE((*avg)->AverageInPlace(t.buffers).ok());
  ExpectMean(t, {0}, n, "tower 0");
}

// The per-layer download of a GPU worker in a cluster: tower 0's copy queue waits for a range's average (not
// for a Join, so the compute queues keep going) and copies the mean to pinned host memory.
TEST(NcclGradientAveragerTest, CopyQueueWaitsForOneRangesAverage) {
  if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  const int64_t n = 100000, half = n / 2;
  Towers t = MakeTowers({0, 0}, n);
  ASSERT_EQ(t.devices.size(), 2u);
  auto avg = CreateGradientAverager(t.devices, n, AverageTarget::kFirstTower);
  ASSERT_TRUE(avg.ok()) << avg.status();
  auto host = t.devices[0]->AllocHostPinned(half);
  auto copied = t.devices[0]->MakeEvent();
  ASSERT_TRUE(host.ok() && copied.ok());
  ASSERT_TRUE((*avg)->AverageRange(t.buffers, half, n - half).ok());
  ASSERT_TRUE((*avg)->WaitForAverages(0, Queue::kCopy).ok());
  ASSERT_TRUE(t.devices[0]->CopyToHostAsync(t.buffers[0] + half, *host, n - half, Queue::kCopy).ok());
  ASSERT_TRUE(t.devices[0]->RecordEvent(copied->get(), Queue::kCopy).ok());
  ASSERT_TRUE(t.devices[0]->SynchronizeEvent(copied->get()).ok());
  int bad = 0;
  for (int64_t i = 0; i < n - half; ++i) {
    const double want = (static_cast<double>(t.values[0][half + i]) + t.values[1][half + i]) / 2.0;
    if (std::abs((*host)[i] - want) > 1e-5 + 1e-5 * std::abs(want)) ++bad;
  }
  EXPECT_EQ(bad, 0);
  ASSERT_TRUE((*avg)->Join().ok());
  EXPECT_EQ((*avg)->WaitForAverages(2, Queue::kCopy).code(), absl::StatusCode::kInvalidArgument);
  t.devices[0]->FreeHostPinned(*host);
}

TEST(NcclGradientAveragerTest, MixedCpuAndGpuTowersAreInvalidArgument) {
  if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  auto gpu = CreateDevice(DeviceSpec::Gpu(0));
  auto cpu = CreateDevice(DeviceSpec::Cpu(1));
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  auto avg = CreateGradientAverager({gpu->get(), cpu->get()}, 10);
  EXPECT_EQ(avg.status().code(), absl::StatusCode::kInvalidArgument) << avg.status();
}

}  // namespace
}  // namespace dtrain::kernels::cuda
