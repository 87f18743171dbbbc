// Checks the oracle itself: every reference backward against finite differences of the reference forward,
// plus a few hand-computed values, so that a bug shared by the reference and a backend cannot hide.
#include "kernels/reference_ops.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gradient_check.h"

namespace dtrain::kernels::reference {
namespace {

using ::dtrain::kernels::testing::CheckGradient;
using ::dtrain::kernels::testing::Dot;
using ::dtrain::kernels::testing::GradCheckOptions;
using ::dtrain::kernels::testing::RandomVector;

TEST(ReferenceOpsTest, ConvHandComputedSamePadding) {
  // 1x3x3x1 input 1..9, 3x3 all-ones filter, SAME: the centre sums everything, a corner sums 4 inputs.
  Conv2DParams p;
  p.batch = 1, p.in_h = 3, p.in_w = 3, p.in_c = 1, p.out_c = 1, p.k_h = 3, p.k_w = 3;
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, w(9, 1.0f), b = {0.5f}, y(9);
  Conv2DForward(p, x.data(), w.data(), b.data(), y.data());
  EXPECT_FLOAT_EQ(y[4], 45.5f);
  EXPECT_FLOAT_EQ(y[0], 1 + 2 + 4 + 5 + 0.5f);
  EXPECT_FLOAT_EQ(y[8], 5 + 6 + 8 + 9 + 0.5f);
}

TEST(ReferenceOpsTest, SamePaddingPutsTheExtraElementAfter) {
  // in=4, k=2, stride 2 SAME: no padding. in=5, k=3, stride 2: out 3, total pad 3*... = 2, before 1.
  EXPECT_EQ(PadBefore(4, 2, 2, Padding::kSame), 0);
  EXPECT_EQ(PadBefore(5, 3, 2, Padding::kSame), 1);
  EXPECT_EQ(PadBefore(6, 3, 2, Padding::kSame), 0);  // total 1: all of it after
  // Pool 2x2/2 SAME on a 1x3 row [1, 2, 3]: windows {1,2} and {3, pad} -> [2, 3].
  PoolParams p;
  p.batch = 1, p.in_h = 1, p.in_w = 3, p.channels = 1, p.window = 2, p.stride = 2;
  std::vector<float> x = {1, 2, 3}, y(p.out_h() * p.out_w());
  ASSERT_EQ(y.size(), 2u);
  MaxPoolForward(p, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{2, 3}));
}

TEST(ReferenceOpsTest, ConvBackwardByFiniteDifferences) {
  Conv2DParams p;
  p.batch = 2, p.in_h = 5, p.in_w = 6, p.in_c = 2, p.out_c = 3, p.k_h = 3, p.k_w = 3, p.stride_h = 2;
  p.stride_w = 1;
  const int64_t nx = 2 * 5 * 6 * 2, nw = 3 * 3 * 2 * 3, ny = int64_t{2} * p.out_h() * p.out_w() * 3;
  const std::vector<float> x = RandomVector(nx, 1), w = RandomVector(nw, 2), b = RandomVector(3, 3);
  const std::vector<float> r = RandomVector(ny, 4);
  std::vector<float> gx(nx), gw(nw), gb(3), y(ny);
  Conv2DBackwardData(p, r.data(), w.data(), gx.data());
  Conv2DBackwardWeights(p, x.data(), r.data(), gw.data(), gb.data());
  auto loss = [&](const std::vector<float>& xx, const std::vector<float>& ww, const std::vector<float>& bb) {
    Conv2DForward(p, xx.data(), ww.data(), bb.data(), y.data());
    return Dot(y, r);
  };
  EXPECT_EQ(CheckGradient(x, gx, [&](const std::vector<float>& v) { return loss(v, w, b); }).failed, 0);
  EXPECT_EQ(CheckGradient(w, gw, [&](const std::vector<float>& v) { return loss(x, v, b); }).failed, 0);
  EXPECT_EQ(CheckGradient(b, gb, [&](const std::vector<float>& v) { return loss(x, w, v); }).failed, 0);
}

TEST(ReferenceOpsTest, LrnBackwardByFiniteDifferences) {
  LrnParams p;
  p.batch = 1, p.h = 2, p.w = 2, p.channels = 9, p.depth_radius = 2, p.alpha = 0.3f, p.beta = 0.75f,
  p.bias = 1.5f;
  const int64_t n = 36;
  const std::vector<float> x = RandomVector(n, 5, -2, 2), r = RandomVector(n, 6);
  std::vector<float> gx(n), y(n);
  LrnBackward(p, x.data(), r.data(), gx.data());
  const auto result = CheckGradient(x, gx, [&](const std::vector<float>& v) {
    LrnForward(p, v.data(), y.data());
    return Dot(y, r);
  });
  EXPECT_EQ(result.failed, 0) << result.first_failure;
}

TEST(ReferenceOpsTest, DenseAndSoftmaxBackwardByFiniteDifferences) {
  DenseParams p{3, 4, 5};
  const std::vector<float> x = RandomVector(12, 7), w = RandomVector(20, 8), b = RandomVector(5, 9);
  const std::vector<float> r = RandomVector(15, 10);
  std::vector<float> gx(12), gw(20), gb(5), y(15);
  DenseBackwardData(p, r.data(), w.data(), gx.data());
  DenseBackwardWeights(p, x.data(), r.data(), gw.data(), gb.data());
  auto loss = [&](const std::vector<float>& xx, const std::vector<float>& ww, const std::vector<float>& bb) {
    DenseForward(p, xx.data(), ww.data(), bb.data(), y.data());
    return Dot(y, r);
  };
  EXPECT_EQ(CheckGradient(x, gx, [&](const std::vector<float>& v) { return loss(v, w, b); }).failed, 0);
  EXPECT_EQ(CheckGradient(w, gw, [&](const std::vector<float>& v) { return loss(x, v, b); }).failed, 0);
  EXPECT_EQ(CheckGradient(b, gb, [&](const std::vector<float>& v) { return loss(x, w, v); }).failed, 0);

  const std::vector<float> logits = RandomVector(12, 11, -2, 2), labels = {0, 3, 2};
  std::vector<float> g(12), scratch(12);
  SoftmaxCrossEntropy(logits.data(), labels.data(), 3, 4, g.data());
  GradCheckOptions opt;
  opt.abs_tol = 1e-5;
  const auto result = CheckGradient(
      logits, g,
      [&](const std::vector<float>& v) {
        return SoftmaxCrossEntropy(v.data(), labels.data(), 3, 4, scratch.data());
      },
      opt);
  EXPECT_EQ(result.failed, 0) << result.first_failure;
}

TEST(ReferenceOpsTest, SoftmaxLossOfUniformLogitsIsLogClasses) {
  const std::vector<float> logits(10, 0.25f), labels = {4};
  std::vector<float> g(10);
  EXPECT_NEAR(SoftmaxCrossEntropy(logits.data(), labels.data(), 1, 10, g.data()), std::log(10.0), 1e-12);
  EXPECT_NEAR(g[4], 0.1 - 1.0, 1e-7);
  EXPECT_NEAR(g[0], 0.1, 1e-7);
}

TEST(ReferenceOpsTest, MaxPoolBackwardRoutesToTheMaximum) {
  PoolParams p;
  p.batch = 1, p.in_h = 2, p.in_w = 2, p.channels = 1, p.window = 2, p.stride = 2;
  const std::vector<float> x = {1, 7, 3, 2}, dy = {5};
  std::vector<float> dx(4);
  MaxPoolBackward(p, x.data(), dy.data(), dx.data());
  EXPECT_EQ(dx, (std::vector<float>{0, 5, 0, 0}));
}

TEST(ReferenceOpsTest, GradientCheckCatchesAWrongGradient) {
  // The helper itself must fail on a wrong gradient (d/dx sum(x^2) is 2x, not x).
  const std::vector<float> x = RandomVector(10, 12, 0.5f, 1.0f);
  const auto loss = [](const std::vector<float>& v) { return Dot(v, v); };
  std::vector<float> right(10), wrong(10);
  for (int i = 0; i < 10; ++i) right[i] = 2 * x[i], wrong[i] = x[i];
  EXPECT_EQ(CheckGradient(x, right, loss).failed, 0);
  EXPECT_EQ(CheckGradient(x, wrong, loss).failed, 10);
}

}  // namespace
}  // namespace dtrain::kernels::reference
