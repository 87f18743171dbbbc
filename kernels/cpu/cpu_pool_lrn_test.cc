#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

PoolParams Pool(int batch, int h, int w, int c, int window, int stride, Padding padding) {
  PoolParams p;
  p.batch = batch, p.in_h = h, p.in_w = w, p.channels = c, p.window = window, p.stride = stride;
  p.padding = padding;
  return p;
}

// ONNX / PyTorch pooling: a rectangular window and stride, explicit pads (top, bottom, left, right), ceil_mode,
// count_include_pad.
PoolParams OnnxPool(int batch, int h, int w, int c, int kh, int kw, int sh, int sw, std::vector<int> pads,
                    bool ceil_mode, bool count_include_pad = false) {
  PoolParams p = Pool(batch, h, w, c, 0, 0, Padding::kValid);
  p.window_h = kh, p.window_w = kw, p.stride_h = sh, p.stride_w = sw;
  p.explicit_padding = true;
  p.pad_top = pads[0], p.pad_bottom = pads[1], p.pad_left = pads[2], p.pad_right = pads[3];
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  return p;
}

int64_t InSize(const PoolParams& p) { return int64_t{p.batch} * p.in_h * p.in_w * p.channels; }
int64_t OutSize(const PoolParams& p) { return int64_t{p.batch} * p.out_h() * p.out_w() * p.channels; }

// Distinct values at least 0.01 apart (a shuffled ramp), so no two inputs of a window tie and a finite
// difference step of 1e-3 never changes which input wins.
std::vector<float> DistinctValues(int64_t n, uint64_t seed, float offset) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = offset + 0.01f * static_cast<float>(i);
  std::shuffle(v.begin(), v.end(), std::mt19937_64(seed));
  return v;
}

class PoolTest : public CpuDeviceTest {};

TEST_P(PoolTest, MatchesReferenceAndFiniteDifferences) {
  const std::vector<std::pair<std::string, PoolParams>> cases = {
      {"2x2s2_same_even", Pool(2, 8, 8, 4, 2, 2, Padding::kSame)},
      {"2x2s2_same_odd", Pool(2, 7, 9, 3, 2, 2, Padding::kSame)},
      {"3x3s2_same_odd", Pool(2, 7, 9, 3, 3, 2, Padding::kSame)},
      {"3x3s2_same_even", Pool(1, 8, 6, 5, 3, 2, Padding::kSame)},
      {"3x3s2_valid", Pool(2, 9, 7, 3, 3, 2, Padding::kValid)},
      {"2x2s2_valid_odd", Pool(1, 7, 7, 16, 2, 2, Padding::kValid)},
      {"rect_3x2_s2x1_asym_pads", OnnxPool(2, 7, 6, 3, 3, 2, 2, 1, {1, 0, 0, 1}, false)},
      {"ceil_2x2s2_overhang", OnnxPool(2, 5, 7, 3, 2, 2, 2, 2, {0, 0, 0, 0}, true)},
      {"ceil_3x3s2_pads_overhang", OnnxPool(1, 8, 6, 4, 3, 3, 2, 2, {1, 1, 1, 0}, true)},
      {"ceil_overhang_past_pads", OnnxPool(1, 6, 6, 2, 3, 3, 2, 2, {1, 1, 1, 1}, true)},
      {"ceil_drops_window_in_pad", OnnxPool(1, 5, 5, 2, 2, 2, 2, 2, {1, 1, 1, 1}, true)},
      {"ceil_rect_s3x2", OnnxPool(2, 10, 9, 2, 2, 3, 3, 2, {0, 1, 2, 0}, true)},
  };
  for (const auto& [name, p] : cases) {
    SCOPED_TRACE(name);
    auto op = dev_->MakeMaxPool(p);
    ASSERT_TRUE(op.ok()) << op.status();
    const std::vector<float> x = DistinctValues(InSize(p), 1, -3.0f), r = RandomVector(OutSize(p), 2);
    float *dx = Upload(x), *dy = Zeros(OutSize(p)), *dr = Upload(r),
          *dgx = Upload(RandomVector(InSize(p), 3));
    ASSERT_TRUE((*op)->Forward(dx, dy).ok());
    ASSERT_TRUE((*op)->Backward(dr, dgx).ok());
    std::vector<float> y_ref(OutSize(p)), gx_ref(InSize(p));
    reference::MaxPoolForward(p, x.data(), y_ref.data());
    reference::MaxPoolBackward(p, x.data(), r.data(), gx_ref.data());
    const std::vector<float> gx = Download(dgx, InSize(p));
    EXPECT_ARRAYS_NEAR(Download(dy, OutSize(p)), y_ref, 0, 0);
    EXPECT_ARRAYS_NEAR(gx, gx_ref, 1e-6, 1e-6);

    float* probe = Zeros(InSize(p));
    const int64_t out_size = OutSize(p);  // a lambda cannot capture the structured binding p before C++20
    GradCheckOptions opt;
    opt.step = 1e-3;
    opt.max_coords = 64;
    EXPECT_GRADIENT_OK(CheckGradient(
        x, gx,
        [&](const std::vector<float>& v) {
          Write(v, probe);
          EXPECT_TRUE((*op)->Forward(probe, dy).ok());
          return Dot(Download(dy, out_size), r);
        },
        opt));
  }
}

