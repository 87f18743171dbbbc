#include <omp.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

struct ConvCase {
  std::string name;
  Conv2DParams p;
};

Conv2DParams Conv(int batch, int h, int w, int c, int oc, int k_h, int k_w, int stride, Padding padding) {
  Conv2DParams p;
  p.batch = batch, p.in_h = h, p.in_w = w, p.in_c = c, p.out_c = oc, p.k_h = k_h, p.k_w = k_w;
  p.stride_h = p.stride_w = stride;
  p.padding = padding;
  return p;
}

// The ONNX / PyTorch params on top of Conv(): explicit pads (top, bottom, left, right), dilation, groups,
// layout, bias.
Conv2DParams Onnx(Conv2DParams p, std::vector<int> pads, int dilation_h, int dilation_w, int groups,
                  WeightLayout layout, bool has_bias) {
  if (!pads.empty()) {
    p.explicit_padding = true;
    p.pad_top = pads[0], p.pad_bottom = pads[1], p.pad_left = pads[2], p.pad_right = pads[3];
  }
  p.dilation_h = dilation_h, p.dilation_w = dilation_w, p.groups = groups;
  p.weight_layout = layout;
  p.has_bias = has_bias;
  return p;
}

constexpr WeightLayout kHWIO = WeightLayout::kHWIO, kOIHW = WeightLayout::kOIHW;

const std::vector<ConvCase>& Cases() {
  static const auto* cases = new std::vector<ConvCase>{
      {"same_5x5_s1_odd", Conv(2, 7, 9, 3, 4, 5, 5, 1, Padding::kSame)},
      {"same_3x3_s2_odd", Conv(2, 7, 9, 3, 4, 3, 3, 2, Padding::kSame)},
      {"same_5x5_s2_even", Conv(2, 8, 8, 2, 3, 5, 5, 2, Padding::kSame)},
      {"valid_3x3_s1", Conv(2, 7, 9, 3, 5, 3, 3, 1, Padding::kValid)},
      {"valid_5x5_s2", Conv(2, 9, 8, 2, 3, 5, 5, 2, Padding::kValid)},
      {"same_3x5_rect_kernel", Conv(1, 6, 7, 2, 3, 3, 5, 1, Padding::kSame)},
      {"in_c1_like_conv1", Conv(2, 12, 12, 1, 8, 5, 5, 1, Padding::kSame)},
      {"blocked_channels_16", Conv(2, 6, 5, 16, 32, 3, 3, 1, Padding::kSame)},
      // Imported graphs: explicit asymmetric pads, dilations, groups, OIHW filters, no bias.
      {"explicit_asym_pads_oihw", Onnx(Conv(2, 7, 8, 3, 4, 3, 3, 1, Padding::kValid), {2, 0, 1, 3}, 1, 1, 1, kOIHW, true)},
      {"explicit_pads_s2_hwio_nobias",
       Onnx(Conv(2, 9, 7, 2, 3, 3, 2, 2, Padding::kValid), {1, 1, 0, 1}, 1, 1, 1, kHWIO, false)},
      {"dilation2_same", Onnx(Conv(2, 9, 10, 3, 4, 3, 3, 1, Padding::kSame), {}, 2, 2, 1, kHWIO, true)},
      {"dilation2x3_explicit_s2_oihw",
       Onnx(Conv(1, 11, 12, 2, 3, 3, 3, 2, Padding::kValid), {2, 1, 3, 0}, 2, 3, 1, kOIHW, true)},
      {"groups2_hwio", Onnx(Conv(2, 6, 7, 4, 6, 3, 3, 1, Padding::kSame), {}, 1, 1, 2, kHWIO, true)},
      {"groups3_oihw_nobias", Onnx(Conv(2, 6, 5, 6, 9, 3, 1, 1, Padding::kValid), {1, 1, 0, 0}, 1, 1, 3, kOIHW, false)},
      {"depthwise_3x3_s2_oihw", Onnx(Conv(2, 9, 8, 8, 8, 3, 3, 2, Padding::kValid), {1, 1, 1, 1}, 1, 1, 8, kOIHW, true)},
      {"depthwise_5x5_same_hwio", Onnx(Conv(1, 7, 6, 5, 5, 5, 5, 1, Padding::kSame), {}, 1, 1, 5, kHWIO, true)},
      {"depthwise_dilation2_nobias", Onnx(Conv(2, 8, 8, 4, 4, 3, 3, 1, Padding::kValid), {2, 2, 2, 2}, 2, 2, 4, kOIHW, false)},
      {"winograd_shape_explicit_pads_oihw",
       Onnx(Conv(2, 6, 5, 16, 32, 3, 3, 1, Padding::kValid), {1, 1, 1, 1}, 1, 1, 1, kOIHW, true)},
      {"winograd_shape_asym_pads_nobias",
       Onnx(Conv(1, 6, 7, 16, 16, 3, 3, 1, Padding::kValid), {0, 2, 2, 0}, 1, 1, 1, kHWIO, false)},
      {"pointwise_1x1_s2_oihw", Onnx(Conv(2, 7, 7, 8, 12, 1, 1, 2, Padding::kValid), {}, 1, 1, 1, kOIHW, true)},
  };
  return *cases;
}

