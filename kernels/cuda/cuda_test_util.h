// Test fixture for the CUDA backend's tests: a CPU device (the oracle) and gpu:0, helpers that put the same
// host data on both and compare results. Tests using it skip (GTEST_SKIP) without a usable CUDA device.
// Thread-compatible (one test at a time).
#ifndef DTRAIN_KERNELS_CUDA_CUDA_TEST_UTIL_H_
#define DTRAIN_KERNELS_CUDA_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {

inline std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Counts elements with |got - want| > abs_tol + rel * |want| and describes the first few.
inline ::testing::AssertionResult Near(const std::vector<float>& got, const std::vector<float>& want,
                                       float rel, float abs_tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  int64_t bad = 0;
  std::ostringstream first;
  float max_err = 0.0f;
  for (size_t i = 0; i < got.size(); ++i) {
    const float err = std::fabs(got[i] - want[i]);
    max_err = std::max(max_err, err);
    if (!(err <= abs_tol + rel * std::fabs(want[i]))) {
      if (bad < 5) first << " [" << i << "] cuda=" << got[i] << " cpu=" << want[i] << ";";
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " differ (max abs err " << max_err << "):" << first.str();
}

inline constexpr float kRel = 1e-3f, kAbs = 1e-4f;

class CudaVsCpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (UsableDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
    auto cpu = CreateCpuDevice(DeviceSpec::Cpu(2));
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    auto gpu = CreateCudaDevice(DeviceSpec::Gpu(0));
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    EXPECT_EQ(gpu_->name(), "gpu:0");
  }

  // The same host data on both devices.
  struct Both {
    float* cpu;
    float* gpu;
    int64_t n;
  };
  Both Upload(const std::vector<float>& v) {
    Both b = Zeros(static_cast<int64_t>(v.size()));
    EXPECT_TRUE(cpu_->CopyToDevice(v.data(), b.cpu, b.n).ok());
    EXPECT_TRUE(gpu_->CopyToDevice(v.data(), b.gpu, b.n).ok());
    return b;
  }
  Both Zeros(int64_t n) {
    auto c = cpu_->Alloc(n);
    auto g = gpu_->Alloc(n);
    EXPECT_TRUE(c.ok() && g.ok());
    EXPECT_TRUE(cpu_->Fill(0.0f, *c, n).ok());
    EXPECT_TRUE(gpu_->Fill(0.0f, *g, n).ok());
    return {*c, *g, n};
  }
  std::vector<float> Cpu(const Both& b) { return Get(cpu_.get(), b.cpu, b.n); }
  std::vector<float> Gpu(const Both& b) { return Get(gpu_.get(), b.gpu, b.n); }
  static std::vector<float> Get(Device* d, const float* p, int64_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(d->CopyToHost(p, v.data(), n).ok());
    return v;
  }
  ::testing::AssertionResult Same(const Both& b, float rel = kRel, float abs_tol = kAbs) {
    return Near(Gpu(b), Cpu(b), rel, abs_tol);
  }

  std::unique_ptr<Device> cpu_, gpu_;
};

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_CUDA_TEST_UTIL_H_
