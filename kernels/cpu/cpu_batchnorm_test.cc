#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

class BatchNormTest : public CpuDeviceTest {};

BatchNormParams Bn(int batch, int64_t spatial, int channels, float epsilon = 1e-5f) {
  BatchNormParams p;
  p.batch = batch, p.spatial = spatial, p.channels = channels, p.epsilon = epsilon;
  return p;
}

TEST_P(BatchNormTest, MatchesReferenceAndFiniteDifferences) {
  const std::vector<std::pair<std::string, BatchNormParams>> cases = {
      {"2d_features", Bn(4, 1, 5)},
      {"nhwc_odd", Bn(2, 12, 3, 1e-3f)},
      {"nhwc_16_channels", Bn(3, 35, 16)},
      {"large", Bn(8, 49, 64)},
  };
  for (const auto& [name, p] : cases) {
    SCOPED_TRACE(name);
    const int64_t n = p.batch * p.spatial * p.channels;
    const int C = p.channels;
    auto op = dev_->MakeBatchNorm(p);
    ASSERT_TRUE(op.ok()) << op.status();
    // Inputs off zero and of unequal spread, so that the mean and variance matter.
    const std::vector<float> x = RandomVector(n, 1, 0.5f, 2.5f), scale = RandomVector(C, 2, 0.5f, 1.5f);
    const std::vector<float> bias = RandomVector(C, 3), r = RandomVector(n, 4);
    float *dx = Upload(x), *dscale = Upload(scale), *dbias = Upload(bias), *dy = Zeros(n), *dr = Upload(r);
    float *dmean = Upload(RandomVector(C, 5)), *dvar = Upload(RandomVector(C, 6));
    float *dgx = Upload(RandomVector(n, 7)), *dgs = Upload(RandomVector(C, 8)), *dgb = Upload(RandomVector(C, 9));
    ASSERT_TRUE((*op)->ForwardTraining(dx, dscale, dbias, dy, dmean, dvar).ok());
    { auto s_ = (*op)->Backward(dx, dr, dscale, dmean, dvar, dgx, dgs, dgb); ASSERT_TRUE(s_.ok()) << s_; }

    std::vector<float> y_ref(n), mean_ref(C), var_ref(C), gx_ref(n), gs_ref(C), gb_ref(C);
    reference::BatchNormForwardTraining(p, x.data(), scale.data(), bias.data(), y_ref.data(), mean_ref.data(),
                                        var_ref.data());
    reference::BatchNormBackward(p, x.data(), r.data(), scale.data(), mean_ref.data(), var_ref.data(),
                                 gx_ref.data(), gs_ref.data(), gb_ref.data());
    EXPECT_ARRAYS_NEAR(Download(dy, n), y_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(Download(dmean, C), mean_ref, 1e-5, 1e-6);
    EXPECT_ARRAYS_NEAR(Download(dvar, C), var_ref, 1e-4, 1e-6);  // biased: divided by batch * spatial
    const std::vector<float> gx = Download(dgx, n), gs = Download(dgs, C), gb = Download(dgb, C);
    EXPECT_ARRAYS_NEAR(gx, gx_ref, 1e-3, 1e-4);
    EXPECT_ARRAYS_NEAR(gs, gs_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(gb, gb_ref, 1e-4, 1e-4);

    // Inference with given statistics.
    const std::vector<float> mean = RandomVector(C, 10), var = RandomVector(C, 11, 0.2f, 2.0f);
    ASSERT_TRUE((*op)->ForwardInference(dx, dscale, dbias, Upload(mean), Upload(var), dy).ok());
    std::vector<float> yi_ref(n);
    reference::BatchNormForwardInference(p, x.data(), scale.data(), bias.data(), mean.data(), var.data(),
                                         yi_ref.data());
    EXPECT_ARRAYS_NEAR(Download(dy, n), yi_ref, 1e-4, 1e-4);

    // Finite differences of L = sum(y * r) through the device's training forward.
    float *probe = Zeros(n), *scratch_mean = Zeros(C), *scratch_var = Zeros(C);
    auto loss = [&](float* x_dev, float* s_dev, float* b_dev) {
      EXPECT_TRUE((*op)->ForwardTraining(x_dev, s_dev, b_dev, dy, scratch_mean, scratch_var).ok());
      return Dot(Download(dy, n), r);
    };
    GradCheckOptions opt;
    opt.step = 5e-3;
    EXPECT_GRADIENT_OK(CheckGradient(
        x, gx,
        [&](const std::vector<float>& v) {
          Write(v, probe);
          return loss(probe, dscale, dbias);
        },
        opt));
    EXPECT_GRADIENT_OK(CheckGradient(
        scale, gs,
        [&](const std::vector<float>& v) {
          Write(v, probe);
          return loss(dx, probe, dbias);
        },
        opt));
    EXPECT_GRADIENT_OK(CheckGradient(
        bias, gb,
        [&](const std::vector<float>& v) {
          Write(v, probe);
          return loss(dx, dscale, probe);
        },
        opt));
  }
}

TEST_P(BatchNormTest, RejectsBadParams) {
  EXPECT_EQ(dev_->MakeBatchNorm(Bn(0, 1, 3)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeBatchNorm(Bn(2, 0, 3)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeBatchNorm(Bn(2, 1, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeBatchNorm(Bn(2, 1, 3, -1.0f)).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, BatchNormTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