class ConvTest : public CpuDeviceTest {};

int64_t XSize(const Conv2DParams& p) { return int64_t{p.batch} * p.in_h * p.in_w * p.in_c; }
int64_t WSize(const Conv2DParams& p) { return p.weights_size(); }
int64_t YSize(const Conv2DParams& p) { return int64_t{p.batch} * p.out_h() * p.out_w() * p.out_c; }

TEST_P(ConvTest, ForwardAndBackwardMatchReferenceAndFiniteDifferences) {
  for (const ConvCase& c : Cases()) {
    SCOPED_TRACE(c.name);
    const Conv2DParams& p = c.p;
    auto op = dev_->MakeConv2D(p);
    ASSERT_TRUE(op.ok()) << op.status();
    const std::vector<float> x = RandomVector(XSize(p), 1), w = RandomVector(WSize(p), 2);
    const std::vector<float> b = RandomVector(p.out_c, 3), r = RandomVector(YSize(p), 4);
    float *dx = Upload(x), *dw = Upload(w), *dy = Zeros(YSize(p)), *dr = Upload(r);
    float* db = p.has_bias ? Upload(b) : nullptr;  // without a bias, b and db are null
    // Gradient buffers start with garbage: the ops must overwrite, not accumulate.
    float *dgx = Upload(RandomVector(XSize(p), 21)), *dgw = Upload(RandomVector(WSize(p), 22));
    float* dgb = p.has_bias ? Upload(RandomVector(p.out_c, 23)) : nullptr;

    ASSERT_TRUE((*op)->Forward(dx, dw, db, dy).ok());
    // dL/dy = r for L = sum(y * r).
    ASSERT_TRUE((*op)->BackwardData(dr, dw, dgx).ok());
    ASSERT_TRUE((*op)->BackwardWeights(dx, dr, dgw, dgb).ok());

    std::vector<float> y_ref(YSize(p)), gx_ref(XSize(p)), gw_ref(WSize(p)), gb_ref(p.out_c);
    reference::Conv2DForward(p, x.data(), w.data(), b.data(), y_ref.data());
    reference::Conv2DBackwardData(p, r.data(), w.data(), gx_ref.data());
    reference::Conv2DBackwardWeights(p, x.data(), r.data(), gw_ref.data(), gb_ref.data());
    const std::vector<float> gx = Download(dgx, XSize(p)), gw = Download(dgw, WSize(p));
    EXPECT_ARRAYS_NEAR(Download(dy, YSize(p)), y_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(gx, gx_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(gw, gw_ref, 1e-4, 1e-4);

    // Finite differences through the device's own forward (L is linear in each argument).
    auto loss = [&](float* x_dev, float* w_dev, float* b_dev) {
      EXPECT_TRUE((*op)->Forward(x_dev, w_dev, b_dev, dy).ok());
      return Dot(Download(dy, YSize(p)), r);
    };
    float* probe = Zeros(std::max({XSize(p), WSize(p), int64_t{p.out_c}}));
    EXPECT_GRADIENT_OK(CheckGradient(x, gx, [&](const std::vector<float>& v) {
      Write(v, probe);
      return loss(probe, dw, db);
    }));
    EXPECT_GRADIENT_OK(CheckGradient(w, gw, [&](const std::vector<float>& v) {
      Write(v, probe);
      return loss(dx, probe, db);
    }));
    if (p.has_bias) {
      const std::vector<float> gb = Download(dgb, p.out_c);
      EXPECT_ARRAYS_NEAR(gb, gb_ref, 1e-4, 1e-4);
      EXPECT_GRADIENT_OK(CheckGradient(b, gb, [&](const std::vector<float>& v) {
        Write(v, probe);
        return loss(dx, dw, probe);
      }));
    }
  }
}

TEST_P(ConvTest, LayoutsAgree) {
  // The same grouped filter in OIHW and HWIO gives the same output, and dw comes back in each one's layout.
  const Conv2DParams hwio = Onnx(Conv(2, 6, 7, 6, 4, 3, 2, 1, Padding::kSame), {}, 1, 1, 2, kHWIO, true);
  Conv2DParams oihw = hwio;
  oihw.weight_layout = kOIHW;
  const int icg = hwio.in_c / hwio.groups;
  const std::vector<float> w_hwio = RandomVector(WSize(hwio), 41);
  std::vector<float> w_oihw(WSize(hwio));
  for (int kh = 0; kh < hwio.k_h; ++kh)
    for (int kw = 0; kw < hwio.k_w; ++kw)
      for (int i = 0; i < icg; ++i)
        for (int o = 0; o < hwio.out_c; ++o)
          w_oihw[((int64_t{o} * icg + i) * hwio.k_h + kh) * hwio.k_w + kw] =
              w_hwio[((int64_t{kh} * hwio.k_w + kw) * icg + i) * hwio.out_c + o];
  const std::vector<float> x = RandomVector(XSize(hwio), 42), b = RandomVector(hwio.out_c, 43),
                           r = RandomVector(YSize(hwio), 44);
  auto op1 = dev_->MakeConv2D(hwio);
  auto op2 = dev_->MakeConv2D(oihw);
  ASSERT_TRUE(op1.ok() && op2.ok());
  float *dx = Upload(x), *db = Upload(b), *dr = Upload(r), *y1 = Zeros(YSize(hwio)), *y2 = Zeros(YSize(hwio));
  float *w1 = Upload(w_hwio), *w2 = Upload(w_oihw), *gw1 = Zeros(WSize(hwio)), *gw2 = Zeros(WSize(hwio));
  float* gb = Zeros(hwio.out_c);
  ASSERT_TRUE((*op1)->Forward(dx, w1, db, y1).ok());
  ASSERT_TRUE((*op2)->Forward(dx, w2, db, y2).ok());
  EXPECT_ARRAYS_NEAR(Download(y2, YSize(hwio)), Download(y1, YSize(hwio)), 1e-5, 1e-5);
  ASSERT_TRUE((*op1)->BackwardWeights(dx, dr, gw1, gb).ok());
  ASSERT_TRUE((*op2)->BackwardWeights(dx, dr, gw2, gb).ok());
  const std::vector<float> g1 = Download(gw1, WSize(hwio)), g2 = Download(gw2, WSize(hwio));
  for (int kh = 0; kh < hwio.k_h; ++kh)
    for (int kw = 0; kw < hwio.k_w; ++kw)
      for (int i = 0; i < icg; ++i)
        for (int o = 0; o < hwio.out_c; ++o)
          ASSERT_NEAR(g2[((int64_t{o} * icg + i) * hwio.k_h + kh) * hwio.k_w + kw],
                      g1[((int64_t{kh} * hwio.k_w + kw) * icg + i) * hwio.out_c + o], 1e-4);
}

TEST_P(ConvTest, BackwardDataFollowsTheLatestForwardFilter) {
  // The backend may reuse its reordered copy of w from Forward: a new filter must reach BackwardData.
  const Conv2DParams p = Conv(1, 5, 5, 16, 16, 3, 3, 1, Padding::kSame);
  auto op = dev_->MakeConv2D(p);
  ASSERT_TRUE(op.ok()) << op.status();
  const std::vector<float> x = RandomVector(XSize(p), 5), b = RandomVector(p.out_c, 6),
                           r = RandomVector(YSize(p), 7);
  float *dx = Upload(x), *db = Upload(b), *dy = Zeros(YSize(p)), *dr = Upload(r), *dgx = Zeros(XSize(p));
  for (uint64_t seed : {11, 12}) {
    const std::vector<float> w = RandomVector(WSize(p), seed);
    float* dw = Upload(w);
    ASSERT_TRUE((*op)->Forward(dx, dw, db, dy).ok());
    ASSERT_TRUE((*op)->BackwardData(dr, dw, dgx).ok());
    std::vector<float> gx_ref(XSize(p));
    reference::Conv2DBackwardData(p, r.data(), w.data(), gx_ref.data());
    EXPECT_ARRAYS_NEAR(Download(dgx, XSize(p)), gx_ref, 1e-4, 1e-4);
  }
}

// The convolutions of one Device share its transient arena (reordered weights live there for one call only):
// run as a graph runs them, every forward in order and then every backward in reverse order, each op still
// computes from its own inputs. Ops are made as the forwards go, so the arena grows between calls.
TEST_P(ConvTest, ConvsOfOneDeviceShareNoStateBetweenCalls) {
  const std::vector<ConvCase>& cases = Cases();
  struct Run {
    std::unique_ptr<Conv2D> op;
    std::vector<float> x, w, b, r;
    float *dx, *dw, *db, *dy, *dr, *dgx, *dgw, *dgb;
  };
  std::vector<Run> runs(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const Conv2DParams& p = cases[i].p;
    Run& u = runs[i];
    auto op = dev_->MakeConv2D(p);
    ASSERT_TRUE(op.ok()) << op.status();
    u.op = *std::move(op);
    u.x = RandomVector(XSize(p), 100 + i), u.w = RandomVector(WSize(p), 200 + i);
    u.b = RandomVector(p.out_c, 300 + i), u.r = RandomVector(YSize(p), 400 + i);
    u.dx = Upload(u.x), u.dw = Upload(u.w), u.dy = Zeros(YSize(p)), u.dr = Upload(u.r);
    u.db = p.has_bias ? Upload(u.b) : nullptr;
    u.dgx = Zeros(XSize(p)), u.dgw = Zeros(WSize(p));
    u.dgb = p.has_bias ? Zeros(p.out_c) : nullptr;
    ASSERT_TRUE(u.op->Forward(u.dx, u.dw, u.db, u.dy).ok());
  }
  for (size_t k = cases.size(); k-- > 0;) {
    Run& u = runs[k];
    ASSERT_TRUE(u.op->BackwardWeights(u.dx, u.dr, u.dgw, u.dgb).ok());
    ASSERT_TRUE(u.op->BackwardData(u.dr, u.dw, u.dgx).ok());
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    const Conv2DParams& p = cases[i].p;
    const Run& u = runs[i];
    std::vector<float> y_ref(YSize(p)), gx_ref(XSize(p)), gw_ref(WSize(p)), gb_ref(p.out_c);
    reference::Conv2DForward(p, u.x.data(), u.w.data(), u.b.data(), y_ref.data());
    reference::Conv2DBackwardData(p, u.r.data(), u.w.data(), gx_ref.data());
    reference::Conv2DBackwardWeights(p, u.x.data(), u.r.data(), gw_ref.data(), gb_ref.data());
    EXPECT_ARRAYS_NEAR(Download(u.dy, YSize(p)), y_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(Download(u.dgx, XSize(p)), gx_ref, 1e-4, 1e-4);
    EXPECT_ARRAYS_NEAR(Download(u.dgw, WSize(p)), gw_ref, 1e-4, 1e-4);
    if (p.has_bias) EXPECT_ARRAYS_NEAR(Download(u.dgb, p.out_c), gb_ref, 1e-4, 1e-4);
  }
}

TEST_P(ConvTest, RejectsBadParams) {
  Conv2DParams p = Conv(1, 5, 5, 1, 1, 3, 3, 1, Padding::kSame);
  p.out_c = 0;
  EXPECT_EQ(dev_->MakeConv2D(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Conv(1, 5, 5, 1, 1, 3, 3, 0, Padding::kSame);
  EXPECT_EQ(dev_->MakeConv2D(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Conv(1, 2, 2, 1, 1, 3, 3, 1, Padding::kValid);  // kernel larger than the input
  EXPECT_EQ(dev_->MakeConv2D(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Onnx(Conv(1, 4, 4, 3, 4, 3, 3, 1, Padding::kSame), {}, 1, 1, 2, kHWIO, true);  // 3 channels in 2 groups
  EXPECT_EQ(dev_->MakeConv2D(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Onnx(Conv(1, 4, 4, 2, 2, 3, 3, 1, Padding::kSame), {}, 0, 1, 1, kHWIO, true);  // dilation 0
  EXPECT_EQ(dev_->MakeConv2D(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Onnx(Conv(1, 4, 4, 2, 2, 3, 3, 1, Padding::kValid), {-1, 0, 0, 0}, 1, 1, 1, kHWIO, true);
  EXPECT_EQ(dev_->MakeConv2D(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = Onnx(Conv(1, 4, 4, 2, 2, 3, 3, 1, Padding::kValid), {}, 2, 2, 1, kHWIO, true);  // dilated 5x5 > 4x4
  EXPECT_EQ(dev_->MakeConv2D(p).status().code(), absl::StatusCode::kInvalidArgument);
}

// Two towers: two Devices with different thread counts used at the same time from two std::threads. Each op
// call sets its own thread's OpenMP count, and results match the reference.
TEST(ConvConcurrencyTest, TwoDevicesInTwoThreads) {
  const Conv2DParams p = Conv(4, 10, 10, 8, 16, 5, 5, 1, Padding::kSame);
  const std::vector<float> x = RandomVector(XSize(p), 31), w = RandomVector(WSize(p), 32);
  const std::vector<float> b = RandomVector(p.out_c, 33), r = RandomVector(YSize(p), 34);
  std::vector<float> y_ref(YSize(p)), gw_ref(WSize(p)), gb_ref(p.out_c);
  reference::Conv2DForward(p, x.data(), w.data(), b.data(), y_ref.data());
  reference::Conv2DBackwardWeights(p, x.data(), r.data(), gw_ref.data(), gb_ref.data());

  auto tower = [&](int threads, int* wrong, int* omp_threads_seen) {
    auto dev = CreateCpuDevice(DeviceSpec::Cpu(threads));
    ASSERT_TRUE(dev.ok());
    auto op = (*dev)->MakeConv2D(p);
    ASSERT_TRUE(op.ok()) << op.status();
    std::vector<float> y(YSize(p)), gw(WSize(p)), gb(p.out_c);
    for (int step = 0; step < 20; ++step) {
      ASSERT_TRUE((*op)->Forward(x.data(), w.data(), b.data(), y.data()).ok());
      *omp_threads_seen = omp_get_max_threads();
      ASSERT_TRUE((*op)->BackwardWeights(x.data(), r.data(), gw.data(), gb.data()).ok());
      *wrong += CompareArrays(y, y_ref, 1e-4, 1e-4).mismatches +
                CompareArrays(gw, gw_ref, 1e-4, 1e-4).mismatches +
                CompareArrays(gb, gb_ref, 1e-4, 1e-4).mismatches;
    }
  };
  int wrong1 = 0, wrong2 = 0, seen1 = 0, seen2 = 0;
  std::thread t1(tower, 1, &wrong1, &seen1), t2(tower, 2, &wrong2, &seen2);
  t1.join();
  t2.join();
  EXPECT_EQ(wrong1, 0);
  EXPECT_EQ(wrong2, 0);
  EXPECT_EQ(seen1, 1);
  EXPECT_EQ(seen2, 2);
}

INSTANTIATE_TEST_SUITE_P(Threads, ConvTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
