#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

class DenseTest : public CpuDeviceTest {};

// ONNX Gemm's params on top of {batch, in, out}.
DenseParams Gemm(int batch, int in, int out, bool transposed, bool has_bias, float alpha, float beta) {
  DenseParams p{batch, in, out};
  p.weights_transposed = transposed, p.has_bias = has_bias, p.alpha = alpha, p.beta = beta;
  return p;
}

TEST_P(DenseTest, MatchesReferenceAndFiniteDifferences) {
  for (const DenseParams& p :
       {DenseParams{3, 7, 5}, DenseParams{4, 33, 17}, DenseParams{50, 64, 10}, DenseParams{1, 16, 1},
        Gemm(3, 7, 5, /*transposed=*/true, true, 1.0f, 1.0f), Gemm(4, 33, 17, true, false, 1.0f, 1.0f),
        Gemm(5, 9, 6, false, true, 0.5f, 1.0f), Gemm(5, 9, 6, false, true, 1.0f, -2.0f),
        Gemm(6, 11, 4, true, true, -1.5f, 0.25f), Gemm(2, 8, 3, false, false, 3.0f, 1.0f),
        Gemm(50, 64, 10, true, true, 2.0f, 0.5f)}) {
    SCOPED_TRACE(::testing::Message() << "batch=" << p.batch << " in=" << p.in << " out=" << p.out << " transposed="
                                      << p.weights_transposed << " has_bias=" << p.has_bias << " alpha=" << p.alpha
                                      << " beta=" << p.beta);
    const int64_t nx = int64_t{p.batch} * p.in, nw = int64_t{p.in} * p.out, ny = int64_t{p.batch} * p.out;
    auto op = dev_->MakeDense(p);
    ASSERT_TRUE(op.ok()) << op.status();
    const std::vector<float> x = RandomVector(nx, 1), w = RandomVector(nw, 2), b = RandomVector(p.out, 3);
    const std::vector<float> r = RandomVector(ny, 4);
    float *dx = Upload(x), *dw = Upload(w), *dy = Zeros(ny), *dr = Upload(r);
    float* db = p.has_bias ? Upload(b) : nullptr;  // without a bias, b and db are null
    float *dgx = Upload(RandomVector(nx, 5)), *dgw = Upload(RandomVector(nw, 6));
    float* dgb = p.has_bias ? Upload(RandomVector(p.out, 7)) : nullptr;
    ASSERT_TRUE((*op)->Forward(dx, dw, db, dy).ok());
    ASSERT_TRUE((*op)->BackwardData(dr, dw, dgx).ok());
    ASSERT_TRUE((*op)->BackwardWeights(dx, dr, dgw, dgb).ok());

    std::vector<float> y_ref(ny), gx_ref(nx), gw_ref(nw), gb_ref(p.out);
    reference::DenseForward(p, x.data(), w.data(), b.data(), y_ref.data());
    reference::DenseBackwardData(p, r.data(), w.data(), gx_ref.data());
    reference::DenseBackwardWeights(p, x.data(), r.data(), gw_ref.data(), gb_ref.data());
    const std::vector<float> gx = Download(dgx, nx), gw = Download(dgw, nw);
    EXPECT_ARRAYS_NEAR(Download(dy, ny), y_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(gx, gx_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(gw, gw_ref, 1e-4, 1e-4);

    auto loss = [&](float* x_dev, float* w_dev, float* b_dev) {
      EXPECT_TRUE((*op)->Forward(x_dev, w_dev, b_dev, dy).ok());
      return Dot(Download(dy, ny), r);
    };
    float* probe = Zeros(std::max({nx, nw, int64_t{p.out}}));
    EXPECT_GRADIENT_OK(CheckGradient(x, gx, [&](const std::vector<float>& v) {
      Write(v, probe);
      return loss(probe, dw, db);
    }));
    EXPECT_GRADIENT_OK(CheckGradient(w, gw, [&](const std::vector<float>& v) {
      Write(v, probe);
      return loss(dx, probe, db);
    }));
    if (p.has_bias) {
      const std::vector<float> gb = Download(dgb, p.out);
      EXPECT_ARRAYS_NEAR(gb, gb_ref, 1e-4, 1e-4);
      EXPECT_GRADIENT_OK(CheckGradient(b, gb, [&](const std::vector<float>& v) {
        Write(v, probe);
        return loss(dx, dw, probe);
      }));
    }
  }
}

TEST_P(DenseTest, TransposedWeightsAreTheTransposeOfTheUsualOnes) {
  const DenseParams usual{4, 6, 3};
  const DenseParams transposed = Gemm(4, 6, 3, true, true, 1.0f, 1.0f);
  const std::vector<float> x = RandomVector(24, 11), w = RandomVector(18, 12), b = RandomVector(3, 13);
  std::vector<float> wt(18);
  for (int i = 0; i < 6; ++i)
    for (int o = 0; o < 3; ++o) wt[o * 6 + i] = w[i * 3 + o];
  auto op1 = dev_->MakeDense(usual);
  auto op2 = dev_->MakeDense(transposed);
  ASSERT_TRUE(op1.ok() && op2.ok());
  float *dx = Upload(x), *db = Upload(b), *y1 = Zeros(12), *y2 = Zeros(12), *gw = Zeros(18), *gb = Zeros(3);
  ASSERT_TRUE((*op1)->Forward(dx, Upload(w), db, y1).ok());
  ASSERT_TRUE((*op2)->Forward(dx, Upload(wt), db, y2).ok());
  EXPECT_ARRAYS_NEAR(Download(y2, 12), Download(y1, 12), 1e-6, 1e-6);
  // dw in the transposed layout: [out, in].
  ASSERT_TRUE((*op2)->BackwardWeights(dx, y1, gw, gb).ok());
  const std::vector<float> g = Download(gw, 18);
  for (int i = 0; i < 6; ++i)
    for (int o = 0; o < 3; ++o) {
      double want = 0;
      for (int n = 0; n < 4; ++n) want += static_cast<double>(x[n * 6 + i]) * Download(y1, 12)[n * 3 + o];
      EXPECT_NEAR(g[o * 6 + i], want, 1e-4);
    }
}

TEST_P(DenseTest, RejectsBadParams) {
  EXPECT_EQ(dev_->MakeDense({0, 3, 4}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeDense({2, 3, -1}).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, DenseTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
