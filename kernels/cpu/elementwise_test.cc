#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

class ElementwiseTest : public CpuDeviceTest {};

// Sizes below and above the parallel threshold, not multiples of the vector width or the chunk size.
const std::vector<int64_t> kSizes = {1, 37, 200003};

TEST_P(ElementwiseTest, ReluAndBackwardMatchReference) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> x = RandomVector(n, 1), dy = RandomVector(n, 2);
    float *dx = Upload(x), *dyy = Zeros(n), *ddy = Upload(dy), *dgx = Zeros(n);
    ASSERT_TRUE(dev_->Relu(dx, dyy, n).ok());
    ASSERT_TRUE(dev_->ReluBackward(dyy, ddy, dgx, n).ok());
    std::vector<float> y_ref(n), gx_ref(n);
    reference::Relu(x.data(), y_ref.data(), n);
    reference::ReluBackward(y_ref.data(), dy.data(), gx_ref.data(), n);
    EXPECT_ARRAYS_NEAR(Download(dyy, n), y_ref, 0, 0);
    EXPECT_ARRAYS_NEAR(Download(dgx, n), gx_ref, 0, 0);
    // In place.
    ASSERT_TRUE(dev_->Relu(dx, dx, n).ok());
    EXPECT_ARRAYS_NEAR(Download(dx, n), y_ref, 0, 0);
    ASSERT_TRUE(dev_->ReluBackward(dyy, ddy, ddy, n).ok());
    EXPECT_ARRAYS_NEAR(Download(ddy, n), gx_ref, 0, 0);
  }
}

TEST_P(ElementwiseTest, ReluGradientByFiniteDifferences) {
  const int64_t n = 300;
  std::vector<float> x = RandomVector(n, 3);
  for (float& v : x) v += v >= 0 ? 0.05f : -0.05f;  // keep |x| > step so no coordinate crosses the kink
  const std::vector<float> r = RandomVector(n, 4);
  float *dx = Upload(x), *dy = Zeros(n), *dr = Upload(r), *dgx = Zeros(n);
  ASSERT_TRUE(dev_->Relu(dx, dy, n).ok());
  ASSERT_TRUE(dev_->ReluBackward(dy, dr, dgx, n).ok());
  float* probe = Zeros(n);
  EXPECT_GRADIENT_OK(CheckGradient(x, Download(dgx, n), [&](const std::vector<float>& v) {
    Write(v, probe);
    EXPECT_TRUE(dev_->Relu(probe, dy, n).ok());
    return Dot(Download(dy, n), r);
  }));
}

TEST_P(ElementwiseTest, DropoutMaskStatisticsAndDeterminism) {
  const int64_t n = 100003;
  const float keep = 0.7f;
  const std::vector<float> x = RandomVector(n, 5, 0.5f, 1.5f);
  float *dx = Upload(x), *dy = Zeros(n), *dmask = Zeros(n), *dmask2 = Zeros(n), *dy2 = Zeros(n);
  ASSERT_TRUE(dev_->Dropout(dx, dy, dmask, n, keep, /*seed=*/42, /*counter=*/7).ok());
  const std::vector<float> mask = Download(dmask, n), y = Download(dy, n);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(mask[i] == 0.0f || mask[i] == 1.0f / keep) << "mask[" << i << "] = " << mask[i];
    ASSERT_EQ(y[i], x[i] * mask[i]) << i;
    kept += mask[i] != 0.0f;
  }
  // Binomial(n, 0.7): standard deviation of the fraction is 0.0014; 0.01 is seven of them.
  EXPECT_NEAR(static_cast<double>(kept) / n, keep, 0.01);
  // The documented function, element by element (what the CUDA backend must reproduce).
  std::vector<float> mask_ref(n);
  reference::DropoutMask(n, keep, 42, 7, mask_ref.data());
  EXPECT_ARRAYS_NEAR(mask, mask_ref, 0, 0);

  // Same (seed, counter): same mask. Another counter or seed: a different one (~42% of entries differ).
  ASSERT_TRUE(dev_->Dropout(dx, dy2, dmask2, n, keep, 42, 7).ok());
  EXPECT_ARRAYS_NEAR(Download(dmask2, n), mask, 0, 0);
  for (auto [seed, counter] : {std::pair<uint64_t, uint64_t>{42, 8}, {43, 7}}) {
    ASSERT_TRUE(dev_->Dropout(dx, dy2, dmask2, n, keep, seed, counter).ok());
    const std::vector<float> other = Download(dmask2, n);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += other[i] != mask[i];
    EXPECT_NEAR(static_cast<double>(differ) / n, 2 * keep * (1 - keep), 0.02) << seed << "/" << counter;
  }

  // Backward multiplies by the mask (in place allowed).
  const std::vector<float> g = RandomVector(n, 6);
  float* dg = Upload(g);
  ASSERT_TRUE(dev_->DropoutBackward(dg, dmask, dg, n).ok());
  const std::vector<float> gx = Download(dg, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(gx[i], g[i] * mask[i]) << i;
}

