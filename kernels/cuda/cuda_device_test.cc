// The CUDA backend's error paths that need no GPU; they run on every machine (with a GPU, the index past the
// last device is the unusable one).
#include "kernels/cuda/cuda_device.h"

#include <string>

#include "gtest/gtest.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {
namespace {

TEST(CreateCudaDeviceTest, UnusableGpuIsFailedPrecondition) {
  // Without a GPU (or driver) gpu:0 is unusable; with one, the index past the last device is.
  const int count = UsableDeviceCount();
  EXPECT_GE(count, 0);
  const DeviceSpec spec = DeviceSpec::Gpu(count);
  auto dev = CreateCudaDevice(spec);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kFailedPrecondition) << dev.status();
  EXPECT_EQ(dev.status().message().rfind("no CUDA device available", 0), 0u) << dev.status();
  EXPECT_NE(dev.status().message().find(spec.ToString()), std::string::npos) << dev.status();

  // The dispatcher gives the same answer.
  auto via_dispatch = CreateDevice(spec);
  ASSERT_FALSE(via_dispatch.ok());
  EXPECT_EQ(via_dispatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaDeviceCount(), count);
}

TEST(CreateCudaDeviceTest, CpuSpecIsInvalidArgument) {
  auto dev = CreateCudaDevice(DeviceSpec::Cpu(1));
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), absl::StatusCode::kInvalidArgument) << dev.status();
}

}  // namespace
}  // namespace dtrain::kernels::cuda
