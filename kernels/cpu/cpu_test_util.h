// Test fixture for the CPU backend's op tests: a Device with a parameterized thread count and helpers that
// move host vectors through the Device interface (Alloc + CopyToDevice / CopyToHost), as a GPU test would.
// Thread-compatible (one test at a time).
#ifndef DTRAIN_KERNELS_CPU_CPU_TEST_UTIL_H_
#define DTRAIN_KERNELS_CPU_CPU_TEST_UTIL_H_

#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/gradient_check.h"

namespace dtrain::kernels::testing {

class CpuDeviceTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    auto dev = CreateCpuDevice(DeviceSpec::Cpu(GetParam()));
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
  }

  // Device memory holding a copy of v.
  float* Upload(const std::vector<float>& v) {
    float* p = Zeros(static_cast<int64_t>(v.size()));
    EXPECT_TRUE(dev_->CopyToDevice(v.data(), p, static_cast<int64_t>(v.size())).ok());
    return p;
  }
  // Overwrites device memory p with v.
  void Write(const std::vector<float>& v, float* p) {
    EXPECT_TRUE(dev_->CopyToDevice(v.data(), p, static_cast<int64_t>(v.size())).ok());
  }
  float* Zeros(int64_t n) {
    auto p = dev_->Alloc(n);
    EXPECT_TRUE(p.ok()) << p.status();
    EXPECT_TRUE(dev_->Fill(0.0f, *p, n).ok());
    return *p;
  }
  std::vector<float> Download(const float* p, int64_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(dev_->CopyToHost(p, v.data(), n).ok());
    return v;
  }

  std::unique_ptr<Device> dev_;
};

#define EXPECT_ARRAYS_NEAR(actual, expected, rel, abs_tol)                                               \
  do {                                                                                                   \
    const ::dtrain::kernels::testing::CompareResult cmp_ =                                               \
        ::dtrain::kernels::testing::CompareArrays((actual), (expected), (rel), (abs_tol));               \
    EXPECT_EQ(cmp_.mismatches, 0) << cmp_.first_mismatch << " (max abs err " << cmp_.max_abs_err << ")"; \
  } while (0)

#define EXPECT_GRADIENT_OK(result)                                                               \
  do {                                                                                           \
    const ::dtrain::kernels::testing::GradCheckResult gc_ = (result);                            \
    EXPECT_GT(gc_.checked, 0);                                                                   \
    EXPECT_EQ(gc_.failed, 0) << gc_.first_failure << " (" << gc_.failed << " of " << gc_.checked \
                             << " failed, max abs err " << gc_.max_abs_err << ")";               \
  } while (0)

}  // namespace dtrain::kernels::testing

#endif  // DTRAIN_KERNELS_CPU_CPU_TEST_UTIL_H_
