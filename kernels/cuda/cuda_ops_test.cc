// The CUDA backend against the CPU backend (the oracle): every op runs on both devices with the same random
// inputs and the results are compared (the ops of imported graphs and sparse models: cuda_imported_ops_test).
// Every test skips without a usable CUDA device (the binary then exits 77).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {
namespace {

struct ConvCase {
  int batch, in_h, in_w, in_c, out_c, k_h, k_w, stride_h, stride_w;
  Padding padding;
};

class CudaConvTest : public CudaVsCpuTest, public ::testing::WithParamInterface<ConvCase> {};

TEST_P(CudaConvTest, ForwardAndBackwardMatchCpu) {
  const ConvCase& c = GetParam();
  Conv2DParams p{c.batch, c.in_h, c.in_w, c.in_c, c.out_c, c.k_h, c.k_w, c.stride_h, c.stride_w, c.padding};
  auto cpu_conv = cpu_->MakeConv2D(p);
  auto gpu_conv = gpu_->MakeConv2D(p);
  ASSERT_TRUE(cpu_conv.ok()) << cpu_conv.status();
  ASSERT_TRUE(gpu_conv.ok()) << gpu_conv.status();
  const int64_t nx = int64_t{p.batch} * p.in_h * p.in_w * p.in_c;
  const int64_t ny = int64_t{p.batch} * p.out_h() * p.out_w() * p.out_c;
  const int64_t nw = int64_t{p.k_h} * p.k_w * p.in_c * p.out_c;
  Both x = Upload(Random(nx, 1)), w = Upload(Random(nw, 2)), b = Upload(Random(p.out_c, 3));
  Both dy = Upload(Random(ny, 4)), y = Zeros(ny), dx = Zeros(nx), dw = Zeros(nw), db = Zeros(p.out_c);

  ASSERT_TRUE((*cpu_conv)->Forward(x.cpu, w.cpu, b.cpu, y.cpu).ok());
  ASSERT_TRUE((*gpu_conv)->Forward(x.gpu, w.gpu, b.gpu, y.gpu).ok());
  EXPECT_TRUE(Same(y)) << "y";
  ASSERT_TRUE((*cpu_conv)->BackwardData(dy.cpu, w.cpu, dx.cpu).ok());
  ASSERT_TRUE((*gpu_conv)->BackwardData(dy.gpu, w.gpu, dx.gpu).ok());
  EXPECT_TRUE(Same(dx)) << "dx";
  ASSERT_TRUE((*cpu_conv)->BackwardWeights(x.cpu, dy.cpu, dw.cpu, db.cpu).ok());
  ASSERT_TRUE((*gpu_conv)->BackwardWeights(x.gpu, dy.gpu, dw.gpu, db.gpu).ok());
  EXPECT_TRUE(Same(dw)) << "dw";
  EXPECT_TRUE(Same(db)) << "db";

  // A second step with new data reuses the op (cached algorithms, workspace, reordered filter).
  Both x2 = Upload(Random(nx, 5)), w2 = Upload(Random(nw, 6));
  ASSERT_TRUE((*cpu_conv)->Forward(x2.cpu, w2.cpu, b.cpu, y.cpu).ok());
  ASSERT_TRUE((*gpu_conv)->Forward(x2.gpu, w2.gpu, b.gpu, y.gpu).ok());
  EXPECT_TRUE(Same(y)) << "y, second step";
  ASSERT_TRUE((*cpu_conv)->BackwardData(dy.cpu, w2.cpu, dx.cpu).ok());
  ASSERT_TRUE((*gpu_conv)->BackwardData(dy.gpu, w2.gpu, dx.gpu).ok());
  EXPECT_TRUE(Same(dx)) << "dx, second step";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaConvTest,
    ::testing::Values(ConvCase{2, 8, 8, 3, 4, 5, 5, 1, 1, Padding::kSame},    // symmetric SAME: cuDNN pads
                      ConvCase{2, 8, 8, 3, 5, 3, 3, 2, 2, Padding::kSame},    // odd total padding: explicit pad
                      ConvCase{3, 7, 6, 2, 3, 2, 2, 1, 1, Padding::kSame},    // even kernel: pad only after
                      ConvCase{2, 9, 7, 4, 6, 3, 5, 1, 2, Padding::kSame},    // mixed per dimension
                      ConvCase{2, 9, 9, 3, 4, 3, 3, 2, 2, Padding::kValid},
                      ConvCase{4, 28, 28, 1, 32, 5, 5, 1, 1, Padding::kSame}));  // MNIST conv1

struct PoolCase {
  int batch, in_h, in_w, channels, window, stride;
  Padding padding;
};

class CudaPoolTest : public CudaVsCpuTest, public ::testing::WithParamInterface<PoolCase> {};

TEST_P(CudaPoolTest, ForwardAndBackwardMatchCpu) {
  const PoolCase& c = GetParam();
  PoolParams p{c.batch, c.in_h, c.in_w, c.channels, c.window, c.stride, c.padding};
  auto cpu_pool = cpu_->MakeMaxPool(p);
  auto gpu_pool = gpu_->MakeMaxPool(p);
  ASSERT_TRUE(cpu_pool.ok()) << cpu_pool.status();
  ASSERT_TRUE(gpu_pool.ok()) << gpu_pool.status();
  const int64_t nx = int64_t{p.batch} * p.in_h * p.in_w * p.channels;
  const int64_t ny = int64_t{p.batch} * p.out_h() * p.out_w() * p.channels;
  // Negative inputs make a padded zero win if padding were (wrongly) counted.
  Both x = Upload(Random(nx, 7, -2.0f, -0.1f)), dy = Upload(Random(ny, 8)), y = Zeros(ny), dx = Zeros(nx);
  ASSERT_TRUE((*cpu_pool)->Forward(x.cpu, y.cpu).ok());
  ASSERT_TRUE((*gpu_pool)->Forward(x.gpu, y.gpu).ok());
  EXPECT_EQ(Gpu(y), Cpu(y)) << "max pooling picks existing values: results must be identical";
  ASSERT_TRUE((*cpu_pool)->Backward(dy.cpu, dx.cpu).ok());
  ASSERT_TRUE((*gpu_pool)->Backward(dy.gpu, dx.gpu).ok());
  EXPECT_TRUE(Same(dx, 1e-5f, 1e-6f)) << "dx";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaPoolTest,
                         ::testing::Values(PoolCase{2, 8, 8, 3, 2, 2, Padding::kSame},
                                           PoolCase{2, 7, 7, 4, 2, 2, Padding::kSame},   // pad after only
                                           PoolCase{2, 8, 9, 5, 3, 2, Padding::kSame},   // overlapping windows
                                           PoolCase{2, 9, 9, 3, 3, 2, Padding::kValid},
                                           PoolCase{3, 24, 24, 64, 3, 2, Padding::kSame}));

// ---- the generalized params (ONNX / PyTorch models): explicit and asymmetric pads, dilations, groups, OIHW
// filters, no bias; rectangular pooling windows, ceil_mode; transposed dense weights, alpha, beta ----

struct GeneralConvCase {
  const char* name;
  Conv2DParams p;
};

// Makes an explicitly padded convolution; the remaining fields keep their defaults until the caller sets them.
Conv2DParams ExplicitConv(int batch, int in_h, int in_w, int in_c, int out_c, int k_h, int k_w, int stride,
                          int top, int bottom, int left, int right) {
  Conv2DParams p{batch, in_h, in_w, in_c, out_c, k_h, k_w, stride, stride, Padding::kValid};
  p.explicit_padding = true;
  p.pad_top = top;
  p.pad_bottom = bottom;
  p.pad_left = left;
  p.pad_right = right;
  return p;
}

std::vector<GeneralConvCase> GeneralConvCases() {
  std::vector<GeneralConvCase> cases;
  auto add = [&](const char* name, Conv2DParams p) { cases.push_back({name, p}); };
  Conv2DParams p = ExplicitConv(2, 8, 8, 3, 4, 3, 3, 1, 1, 1, 1, 1);
  p.weight_layout = WeightLayout::kOIHW;
  add("OihwSymmetricPads", p);                                    // cuDNN pads
  p = ExplicitConv(2, 9, 7, 4, 6, 3, 2, 2, 0, 2, 1, 0);
  p.weight_layout = WeightLayout::kOIHW;
  add("OihwAsymmetricPads", p);                                   // explicit pad scratch
  p = ExplicitConv(2, 5, 5, 2, 3, 3, 3, 2, 1, 2, 1, 2);
  add("AsymmetricPadsCuDnnCanStillPad", p);                       // (1,2) with stride 2: same windows as (1,1)
  p = ExplicitConv(2, 10, 9, 3, 5, 3, 3, 1, 2, 2, 2, 2);
  p.dilation_h = p.dilation_w = 2;
  add("Dilated", p);
  p = ExplicitConv(2, 11, 10, 2, 4, 3, 2, 2, 1, 0, 0, 1);
  p.dilation_h = 2;
  p.weight_layout = WeightLayout::kOIHW;
  add("DilatedStridedAsymmetric", p);
  p = ExplicitConv(2, 8, 8, 6, 4, 3, 3, 1, 1, 1, 1, 1);
  p.groups = 2;
  add("GroupsHwio", p);
  p.weight_layout = WeightLayout::kOIHW;
  add("GroupsOihw", p);
  p = ExplicitConv(2, 9, 9, 8, 8, 3, 3, 2, 1, 1, 1, 1);
  p.groups = 8;
  p.weight_layout = WeightLayout::kOIHW;
  add("DepthwiseOihw", p);                                        // OIHW with one channel per group: no reorder
  p.weight_layout = WeightLayout::kHWIO;
  add("DepthwiseHwio", p);
  p = ExplicitConv(2, 6, 6, 5, 7, 1, 1, 1, 0, 0, 0, 0);
  p.weight_layout = WeightLayout::kOIHW;
  add("Pointwise1x1Oihw", p);                                     // no reorder
  p = Conv2DParams{2, 8, 8, 3, 4, 3, 3, 2, 2, Padding::kSame};
  p.has_bias = false;
  add("NoBiasSame", p);
  p = Conv2DParams{3, 7, 7, 4, 1, 3, 3, 1, 1, Padding::kSame};
  add("OneOutputChannelHwio", p);                                 // HWIO with out_c 1: no reorder
  p = Conv2DParams{2, 9, 9, 4, 6, 3, 3, 2, 2, Padding::kSame};
  p.dilation_h = p.dilation_w = 2;
  p.groups = 2;
  p.weight_layout = WeightLayout::kOIHW;
  p.has_bias = false;
  add("SameDilatedGroupedNoBias", p);
  return cases;
}

class CudaGeneralConvTest : public CudaVsCpuTest, public ::testing::WithParamInterface<GeneralConvCase> {};

TEST_P(CudaGeneralConvTest, ForwardAndBackwardMatchCpu) {
  const Conv2DParams& p = GetParam().p;
  auto cpu_conv = cpu_->MakeConv2D(p);
  auto gpu_conv = gpu_->MakeConv2D(p);
  ASSERT_TRUE(cpu_conv.ok()) << cpu_conv.status();
  ASSERT_TRUE(gpu_conv.ok()) << gpu_conv.status();
  const int64_t nx = int64_t{p.batch} * p.in_h * p.in_w * p.in_c;
  const int64_t ny = int64_t{p.batch} * p.out_h() * p.out_w() * p.out_c;
  const int64_t nw = p.weights_size();
  Both x = Upload(Random(nx, 41)), w = Upload(Random(nw, 42)), b = Upload(Random(p.out_c, 43));
  Both dy = Upload(Random(ny, 44)), y = Zeros(ny), dx = Zeros(nx), dw = Zeros(nw), db = Zeros(p.out_c);
  const float* cb = p.has_bias ? b.cpu : nullptr;
  const float* gb = p.has_bias ? b.gpu : nullptr;
  float* cdb = p.has_bias ? db.cpu : nullptr;
  float* gdb = p.has_bias ? db.gpu : nullptr;
  for (int step = 0; step < 2; ++step) {  // the second step reuses the op with new data
    SCOPED_TRACE(::testing::Message() << "step " << step);
    if (step == 1) {
      x = Upload(Random(nx, 45));
      w = Upload(Random(nw, 46));
    }
    ASSERT_TRUE((*cpu_conv)->Forward(x.cpu, w.cpu, cb, y.cpu).ok());
    ASSERT_TRUE((*gpu_conv)->Forward(x.gpu, w.gpu, gb, y.gpu).ok());
    EXPECT_TRUE(Same(y)) << "y";
    ASSERT_TRUE((*cpu_conv)->BackwardData(dy.cpu, w.cpu, dx.cpu).ok());
    ASSERT_TRUE((*gpu_conv)->BackwardData(dy.gpu, w.gpu, dx.gpu).ok());
    EXPECT_TRUE(Same(dx)) << "dx";
    ASSERT_TRUE((*cpu_conv)->BackwardWeights(x.cpu, dy.cpu, dw.cpu, cdb).ok());
    ASSERT_TRUE((*gpu_conv)->BackwardWeights(x.gpu, dy.gpu, dw.gpu, gdb).ok());
    EXPECT_TRUE(Same(dw)) << "dw";
    if (p.has_bias) {
      EXPECT_TRUE(Same(db)) << "db";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Params, CudaGeneralConvTest, ::testing::ValuesIn(GeneralConvCases()),
                         [](const ::testing::TestParamInfo<GeneralConvCase>& info) { return info.param.name; });

PoolParams ExplicitPool(int batch, int h, int w, int c, int kh, int kw, int sh, int sw, int top, int bottom,
                        int left, int right, bool ceil_mode) {
  PoolParams p{batch, h, w, c, 2, 2, Padding::kValid};
  p.window_h = kh;
  p.window_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.explicit_padding = true;
  p.pad_top = top;
  p.pad_bottom = bottom;
  p.pad_left = left;
  p.pad_right = right;
  p.ceil_mode = ceil_mode;
  return p;
}

TEST_F(CudaVsCpuTest, GeneralizedMaxPoolMatchesCpu) {
  for (const PoolParams& p : {ExplicitPool(2, 7, 6, 3, 3, 2, 2, 1, 1, 1, 0, 1, false),   // rectangular, asymmetric
                              ExplicitPool(2, 6, 6, 4, 3, 3, 2, 2, 0, 0, 0, 0, true),    // ceil_mode overhang
                              ExplicitPool(1, 8, 7, 2, 3, 3, 2, 2, 1, 1, 1, 1, true),    // PyTorch pad 1, ceil
                              ExplicitPool(2, 9, 5, 3, 2, 3, 3, 2, 0, 1, 1, 0, false),
                              ExplicitPool(2, 5, 5, 3, 5, 5, 1, 1, 0, 0, 0, 0, false)}) {  // global
    SCOPED_TRACE(::testing::Message() << "in " << p.in_h << "x" << p.in_w << " window " << p.kh() << "x" << p.kw()
                                      << " stride " << p.sh() << "x" << p.sw() << " ceil " << p.ceil_mode);
    auto cpu_pool = cpu_->MakeMaxPool(p);
    auto gpu_pool = gpu_->MakeMaxPool(p);
    ASSERT_TRUE(cpu_pool.ok()) << cpu_pool.status();
    ASSERT_TRUE(gpu_pool.ok()) << gpu_pool.status();
    const int64_t nx = int64_t{p.batch} * p.in_h * p.in_w * p.channels;
    const int64_t ny = int64_t{p.batch} * p.out_h() * p.out_w() * p.channels;
    // Negative inputs: a padded zero would win if padding counted.
    Both x = Upload(Random(nx, 47, -2.0f, -0.1f)), dy = Upload(Random(ny, 48)), y = Zeros(ny), dx = Zeros(nx);
    ASSERT_TRUE((*cpu_pool)->Forward(x.cpu, y.cpu).ok());
    ASSERT_TRUE((*gpu_pool)->Forward(x.gpu, y.gpu).ok());
    EXPECT_EQ(Gpu(y), Cpu(y)) << "max pooling picks existing values: results must be identical";
    ASSERT_TRUE((*cpu_pool)->Backward(dy.cpu, dx.cpu).ok());
    ASSERT_TRUE((*gpu_pool)->Backward(dy.gpu, dx.gpu).ok());
    EXPECT_TRUE(Same(dx, 1e-5f, 1e-6f)) << "dx";
  }
}

TEST_F(CudaVsCpuTest, GeneralizedDenseMatchesCpu) {
  std::vector<DenseParams> cases;
  for (bool transposed : {false, true}) {
    for (bool bias : {true, false}) {
      cases.push_back({7, 13, 5, transposed, bias, 1.0f, 1.0f});
      cases.push_back({32, 300, 65, transposed, bias, 0.5f, -2.0f});
    }
  }
  for (const DenseParams& p : cases) {
    SCOPED_TRACE(::testing::Message() << p.batch << "x" << p.in << "->" << p.out << " transposed "
                                      << p.weights_transposed << " bias " << p.has_bias << " alpha " << p.alpha
                                      << " beta " << p.beta);
    auto cpu_dense = cpu_->MakeDense(p);
    auto gpu_dense = gpu_->MakeDense(p);
    ASSERT_TRUE(cpu_dense.ok()) << cpu_dense.status();
    ASSERT_TRUE(gpu_dense.ok()) << gpu_dense.status();
    const int64_t nx = int64_t{p.batch} * p.in, ny = int64_t{p.batch} * p.out, nw = int64_t{p.in} * p.out;
    Both x = Upload(Random(nx, 49)), w = Upload(Random(nw, 50)), b = Upload(Random(p.out, 51));
    Both dy = Upload(Random(ny, 52)), y = Zeros(ny), dx = Zeros(nx), dw = Zeros(nw), db = Zeros(p.out);
    ASSERT_TRUE((*cpu_dense)->Forward(x.cpu, w.cpu, p.has_bias ? b.cpu : nullptr, y.cpu).ok());
    ASSERT_TRUE((*gpu_dense)->Forward(x.gpu, w.gpu, p.has_bias ? b.gpu : nullptr, y.gpu).ok());
    EXPECT_TRUE(Same(y)) << "y";
    ASSERT_TRUE((*cpu_dense)->BackwardData(dy.cpu, w.cpu, dx.cpu).ok());
    ASSERT_TRUE((*gpu_dense)->BackwardData(dy.gpu, w.gpu, dx.gpu).ok());
    EXPECT_TRUE(Same(dx)) << "dx";
    ASSERT_TRUE((*cpu_dense)->BackwardWeights(x.cpu, dy.cpu, dw.cpu, p.has_bias ? db.cpu : nullptr).ok());
    ASSERT_TRUE((*gpu_dense)->BackwardWeights(x.gpu, dy.gpu, dw.gpu, p.has_bias ? db.gpu : nullptr).ok());
    EXPECT_TRUE(Same(dw)) << "dw";
    if (p.has_bias) {
      EXPECT_TRUE(Same(db)) << "db";
    }
  }
}

TEST_F(CudaVsCpuTest, GeneralizedBadParamsAreInvalidArgument) {
  Conv2DParams groups{1, 4, 4, 3, 4, 3, 3, 1, 1, Padding::kSame};
  groups.groups = 2;  // 3 input channels do not split in 2 groups
  EXPECT_EQ(gpu_->MakeConv2D(groups).status().code(), absl::StatusCode::kInvalidArgument);
  Conv2DParams dilation{1, 4, 4, 2, 2, 3, 3, 1, 1, Padding::kSame};
  dilation.dilation_w = 0;
  EXPECT_EQ(gpu_->MakeConv2D(dilation).status().code(), absl::StatusCode::kInvalidArgument);
  Conv2DParams pads = ExplicitConv(1, 4, 4, 1, 1, 3, 3, 1, -1, 0, 0, 0);
  EXPECT_EQ(gpu_->MakeConv2D(pads).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->MakeMaxPool(ExplicitPool(1, 4, 4, 1, 2, 2, 2, 2, 0, -1, 0, 0, false)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->MakeAvgPool(ExplicitPool(1, 4, 4, 1, 6, 2, 2, 2, 0, 0, 0, 0, false)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaVsCpuTest, LrnMatchesCpu) {
  for (const LrnParams& p : {LrnParams{2, 4, 5, 16, 4, 1.0f, 0.001f / 9.0f, 0.75f},
                             LrnParams{2, 3, 3, 7, 2, 2.0f, 0.1f, 0.5f},      // strong normalization
                             LrnParams{1, 2, 2, 3, 5, 1.0f, 0.05f, 0.75f}}) {  // window wider than channels
    SCOPED_TRACE(::testing::Message() << "channels=" << p.channels << " radius=" << p.depth_radius);
    auto cpu_lrn = cpu_->MakeLrn(p);
    auto gpu_lrn = gpu_->MakeLrn(p);
    ASSERT_TRUE(cpu_lrn.ok()) << cpu_lrn.status();
    ASSERT_TRUE(gpu_lrn.ok()) << gpu_lrn.status();
    const int64_t n = int64_t{p.batch} * p.h * p.w * p.channels;
    Both x = Upload(Random(n, 9, -3.0f, 3.0f)), dy = Upload(Random(n, 10)), y = Zeros(n), dx = Zeros(n);
    ASSERT_TRUE((*cpu_lrn)->Forward(x.cpu, y.cpu).ok());
    ASSERT_TRUE((*gpu_lrn)->Forward(x.gpu, y.gpu).ok());
    EXPECT_TRUE(Same(y)) << "y";
    ASSERT_TRUE((*cpu_lrn)->Backward(x.cpu, y.cpu, dy.cpu, dx.cpu).ok());
    ASSERT_TRUE((*gpu_lrn)->Backward(x.gpu, y.gpu, dy.gpu, dx.gpu).ok());
    EXPECT_TRUE(Same(dx)) << "dx";
  }
}

TEST_F(CudaVsCpuTest, DenseMatchesCpu) {
  for (const DenseParams& p : {DenseParams{5, 7, 3}, DenseParams{32, 300, 65}, DenseParams{1, 1, 1}}) {
    SCOPED_TRACE(::testing::Message() << p.batch << "x" << p.in << "->" << p.out);
    auto cpu_dense = cpu_->MakeDense(p);
    auto gpu_dense = gpu_->MakeDense(p);
    ASSERT_TRUE(cpu_dense.ok()) << cpu_dense.status();
    ASSERT_TRUE(gpu_dense.ok()) << gpu_dense.status();
    const int64_t nx = int64_t{p.batch} * p.in, ny = int64_t{p.batch} * p.out, nw = int64_t{p.in} * p.out;
    Both x = Upload(Random(nx, 11)), w = Upload(Random(nw, 12)), b = Upload(Random(p.out, 13));
    Both dy = Upload(Random(ny, 14)), y = Zeros(ny), dx = Zeros(nx), dw = Zeros(nw), db = Zeros(p.out);
    ASSERT_TRUE((*cpu_dense)->Forward(x.cpu, w.cpu, b.cpu, y.cpu).ok());
    ASSERT_TRUE((*gpu_dense)->Forward(x.gpu, w.gpu, b.gpu, y.gpu).ok());
    EXPECT_TRUE(Same(y)) << "y";
    ASSERT_TRUE((*cpu_dense)->BackwardData(dy.cpu, w.cpu, dx.cpu).ok());
    ASSERT_TRUE((*gpu_dense)->BackwardData(dy.gpu, w.gpu, dx.gpu).ok());
    EXPECT_TRUE(Same(dx)) << "dx";
    ASSERT_TRUE((*cpu_dense)->BackwardWeights(x.cpu, dy.cpu, dw.cpu, db.cpu).ok());
    ASSERT_TRUE((*gpu_dense)->BackwardWeights(x.gpu, dy.gpu, dw.gpu, db.gpu).ok());
    EXPECT_TRUE(Same(dw)) << "dw";
    EXPECT_TRUE(Same(db)) << "db";
  }
}

TEST_F(CudaVsCpuTest, ReluAndBackwardMatchCpu) {
  const int64_t n = 10007;
  Both x = Upload(Random(n, 15)), dy = Upload(Random(n, 16)), y = Zeros(n), dx = Zeros(n);
  for (Device* d : {cpu_.get(), gpu_.get()}) {
    const bool g = d == gpu_.get();
    ASSERT_TRUE(d->Relu(g ? x.gpu : x.cpu, g ? y.gpu : y.cpu, n).ok());
    ASSERT_TRUE(d->ReluBackward(g ? y.gpu : y.cpu, g ? dy.gpu : dy.cpu, g ? dx.gpu : dx.cpu, n).ok());
  }
  EXPECT_EQ(Gpu(y), Cpu(y));
  EXPECT_EQ(Gpu(dx), Cpu(dx));
  // In place.
  ASSERT_TRUE(gpu_->Relu(x.gpu, x.gpu, n).ok());
  EXPECT_EQ(Gpu(x), Cpu(y));
}

TEST_F(CudaVsCpuTest, DropoutMasksAreBitIdenticalToCpu) {
  const int64_t n = 100003;  // not a multiple of any block size
  Both x = Upload(Random(n, 17)), dy = Upload(Random(n, 18));
  for (float keep : {0.5f, 0.8f, 1.0f}) {
    for (uint64_t counter : {0ull, 1ull, 123456789ull}) {
      SCOPED_TRACE(::testing::Message() << "keep_prob=" << keep << " counter=" << counter);
      Both y = Zeros(n), mask = Zeros(n), dx = Zeros(n);
      const uint64_t seed = 0xC0FFEEull;
      ASSERT_TRUE(cpu_->Dropout(x.cpu, y.cpu, mask.cpu, n, keep, seed, counter).ok());
      ASSERT_TRUE(gpu_->Dropout(x.gpu, y.gpu, mask.gpu, n, keep, seed, counter).ok());
      const std::vector<float> gm = Gpu(mask), cm = Cpu(mask);
      ASSERT_EQ(gm.size(), cm.size());
      EXPECT_EQ(std::memcmp(gm.data(), cm.data(), gm.size() * sizeof(float)), 0) << "masks differ";
      EXPECT_EQ(Gpu(y), Cpu(y));
      const double kept = std::count_if(gm.begin(), gm.end(), [](float m) { return m != 0.0f; });
      EXPECT_NEAR(kept / n, keep, 0.01);
      ASSERT_TRUE(cpu_->DropoutBackward(dy.cpu, mask.cpu, dx.cpu, n).ok());
      ASSERT_TRUE(gpu_->DropoutBackward(dy.gpu, mask.gpu, dx.gpu, n).ok());
      EXPECT_EQ(Gpu(dx), Cpu(dx));
    }
  }
  EXPECT_FALSE(gpu_->Dropout(x.gpu, x.gpu, dy.gpu, n, 0.0f, 1, 1).ok());
  EXPECT_FALSE(gpu_->Dropout(x.gpu, x.gpu, dy.gpu, n, 1.5f, 1, 1).ok());
}

// The counter read from device memory gives the mask Dropout gives for that counter, bit for bit on both
// backends; advancing the counter on the device (no host involvement) gives a different mask.
TEST_F(CudaVsCpuTest, DropoutDeviceCounterMatchesCpuAndAdvances) {
  const int64_t n = 70001;
  Both x = Upload(Random(n, 31));
  auto cpu_counter = cpu_->MakeCounter(5);
  auto gpu_counter = gpu_->MakeCounter(5);
  ASSERT_TRUE(cpu_counter.ok() && gpu_counter.ok());
  const uint64_t seed = 77, stride = 64, offset = 3;
  std::vector<float> previous;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    const uint64_t counter = (5 + round) * stride + offset;
    Both y = Zeros(n), mask = Zeros(n), y_ref = Zeros(n), mask_ref = Zeros(n);
    ASSERT_TRUE(
        cpu_->DropoutDeviceCounter(x.cpu, y.cpu, mask.cpu, n, 0.6f, seed, **cpu_counter, stride, offset)
            .ok());
    ASSERT_TRUE(
        gpu_->DropoutDeviceCounter(x.gpu, y.gpu, mask.gpu, n, 0.6f, seed, **gpu_counter, stride, offset)
            .ok());
    ASSERT_TRUE(gpu_->Dropout(x.gpu, y_ref.gpu, mask_ref.gpu, n, 0.6f, seed, counter).ok());
    const std::vector<float> gm = Gpu(mask), cm = Cpu(mask), gm_ref = Gpu(mask_ref);
    EXPECT_EQ(std::memcmp(gm.data(), cm.data(), n * sizeof(float)), 0) << "GPU and CPU masks differ";
    EXPECT_EQ(std::memcmp(gm.data(), gm_ref.data(), n * sizeof(float)), 0) << "differs from Dropout(counter)";
    EXPECT_EQ(Gpu(y), Cpu(y));
    if (!previous.empty()) {
      EXPECT_NE(gm, previous) << "the next counter value drew the same mask";
    }
    previous = gm;
    ASSERT_TRUE((*cpu_counter)->Increment().ok());
    ASSERT_TRUE((*gpu_counter)->Increment().ok());
  }
  auto value = (*gpu_counter)->Read();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, 8);
  // A counter of another device is refused.
  EXPECT_EQ(gpu_->DropoutDeviceCounter(x.gpu, x.gpu, x.gpu, n, 0.5f, seed, **cpu_counter, 1, 0).code(),
            absl::StatusCode::kInvalidArgument);
}

// An out-of-range label is the same InvalidArgument on both backends: from the op on the CPU, from the next
// synchronizing call on the GPU (device.h's contract); it is reported once, and the device stays usable.
TEST_F(CudaVsCpuTest, SoftmaxCrossEntropyBadLabelIsInvalidArgumentOnBoth) {
  const int batch = 6, classes = 10;
  const std::vector<float> labels = {1, 2, 3, 12, 4, -1};  // rows 3 and 5 are bad; row 3 is reported
  Both logits = Upload(Random(batch * classes, 32)), lab = Upload(labels);
  Both dlogits = Zeros(batch * classes), loss = Zeros(1);
  const absl::Status cpu_status =
      cpu_->SoftmaxCrossEntropy(logits.cpu, lab.cpu, batch, classes, dlogits.cpu, loss.cpu);
  ASSERT_EQ(cpu_status.code(), absl::StatusCode::kInvalidArgument) << cpu_status;
  ASSERT_TRUE(gpu_->SoftmaxCrossEntropy(logits.gpu, lab.gpu, batch, classes, dlogits.gpu, loss.gpu).ok())
      << "the GPU op cannot know yet";
  float host_loss = 0;
  const absl::Status gpu_status = gpu_->CopyToHost(loss.gpu, &host_loss, 1);
  EXPECT_EQ(gpu_status.code(), absl::StatusCode::kInvalidArgument) << gpu_status;
  EXPECT_EQ(gpu_status.message(), cpu_status.message());
  EXPECT_EQ(cpu_status.message(), "SoftmaxCrossEntropy: label 12 of row 3 is not a class index in [0, 10)");
  EXPECT_TRUE(std::isnan(host_loss));
  EXPECT_TRUE(gpu_->Synchronize().ok()) << "reported once";
  // The next (valid) batch is fine.
  const std::vector<float> good = {1, 2, 3, 4, 5, 6};
  Both lab2 = Upload(good);
  ASSERT_TRUE(gpu_->SoftmaxCrossEntropy(logits.gpu, lab2.gpu, batch, classes, dlogits.gpu, loss.gpu).ok());
  EXPECT_TRUE(gpu_->CopyToHost(loss.gpu, &host_loss, 1).ok());
  EXPECT_TRUE(std::isfinite(host_loss));
  // Also reported through Synchronize (and a fractional label).
  const std::vector<float> fractional = {1, 2.5f, 3, 4, 5, 6};
  Both lab3 = Upload(fractional);
  ASSERT_TRUE(gpu_->SoftmaxCrossEntropy(logits.gpu, lab3.gpu, batch, classes, dlogits.gpu, loss.gpu).ok());
  const absl::Status sync_status = gpu_->Synchronize();
  EXPECT_EQ(sync_status.code(), absl::StatusCode::kInvalidArgument) << sync_status;
  EXPECT_EQ(sync_status.message(),
            cpu_->SoftmaxCrossEntropy(logits.cpu, lab3.cpu, batch, classes, dlogits.cpu, loss.cpu).message());
}

TEST_F(CudaVsCpuTest, SoftmaxCrossEntropyMatchesCpu) {
  for (auto [batch, classes] : {std::pair{4, 10}, std::pair{128, 10}, std::pair{3, 1000}, std::pair{9, 33}}) {
    SCOPED_TRACE(::testing::Message() << batch << "x" << classes);
    std::vector<float> labels(batch);
    std::mt19937 gen(19);
    for (float& l : labels) l = static_cast<float>(gen() % classes);
    Both logits = Upload(Random(int64_t{batch} * classes, 20, -5.0f, 5.0f)), lab = Upload(labels);
    Both dlogits = Zeros(int64_t{batch} * classes), loss = Zeros(1);
    ASSERT_TRUE(cpu_->SoftmaxCrossEntropy(logits.cpu, lab.cpu, batch, classes, dlogits.cpu, loss.cpu).ok());
    ASSERT_TRUE(gpu_->SoftmaxCrossEntropy(logits.gpu, lab.gpu, batch, classes, dlogits.gpu, loss.gpu).ok());
    EXPECT_TRUE(Same(loss, 1e-5f, 1e-6f)) << "loss";
    EXPECT_TRUE(Same(dlogits, 1e-4f, 1e-7f)) << "dlogits";
  }
}

TEST_F(CudaVsCpuTest, L2LossAxpyScaleFillMatchCpu) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1000003}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    Both x = Upload(Random(n, 21)), y = Upload(Random(n, 22)), out = Zeros(1);
    ASSERT_TRUE(cpu_->L2Loss(x.cpu, n, out.cpu).ok());
    ASSERT_TRUE(gpu_->L2Loss(x.gpu, n, out.gpu).ok());
    EXPECT_TRUE(Same(out, 1e-5f, 0.0f)) << "l2 loss";
    ASSERT_TRUE(cpu_->Axpy(-0.37f, x.cpu, y.cpu, n).ok());
    ASSERT_TRUE(gpu_->Axpy(-0.37f, x.gpu, y.gpu, n).ok());
    EXPECT_TRUE(Same(y, 1e-6f, 1e-7f)) << "axpy";
    ASSERT_TRUE(cpu_->Scale(2.5f, y.cpu, x.cpu, n).ok());
    ASSERT_TRUE(gpu_->Scale(2.5f, y.gpu, x.gpu, n).ok());
    EXPECT_EQ(Gpu(x), Cpu(x)) << "scale";
    ASSERT_TRUE(gpu_->Fill(-4.25f, x.gpu, n).ok());
    EXPECT_EQ(Gpu(x), std::vector<float>(n, -4.25f)) << "fill";
  }
}

TEST_F(CudaVsCpuTest, CopiesRoundTripThroughPinnedMemory) {
  const int64_t n = 4099;
  auto pinned = gpu_->AllocHostPinned(n);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  const std::vector<float> v = Random(n, 23);
  std::copy(v.begin(), v.end(), *pinned);
  auto a = gpu_->Alloc(n), b = gpu_->Alloc(n);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(gpu_->CopyToDevice(*pinned, *a, n).ok());
  ASSERT_TRUE(gpu_->CopyOnDevice(*a, *b, n).ok());
  std::fill(*pinned, *pinned + n, 0.0f);
  ASSERT_TRUE(gpu_->CopyToHost(*b, *pinned, n).ok());
  EXPECT_EQ(std::vector<float>(*pinned, *pinned + n), v);
  gpu_->Free(*a);
  gpu_->Free(*b);
  gpu_->FreeHostPinned(*pinned);
  ASSERT_TRUE(gpu_->Synchronize().ok());
}

TEST_F(CudaVsCpuTest, BadShapesAreInvalidArgument) {
  EXPECT_EQ(gpu_->MakeDense({0, 3, 4}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->MakeConv2D({1, 2, 2, 1, 1, 3, 3, 1, 1, Padding::kValid}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->MakeMaxPool({1, 4, 4, 1, 0, 2, Padding::kSame}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->Alloc(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dtrain::kernels::cuda
