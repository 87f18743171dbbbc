// Checks the oracle for the generalized params and the ops of imported graphs: hand-computed values and each
// reference backward against finite differences of the reference forward (in double-accumulated loops), so
// that a bug shared by the reference and a backend cannot hide.
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gradient_check.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::reference {
namespace {

using ::dtrain::kernels::testing::CheckGradient;
using ::dtrain::kernels::testing::Dot;
using ::dtrain::kernels::testing::GradCheckOptions;
using ::dtrain::kernels::testing::RandomVector;

TEST(ReferenceGraphOpsTest, DilatedGroupedConvByHand) {
  // 1x1x5 input, two channels interleaved (NHWC): c0 = 1..5, c1 = 10..50. Depthwise 1x3 filter of ones,
  // dilation 2, VALID: out[0] = x[0] + x[2] + x[4] per channel. OIHW [2, 1, 1, 3].
  Conv2DParams p;
  p.batch = 1, p.in_h = 1, p.in_w = 5, p.in_c = 2, p.out_c = 2, p.k_h = 1, p.k_w = 3;
  p.padding = Padding::kValid, p.dilation_w = 2, p.groups = 2, p.weight_layout = WeightLayout::kOIHW;
  p.has_bias = false;
  ASSERT_EQ(p.out_w(), 1);
  const std::vector<float> x = {1, 10, 2, 20, 3, 30, 4, 40, 5, 50}, w = {1, 1, 1, 1, 1, -1};
  std::vector<float> y(2);
  Conv2DForward(p, x.data(), w.data(), nullptr, y.data());
  EXPECT_EQ(y, (std::vector<float>{1 + 3 + 5, 10 + 30 - 50}));
}

TEST(ReferenceGraphOpsTest, GeneralizedConvBackwardByFiniteDifferences) {
  Conv2DParams p;
  p.batch = 2, p.in_h = 6, p.in_w = 7, p.in_c = 4, p.out_c = 6, p.k_h = 3, p.k_w = 2, p.stride_h = 2;
  p.explicit_padding = true, p.pad_top = 2, p.pad_bottom = 0, p.pad_left = 1, p.pad_right = 1;
  p.dilation_h = 2, p.groups = 2, p.weight_layout = WeightLayout::kOIHW;
  const int64_t nx = 2 * 6 * 7 * 4, nw = p.weights_size(), ny = int64_t{2} * p.out_h() * p.out_w() * 6;
  const std::vector<float> x = RandomVector(nx, 1), w = RandomVector(nw, 2), b = RandomVector(6, 3);
  const std::vector<float> r = RandomVector(ny, 4);
  std::vector<float> gx(nx), gw(nw), gb(6), y(ny);
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

TEST(ReferenceGraphOpsTest, DenseGemmByHand) {
  // x [1, 2] = [1, 2]; w transposed [out=2, in=2] = [[1, 0], [3, 4]]; y = 2 x w^T + 0.5 b.
  DenseParams p{1, 2, 2};
  p.weights_transposed = true, p.alpha = 2.0f, p.beta = 0.5f;
  const std::vector<float> x = {1, 2}, w = {1, 0, 3, 4}, b = {10, 20};
  std::vector<float> y(2), dw(4), db(2);
  DenseForward(p, x.data(), w.data(), b.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{2 * 1 + 5, 2 * 11 + 10}));
  const std::vector<float> dy = {1, -1};
  DenseBackwardWeights(p, x.data(), dy.data(), dw.data(), db.data());
  EXPECT_EQ(dw, (std::vector<float>{2, 4, -2, -4}));  // [out, in]
  EXPECT_EQ(db, (std::vector<float>{0.5f, -0.5f}));
}

TEST(ReferenceGraphOpsTest, AvgPoolCeilModeDivisors) {
  // [1..5], window 2, stride 2, ceil_mode: the overhang never counts, padding included or not.
  PoolParams p;
  p.batch = 1, p.in_h = 1, p.in_w = 5, p.channels = 1, p.window_h = 1, p.window_w = 2, p.stride_h = 1;
  p.stride_w = 2, p.explicit_padding = true, p.ceil_mode = true;
  const std::vector<float> x = {1, 2, 3, 4, 5};
  for (bool include : {false, true}) {
    p.count_include_pad = include;
    std::vector<float> y(3);
    AvgPoolForward(p, x.data(), y.data());
    EXPECT_EQ(y, (std::vector<float>{1.5f, 3.5f, 5.0f}));
  }
  // With a left pad of 1: the pad counts only with count_include_pad.
  p.pad_left = 1;
  ASSERT_EQ(p.out_w(), 3);  // windows at -1, 1, 3
  std::vector<float> y(3);
  p.count_include_pad = true;
  AvgPoolForward(p, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{0.5f, 2.5f, 4.5f}));
  p.count_include_pad = false;
  AvgPoolForward(p, x.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{1.0f, 2.5f, 4.5f}));
}

