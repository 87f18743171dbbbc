// The CPU backend computes with flush-to-zero and denormals-are-zero on every thread it uses: the calling
// thread and its OpenMP pool, for our own loops and for oneDNN's primitives. Each check runs on a fresh thread
// (this test binary sets nothing itself), feeds denormal floats and expects exact zeros.
#include <thread>
#include <vector>

#include "common/denormals.h"
#include "gtest/gtest.h"
#include "kernels/device.h"

namespace dtrain::kernels {
namespace {

constexpr float kDenormal = 1e-39f;

TEST(CpuDenormalsTest, ElementwiseLoopsOnEveryPoolThread) {
  std::thread t([] {
    ClearFlushDenormals();
    ASSERT_FALSE(FlushDenormalsEnabled());
    auto dev = CreateCpuDevice(DeviceSpec::Cpu(2));
    ASSERT_TRUE(dev.ok()) << dev.status();
    const int64_t n = 1 << 20;  // far above the parallel threshold: both OpenMP threads get a half
    std::vector<float> x(n, kDenormal), y(n, 1.0f);
    ASSERT_TRUE((*dev)->Scale(1.0f, x.data(), y.data(), n).ok());
    int64_t nonzero = 0;
    for (float v : y) nonzero += v != 0.0f;
    EXPECT_EQ(nonzero, 0) << "denormals survived on some OpenMP thread";
    EXPECT_TRUE(FlushDenormalsEnabled());
  });
  t.join();
}

TEST(CpuDenormalsTest, OneDnnPrimitivesOnEveryPoolThread) {
  std::thread t([] {
    ClearFlushDenormals();
    auto dev = CreateCpuDevice(DeviceSpec::Cpu(2));
    ASSERT_TRUE(dev.ok()) << dev.status();
    const int batch = 64, in = 256, out = 128;
    auto dense = (*dev)->MakeDense({batch, in, out});
    ASSERT_TRUE(dense.ok()) << dense.status();
    // y = x w + b with denormal x: every product is flushed (DAZ), so y is exactly b.
    std::vector<float> x(batch * in, kDenormal), w(in * out, 0.5f), b(out, 0.0f), y(batch * out, 1.0f);
    ASSERT_TRUE((*dense)->Forward(x.data(), w.data(), b.data(), y.data()).ok());
    int64_t nonzero = 0;
    for (float v : y) nonzero += v != 0.0f;
    EXPECT_EQ(nonzero, 0) << "denormals survived in a oneDNN primitive";
  });
  t.join();
}

}  // namespace
}  // namespace dtrain::kernels