TEST_P(ElementwiseTest, DropoutKeepAllCopiesAndRejectsBadKeepProb) {
  const int64_t n = 1000;
  const std::vector<float> x = RandomVector(n, 7);
  float *dx = Upload(x), *dy = Zeros(n), *dmask = Zeros(n);
  ASSERT_TRUE(dev_->Dropout(dx, dy, dmask, n, 1.0f, 1, 2).ok());
  EXPECT_ARRAYS_NEAR(Download(dy, n), x, 0, 0);
  EXPECT_ARRAYS_NEAR(Download(dmask, n), std::vector<float>(n, 1.0f), 0, 0);
  EXPECT_EQ(dev_->Dropout(dx, dy, dmask, n, 0.0f, 1, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->Dropout(dx, dy, dmask, n, 1.5f, 1, 2).code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(ElementwiseTest, SoftmaxCrossEntropyMatchesReferenceAndFiniteDifferences) {
  for (auto shape : {std::pair<int, int>{5, 10}, {1, 3}, {10000, 10}}) {
    const int batch = shape.first, classes = shape.second;  // not a structured binding: the lambda below captures
    SCOPED_TRACE(::testing::Message() << batch << "x" << classes);
    const int64_t n = int64_t{batch} * classes;
    std::vector<float> logits = RandomVector(n, 8, -3.0f, 3.0f), labels(batch);
    for (int i = 0; i < batch; ++i) labels[i] = static_cast<float>((i * 7 + 3) % classes);
    float *dl = Upload(logits), *dlab = Upload(labels), *dg = Zeros(n), *dloss = Zeros(1);
    ASSERT_TRUE(dev_->SoftmaxCrossEntropy(dl, dlab, batch, classes, dg, dloss).ok());
    std::vector<float> g_ref(n);
    const double loss_ref =
        reference::SoftmaxCrossEntropy(logits.data(), labels.data(), batch, classes, g_ref.data());
    const std::vector<float> g = Download(dg, n);
    EXPECT_NEAR(Download(dloss, 1)[0], loss_ref, 1e-5 * std::fabs(loss_ref) + 1e-6);
    EXPECT_ARRAYS_NEAR(g, g_ref, 1e-4, 1e-7);
    if (batch > 100) continue;  // the finite-difference check runs on the small cases
    float* probe = Zeros(n);
    GradCheckOptions opt;
    opt.step = 1e-2;
    opt.abs_tol = 1e-4;
    EXPECT_GRADIENT_OK(CheckGradient(
        logits, g,
        [&](const std::vector<float>& v) {
          Write(v, probe);
          EXPECT_TRUE(dev_->SoftmaxCrossEntropy(probe, dlab, batch, classes, dg, dloss).ok());
          return static_cast<double>(Download(dloss, 1)[0]);
        },
        opt));
  }
}

TEST_P(ElementwiseTest, SoftmaxCrossEntropyIsStableForHugeLogitsAndChecksLabels) {
  const std::vector<float> logits = {1000.0f, 999.0f, -1000.0f, 5000.0f, 0.0f, 4990.0f};
  float *dl = Upload(logits), *dg = Zeros(6), *dloss = Zeros(1);
  float* dlab = Upload({1.0f, 2.0f});
  ASSERT_TRUE(dev_->SoftmaxCrossEntropy(dl, dlab, 2, 3, dg, dloss).ok());
  std::vector<float> g_ref(6);
  const double loss_ref =
      reference::SoftmaxCrossEntropy(logits.data(), std::vector<float>{1, 2}.data(), 2, 3, g_ref.data());
  EXPECT_NEAR(Download(dloss, 1)[0], loss_ref, 1e-4);
  EXPECT_ARRAYS_NEAR(Download(dg, 6), g_ref, 1e-4, 1e-7);
  for (float bad : {3.0f, -1.0f, 0.5f, NAN}) {
    Write({0.0f, bad}, dlab);
    EXPECT_EQ(dev_->SoftmaxCrossEntropy(dl, dlab, 2, 3, dg, dloss).code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST_P(ElementwiseTest, L2LossAxpyScaleFillCopy) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> x = RandomVector(n, 9), y = RandomVector(n, 10);
    float *dx = Upload(x), *dy = Upload(y), *dout = Zeros(1);
    ASSERT_TRUE(dev_->L2Loss(dx, n, dout).ok());
    const double l2 = reference::L2Loss(x.data(), n);
    EXPECT_NEAR(Download(dout, 1)[0], l2, 1e-6 * l2);

    ASSERT_TRUE(dev_->Axpy(0.5f, dx, dy, n).ok());
    std::vector<float> expect(n);
    for (int64_t i = 0; i < n; ++i) expect[i] = y[i] + 0.5f * x[i];
    EXPECT_ARRAYS_NEAR(Download(dy, n), expect, 1e-6, 1e-7);

    ASSERT_TRUE(dev_->Scale(-2.0f, dx, dx, n).ok());
    for (int64_t i = 0; i < n; ++i) expect[i] = -2.0f * x[i];
    EXPECT_ARRAYS_NEAR(Download(dx, n), expect, 0, 0);

    ASSERT_TRUE(dev_->CopyOnDevice(dx, dy, n).ok());
    EXPECT_ARRAYS_NEAR(Download(dy, n), expect, 0, 0);

    ASSERT_TRUE(dev_->Fill(3.25f, dx, n).ok());
    EXPECT_ARRAYS_NEAR(Download(dx, n), std::vector<float>(n, 3.25f), 0, 0);
  }
}

TEST_P(ElementwiseTest, AllocIsAlignedAndValidated) {
  for (int64_t n : {1, 3, 1000}) {
    auto p = dev_->Alloc(n);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 64, 0u);
    dev_->Free(*p);
  }
  auto pinned = dev_->AllocHostPinned(17);
  ASSERT_TRUE(pinned.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*pinned) % 64, 0u);
  dev_->FreeHostPinned(*pinned);
  EXPECT_EQ(dev_->Alloc(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dev_->Synchronize().ok());
  EXPECT_EQ(dev_->name(), "cpu");
  EXPECT_EQ(dev_->spec().threads, GetParam());
}

TEST(CpuDeviceFactoryTest, RejectsBadSpecs) {
  EXPECT_EQ(CreateCpuDevice(DeviceSpec::Cpu(0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCpuDevice(DeviceSpec::Gpu(0)).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, ElementwiseTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