TEST_P(PoolTest, PaddedPositionsNeverWin) {
  // All inputs negative: a padded position treated as 0 would win every border window.
  for (const PoolParams& p :
       {Pool(1, 7, 7, 3, 3, 2, Padding::kSame), Pool(2, 5, 9, 2, 2, 2, Padding::kSame),
        OnnxPool(1, 6, 7, 2, 3, 3, 2, 2, {2, 2, 1, 2}, true), OnnxPool(2, 5, 5, 3, 2, 2, 2, 2, {1, 0, 1, 0}, true)}) {
    auto op = dev_->MakeMaxPool(p);
    ASSERT_TRUE(op.ok()) << op.status();
    const std::vector<float> x = RandomVector(InSize(p), 9, -2.0f, -1.0f);
    float *dx = Upload(x), *dy = Zeros(OutSize(p));
    ASSERT_TRUE((*op)->Forward(dx, dy).ok());
    const std::vector<float> y = Download(dy, OutSize(p));
    for (float v : y) EXPECT_LT(v, -0.999f);
    std::vector<float> y_ref(OutSize(p));
    reference::MaxPoolForward(p, x.data(), y_ref.data());
    EXPECT_ARRAYS_NEAR(y, y_ref, 0, 0);
  }
}

TEST_P(PoolTest, RejectsBadParams) {
  EXPECT_EQ(dev_->MakeMaxPool(Pool(0, 4, 4, 1, 2, 2, Padding::kSame)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeMaxPool(Pool(1, 2, 2, 1, 3, 2, Padding::kValid)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A pad as large as the window would make windows of padding only.
  EXPECT_EQ(dev_->MakeMaxPool(OnnxPool(1, 4, 4, 1, 2, 2, 2, 2, {2, 0, 0, 0}, false)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeAvgPool(OnnxPool(1, 4, 4, 1, 2, 2, 2, 2, {0, 0, 0, -1}, false)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeAvgPool(Pool(1, 4, 4, 1, 2, 0, Padding::kSame)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(PoolTest, AvgPoolMatchesReferenceAndFiniteDifferences) {
  const std::vector<std::pair<std::string, PoolParams>> cases = {
      {"tf_same_3x3s2_odd", Pool(2, 7, 9, 3, 3, 2, Padding::kSame)},
      {"tf_valid_2x2s2", Pool(2, 8, 7, 4, 2, 2, Padding::kValid)},
      {"global_7x5", OnnxPool(2, 7, 5, 6, 7, 5, 1, 1, {0, 0, 0, 0}, false)},
      {"pads_exclude", OnnxPool(2, 7, 6, 3, 3, 3, 2, 2, {1, 1, 1, 1}, false, false)},
      {"pads_include", OnnxPool(2, 7, 6, 3, 3, 3, 2, 2, {1, 1, 1, 1}, false, true)},
      {"asym_rect_include", OnnxPool(1, 6, 9, 5, 2, 3, 1, 2, {1, 0, 0, 2}, false, true)},
      {"ceil_overhang_exclude", OnnxPool(2, 5, 7, 3, 2, 2, 2, 2, {0, 0, 0, 0}, true, false)},
      // The ceil_mode overhang never counts in the divisor: oneDNN cannot express these (the loop runs them).
      {"ceil_overhang_include", OnnxPool(2, 5, 7, 3, 2, 2, 2, 2, {0, 0, 0, 0}, true, true)},
      {"ceil_pads_overhang_include", OnnxPool(2, 8, 6, 4, 3, 3, 2, 2, {1, 1, 1, 0}, true, true)},
      {"ceil_rect_overhang_include", OnnxPool(1, 10, 9, 2, 2, 3, 3, 2, {0, 1, 2, 0}, true, true)},
      {"ceil_without_overhang_include", OnnxPool(1, 7, 7, 2, 3, 3, 2, 2, {1, 1, 1, 1}, true, true)},
      {"ceil_overhang_past_pads_include", OnnxPool(2, 6, 6, 2, 3, 3, 2, 2, {1, 1, 1, 1}, true, true)},
      {"ceil_drops_window_in_pad_include", OnnxPool(1, 5, 5, 2, 2, 2, 2, 2, {1, 1, 1, 1}, true, true)},
  };
  for (const auto& [name, p] : cases) {
    SCOPED_TRACE(name);
    auto op = dev_->MakeAvgPool(p);
    ASSERT_TRUE(op.ok()) << op.status();
    const std::vector<float> x = RandomVector(InSize(p), 1), r = RandomVector(OutSize(p), 2);
    float *dx = Upload(x), *dy = Zeros(OutSize(p)), *dr = Upload(r), *dgx = Upload(RandomVector(InSize(p), 3));
    ASSERT_TRUE((*op)->Forward(dx, dy).ok());
    ASSERT_TRUE((*op)->Backward(dr, dgx).ok());
    std::vector<float> y_ref(OutSize(p)), gx_ref(InSize(p));
    reference::AvgPoolForward(p, x.data(), y_ref.data());
    reference::AvgPoolBackward(p, r.data(), gx_ref.data());
    const std::vector<float> gx = Download(dgx, InSize(p));
    EXPECT_ARRAYS_NEAR(Download(dy, OutSize(p)), y_ref, 1e-5, 1e-6);
    EXPECT_ARRAYS_NEAR(gx, gx_ref, 1e-5, 1e-6);

    float* probe = Zeros(InSize(p));
    const int64_t out_size = OutSize(p);  // a lambda cannot capture the structured binding p before C++20
    EXPECT_GRADIENT_OK(CheckGradient(x, gx, [&](const std::vector<float>& v) {
      Write(v, probe);
      EXPECT_TRUE((*op)->Forward(probe, dy).ok());
      return Dot(Download(dy, out_size), r);
    }));
  }
}

TEST_P(PoolTest, AvgPoolDivisorsByHand) {
  // One row [1, 2, 3, 4, 5], window 2, stride 2, ceil_mode: windows {1,2}, {3,4}, {5, overhang}.
  // count_include_pad or not, the overhang never counts: the last output is 5 / 1.
  for (bool include : {false, true}) {
    const PoolParams p = OnnxPool(1, 1, 5, 1, 1, 2, 1, 2, {0, 0, 0, 0}, true, include);
    ASSERT_EQ(p.out_w(), 3);
    auto op = dev_->MakeAvgPool(p);
    ASSERT_TRUE(op.ok()) << op.status();
    float *dx = Upload({1, 2, 3, 4, 5}), *dy = Zeros(3);
    ASSERT_TRUE((*op)->Forward(dx, dy).ok());
    EXPECT_EQ(Download(dy, 3), (std::vector<float>{1.5f, 3.5f, 5.0f})) << include;
  }
  // Pad 1 on the left, window 3, stride 2, ceil_mode: [1, 2, 3, 4, 5] -> windows {pad,1,2}, {2,3,4},
  // {4,5,overhang}. count_include_pad: the left pad counts, the overhang does not.
  const PoolParams p = OnnxPool(1, 1, 5, 1, 1, 3, 1, 2, {0, 0, 1, 0}, true, true);
  ASSERT_EQ(p.out_w(), 3);
  auto op = dev_->MakeAvgPool(p);
  ASSERT_TRUE(op.ok()) << op.status();
  float *dx = Upload({1, 2, 3, 4, 5}), *dy = Zeros(3);
  ASSERT_TRUE((*op)->Forward(dx, dy).ok());
  const std::vector<float> y = Download(dy, 3);
  EXPECT_FLOAT_EQ(y[0], 1.0f);  // (0 + 1 + 2) / 3
  EXPECT_FLOAT_EQ(y[1], 3.0f);  // (2 + 3 + 4) / 3
  EXPECT_FLOAT_EQ(y[2], 4.5f);  // (4 + 5) / 2
}

class LrnTest : public CpuDeviceTest {};

LrnParams LrnP(int batch, int h, int w, int c, int radius, float bias, float alpha, float beta) {
  LrnParams p;
  p.batch = batch, p.h = h, p.w = w, p.channels = c, p.depth_radius = radius;
  p.bias = bias, p.alpha = alpha, p.beta = beta;
  return p;
}

TEST_P(LrnTest, MatchesReferenceAndFiniteDifferences) {
  const std::vector<std::pair<std::string, LrnParams>> cases = {
      {"tf_cifar_defaults", LrnP(2, 3, 4, 16, 4, 1.0f, 0.001f / 9.0f, 0.75f)},
      {"strong_alpha", LrnP(2, 3, 3, 7, 2, 1.0f, 0.2f, 0.75f)},
      {"bias2_beta_half", LrnP(1, 2, 5, 12, 3, 2.0f, 0.1f, 0.5f)},
      {"radius0", LrnP(1, 2, 2, 5, 0, 1.0f, 0.5f, 0.75f)},
  };
  for (const auto& [name, p] : cases) {
    SCOPED_TRACE(name);
    const int64_t n = int64_t{p.batch} * p.h * p.w * p.channels;
    auto op = dev_->MakeLrn(p);
    ASSERT_TRUE(op.ok()) << op.status();
    const std::vector<float> x = RandomVector(n, 1, -2.0f, 2.0f), r = RandomVector(n, 2);
    float *dx = Upload(x), *dy = Zeros(n), *dr = Upload(r), *dgx = Upload(RandomVector(n, 3));
    ASSERT_TRUE((*op)->Forward(dx, dy).ok());
    ASSERT_TRUE((*op)->Backward(dx, dy, dr, dgx).ok());
    std::vector<float> y_ref(n), gx_ref(n);
    reference::LrnForward(p, x.data(), y_ref.data());
    reference::LrnBackward(p, x.data(), r.data(), gx_ref.data());
    const std::vector<float> gx = Download(dgx, n);
    EXPECT_ARRAYS_NEAR(Download(dy, n), y_ref, 1e-4, 1e-5);
    EXPECT_ARRAYS_NEAR(gx, gx_ref, 1e-3, 1e-4);

    float* probe = Zeros(n);
    GradCheckOptions opt;
    opt.step = 5e-3;
    EXPECT_GRADIENT_OK(CheckGradient(
        x, gx,
        [&](const std::vector<float>& v) {
          Write(v, probe);
          EXPECT_TRUE((*op)->Forward(probe, dy).ok());
          return Dot(Download(dy, n), r);
        },
        opt));
  }
}

TEST_P(LrnTest, RejectsBadParams) {
  EXPECT_EQ(dev_->MakeLrn(LrnP(1, 2, 2, 0, 2, 1, 0.1f, 0.75f)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeLrn(LrnP(1, 2, 2, 4, -1, 1, 0.1f, 0.75f)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dev_->MakeLrn(LrnP(1, 2, 2, 4, 2, 0, 0.1f, 0.75f)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, PoolTest, ::testing::Values(1, 2));
INSTANTIATE_TEST_SUITE_P(Threads, LrnTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