TEST(ReferenceGraphOpsTest, BatchNormBackwardByFiniteDifferences) {
  BatchNormParams p;
  p.batch = 3, p.spatial = 4, p.channels = 3;
  const int64_t n = 36;
  const std::vector<float> x = RandomVector(n, 1, -1, 2), s = RandomVector(3, 2, 0.5f, 1.5f), b = RandomVector(3, 3);
  const std::vector<float> r = RandomVector(n, 4);
  std::vector<float> y(n), mean(3), var(3), gx(n), gs(3), gb(3);
  BatchNormForwardTraining(p, x.data(), s.data(), b.data(), y.data(), mean.data(), var.data());
  // Biased variance of channel 0.
  double m = 0, v = 0;
  for (int64_t i = 0; i < 12; ++i) m += x[i * 3];
  m /= 12;
  for (int64_t i = 0; i < 12; ++i) v += (x[i * 3] - m) * (x[i * 3] - m);
  EXPECT_NEAR(var[0], v / 12, 1e-6);
  BatchNormBackward(p, x.data(), r.data(), s.data(), mean.data(), var.data(), gx.data(), gs.data(), gb.data());
  std::vector<float> m2(3), v2(3);
  auto loss = [&](const std::vector<float>& xx, const std::vector<float>& ss, const std::vector<float>& bb) {
    BatchNormForwardTraining(p, xx.data(), ss.data(), bb.data(), y.data(), m2.data(), v2.data());
    return Dot(y, r);
  };
  GradCheckOptions opt;
  opt.step = 1e-3;
  EXPECT_EQ(CheckGradient(x, gx, [&](const std::vector<float>& v) { return loss(v, s, b); }, opt).failed, 0);
  EXPECT_EQ(CheckGradient(s, gs, [&](const std::vector<float>& v) { return loss(x, v, b); }, opt).failed, 0);
  EXPECT_EQ(CheckGradient(b, gb, [&](const std::vector<float>& v) { return loss(x, s, v); }, opt).failed, 0);
}

TEST(ReferenceGraphOpsTest, BinaryBackwardByFiniteDifferences) {
  // [4, 3] op [3] (a per-channel b) and a gap in a's storage.
  BroadcastParams p;
  p.rank = 2, p.dims[0] = 4, p.dims[1] = 3, p.a_strides[0] = 4, p.a_strides[1] = 1, p.b_strides[1] = 1;
  for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
    p.op = op;
    const std::vector<float> a = RandomVector(p.a_size(), 1), b = RandomVector(p.b_size(), 2, 0.5f, 1.5f);
    const std::vector<float> r = RandomVector(p.out_size(), 3);
    std::vector<float> ga(p.a_size()), gb(p.b_size()), y(p.out_size());
    BinaryBackward(p, a.data(), b.data(), r.data(), ga.data(), gb.data());
    EXPECT_EQ(ga[3], 0.0f);  // the gap: no output reads it
    auto loss = [&](const std::vector<float>& aa, const std::vector<float>& bb) {
      BinaryForward(p, aa.data(), bb.data(), y.data());
      return Dot(y, r);
    };
    EXPECT_EQ(CheckGradient(a, ga, [&](const std::vector<float>& v) { return loss(v, b); }).failed, 0);
    EXPECT_EQ(CheckGradient(b, gb, [&](const std::vector<float>& v) { return loss(a, v); }).failed, 0);
  }
}

TEST(ReferenceGraphOpsTest, GatherBagsByHand) {
  // Table rows r_k = [k, 10 k]; bags {0, 2}, {}, {1, 1, 3} with mean.
  GatherParams p;
  p.rows = 4, p.dim = 2, p.count = 5, p.num_bags = 3, p.mean = true;
  const std::vector<float> table = {0, 0, 1, 10, 2, 20, 3, 30};
  const std::vector<int32_t> indices = {0, 2, 1, 1, 3}, offsets = {0, 2, 2, 5};
  std::vector<float> y(6);
  Gather(p, table.data(), indices.data(), offsets.data(), y.data());
  EXPECT_EQ(y, (std::vector<float>{1, 10, 0, 0, 5.0f / 3, 50.0f / 3}));
  std::vector<float> dtable(8, 1.0f);
  const std::vector<float> dy = {2, 4, 7, 7, 3, 6};
  GatherBackward(p, dy.data(), indices.data(), offsets.data(), dtable.data());
  EXPECT_EQ(dtable, (std::vector<float>{2, 3, 3, 5, 2, 3, 2, 3}));  // added to the 1s
}

TEST(ReferenceGraphOpsTest, InteractionAndSigmoidCrossEntropyByFiniteDifferences) {
  const InteractionParams p{2, 4, 3};
  const std::vector<float> x = RandomVector(24, 1), r = RandomVector(2 * p.outputs(), 2);
  std::vector<float> gx(24), y(2 * p.outputs());
  InteractionBackward(p, x.data(), r.data(), gx.data());
  EXPECT_EQ(CheckGradient(x, gx, [&](const std::vector<float>& v) {
              Interaction(p, v.data(), y.data());
              return Dot(y, r);
            }).failed,
            0);

  const std::vector<float> z = RandomVector(6, 3, -4, 4), t = {0, 1, 1, 0, 1, 0};
  std::vector<float> g(6), scratch(6);
  SigmoidCrossEntropy(z.data(), t.data(), 6, g.data());
  GradCheckOptions opt;
  opt.abs_tol = 1e-6;
  EXPECT_EQ(CheckGradient(
                z, g, [&](const std::vector<float>& v) { return SigmoidCrossEntropy(v.data(), t.data(), 6, scratch.data()); },
                opt)
                .failed,
            0);
  // log(2) at z = 0, whatever the label.
  const std::vector<float> zero = {0, 0}, labels = {0, 1};
  EXPECT_NEAR(SigmoidCrossEntropy(zero.data(), labels.data(), 2, scratch.data()), std::log(2.0), 1e-12);
}

}  // namespace
}  // namespace dtrain::kernels::reference
