// bf16 compute (DeviceSpec::compute_dtype = kBf16) of the CPU backend's matrix products: convolutions, Dense and
// the batched MatMul, forward and both backward products, checked two ways against the fp32 device:
//
//  1. Exactly what it claims to be: the bf16 op equals the fp32 op applied to inputs rounded to bf16 (round to
//     nearest even) up to fp32 accumulation, |err| <= K * 2^-23 * S, where S is the same product computed on
//     the inputs' absolute values (sum_k |a_k b_k|) and K the length of the sums. An op that also rounded its
//     output to bf16 (2^-9 relative), or did not round its inputs at all, fails.
//  2. Within bf16's precision of the fp32 op on the unrounded inputs: with u = 2^-8 (bf16's unit roundoff: 8
//     significant bits), each product of two rounded operands is off by at most (2u + u^2) |a_k b_k|, so
//     |err| <= (2u + u^2 + K * 2^-23) * S. The test also asserts the largest error is above 2^-14 of S somewhere
//     (an op that silently stayed fp32 would fail it), and that the Device reports the op in bf16.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "kernels/tensor_ops.h"

namespace dtrain::kernels {
namespace {

float RoundBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest, ties to even
  u &= 0xFFFF0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
std::vector<float> Rounded(std::vector<float> v) {
  for (float& x : v) x = RoundBf16(x);
  return v;
}
std::vector<float> Abs(std::vector<float> v) {
  for (float& x : v) x = std::fabs(x);
  return v;
}

// One device's buffers for a product: inputs uploaded, outputs allocated, results downloaded.
class Buffers {
 public:
  explicit Buffers(Device* dev) : dev_(dev) {}
  ~Buffers() {
    for (float* p : owned_) dev_->Free(p);
  }
  float* In(const std::vector<float>& v) {
    float* p = Out(static_cast<int64_t>(v.size()));
    EXPECT_TRUE(dev_->CopyToDevice(v.data(), p, static_cast<int64_t>(v.size())).ok());
    return p;
  }
  float* Out(int64_t n) {
    absl::StatusOr<float*> p = dev_->Alloc(std::max<int64_t>(n, 1));
    EXPECT_TRUE(p.ok()) << p.status();
    owned_.push_back(*p);
    EXPECT_TRUE(dev_->Fill(0.0f, *p, std::max<int64_t>(n, 1)).ok());
    return *p;
  }
  std::vector<float> Get(const float* p, int64_t n) {
    std::vector<float> v(n);
    EXPECT_TRUE(dev_->CopyToHost(p, v.data(), n).ok());
    return v;
  }

 private:
  Device* dev_;
  std::vector<float*> owned_;
};

struct Check {
  std::string what;
  int64_t k = 1;  // the length of each output's sum
};

// Asserts |got - want| <= (rel + k * 2^-23) * bound elementwise; returns the largest |got - want| / bound.
double ExpectWithin(const Check& c, const char* claim, const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<float>& bound, double rel) {
  EXPECT_EQ(got.size(), want.size());
  const double accumulation = static_cast<double>(c.k) * std::ldexp(1.0, -23);
  double worst = 0;
  int bad = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = (rel + accumulation) * bound[i] + 1e-30;
    if (bound[i] > 0) worst = std::max(worst, err / bound[i]);
    if (err > tol && bad++ < 3) {
      ADD_FAILURE() << c.what << " (" << claim << ") element " << i << ": bf16 op " << got[i] << ", expected "
                    << want[i] << " within " << tol << " (sum of |products| " << bound[i] << ")";
    }
  }
  EXPECT_EQ(bad, 0) << c.what << " (" << claim << "): " << bad << " of " << got.size() << " elements";
  return worst;
}

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff, 2^-8

// Runs `pass` on the bf16 device with inputs `in` and on the fp32 device with the inputs rounded, unrounded and
// absolute; checks both claims of the header for every output. `pass(dev, inputs) -> outputs`.
using Pass = std::function<std::vector<std::vector<float>>(Device*, const std::vector<std::vector<float>>&)>;
void CheckPass(Device* bf16, Device* fp32, const Check& c, const std::vector<std::vector<float>>& in,
               const Pass& pass) {
  std::vector<std::vector<float>> rounded, absolute;
  for (const auto& v : in) {
    rounded.push_back(Rounded(v));
    absolute.push_back(Abs(v));
  }
  const auto got = pass(bf16, in);
  const auto exact = pass(fp32, in);
  const auto of_rounded = pass(fp32, rounded);
  const auto bound = pass(fp32, absolute);
  ASSERT_EQ(got.size(), exact.size());
  double worst = 0;
  for (size_t o = 0; o < got.size(); ++o) {
    const Check co{absl::StrCat(c.what, " output ", o), c.k};
    ExpectWithin(co, "= fp32 op on rounded inputs", got[o], of_rounded[o], bound[o], 0.0);
    worst = std::max(worst, ExpectWithin(co, "within bf16 of fp32", got[o], exact[o], bound[o], 2 * kU + kU * kU));
  }
  EXPECT_GT(worst, std::ldexp(1.0, -14)) << c.what << ": no error as large as bf16's: did it compute in fp32?";
}

class Bf16Test : public ::testing::Test {
 protected:
  void SetUp() override {
    // The oracle: fp32 direct convolutions (Winograd's own error is larger than the accumulation term).
    setenv("DTRAIN_CONV_WINOGRAD", "0", 1);
    auto b = CreateCpuDevice(DeviceSpec::Cpu(1, ComputeDtype::kBf16));
    ASSERT_TRUE(b.ok()) << b.status();
    bf16_ = std::move(*b);
    auto f = CreateCpuDevice(DeviceSpec::Cpu(1));
    ASSERT_TRUE(f.ok()) << f.status();
    fp32_ = std::move(*f);
  }
  void TearDown() override { unsetenv("DTRAIN_CONV_WINOGRAD"); }

  std::unique_ptr<Device> bf16_, fp32_;
};

void CheckConv(Device* bf16, Device* fp32, const Conv2DParams& p) {
  const int64_t x_n = static_cast<int64_t>(p.batch) * p.in_h * p.in_w * p.in_c;
  const int64_t y_n = static_cast<int64_t>(p.batch) * p.out_h() * p.out_w() * p.out_c;
  const int64_t w_n = p.weights_size();
  const std::vector<float> x = Random(x_n, 1), w = Random(w_n, 2), dy = Random(y_n, 3);
  // The bias is added in fp32 and is not part of the claim: zero, so the abs run's bound is the products'.
  const std::vector<float> zero_bias(p.out_c, 0.0f);
  auto make = [&p](Device* dev) {
    auto op = dev->MakeConv2D(p);
    EXPECT_TRUE(op.ok()) << op.status();
    return std::move(*op);
  };
  const std::string what = absl::StrCat("conv k=", p.k_h, "x", p.k_w, " in_c=", p.in_c, " out_c=", p.out_c,
                                        " groups=", p.groups, " stride=", p.stride_h);
  const int64_t k_fwd = static_cast<int64_t>(p.k_h) * p.k_w * (p.in_c / p.groups);
  CheckPass(bf16, fp32, {what + " forward", k_fwd}, {x, w}, [&](Device* dev, const auto& in) {
    Buffers b(dev);
    auto op = make(dev);
    float* y = b.Out(y_n);
    EXPECT_TRUE(op->Forward(b.In(in[0]), b.In(in[1]), p.has_bias ? b.In(zero_bias) : nullptr, y).ok());
    return std::vector<std::vector<float>>{b.Get(y, y_n)};
  });
  const int64_t k_data = static_cast<int64_t>(p.k_h) * p.k_w * (p.out_c / p.groups);
  CheckPass(bf16, fp32, {what + " backward-data", k_data}, {x, w, dy}, [&](Device* dev, const auto& in) {
    Buffers b(dev);
    auto op = make(dev);
    float* y = b.Out(y_n);
    float* wd = b.In(in[1]);
    EXPECT_TRUE(op->Forward(b.In(in[0]), wd, p.has_bias ? b.In(zero_bias) : nullptr, y).ok());
    float* dx = b.Out(x_n);
    EXPECT_TRUE(op->BackwardData(b.In(in[2]), wd, dx).ok());
    return std::vector<std::vector<float>>{b.Get(dx, x_n)};
  });
  const int64_t k_w = static_cast<int64_t>(p.batch) * p.out_h() * p.out_w();
  CheckPass(bf16, fp32, {what + " backward-weights", k_w}, {x, w, dy}, [&](Device* dev, const auto& in) {
    Buffers b(dev);
    auto op = make(dev);
    float* y = b.Out(y_n);
    float* xd = b.In(in[0]);
    EXPECT_TRUE(op->Forward(xd, b.In(in[1]), p.has_bias ? b.In(zero_bias) : nullptr, y).ok());
    float* dw = b.Out(w_n);
    float* db = p.has_bias ? b.Out(p.out_c) : nullptr;
    EXPECT_TRUE(op->BackwardWeights(xd, b.In(in[2]), dw, db).ok());
    std::vector<std::vector<float>> out = {b.Get(dw, w_n)};
    if (p.has_bias) out.push_back(b.Get(db, p.out_c));
    return out;
  });
}

Conv2DParams Conv(int batch, int hw, int in_c, int out_c, int k, int stride = 1) {
  Conv2DParams p;
  p.batch = batch;
  p.in_h = p.in_w = hw;
  p.in_c = in_c;
  p.out_c = out_c;
  p.k_h = p.k_w = k;
  p.stride_h = p.stride_w = stride;
  return p;
}

TEST_F(Bf16Test, ConvolutionsRoundTheirOperandsAndAccumulateInFp32) {
  CheckConv(bf16_.get(), fp32_.get(), Conv(4, 14, 32, 64, 5));      // the cnn's second layer
  CheckConv(bf16_.get(), fp32_.get(), Conv(2, 12, 16, 32, 3));      // 3x3 (Winograd in fp32)
  CheckConv(bf16_.get(), fp32_.get(), Conv(2, 15, 16, 16, 3, 2));   // strided, odd size
  Conv2DParams oihw = Conv(2, 8, 24, 48, 1);                        // 1x1, ONNX's layout, no bias
  oihw.weight_layout = WeightLayout::kOIHW;
  oihw.has_bias = false;
  CheckConv(bf16_.get(), fp32_.get(), oihw);
  const std::string report = bf16_->PrecisionReport();
  EXPECT_NE(report.find("bf16 12 conv2d"), std::string::npos) << report;  // 4 shapes, an op per pass
  EXPECT_NE(report.find("fp32 fallback: none"), std::string::npos) << report;
  EXPECT_EQ(fp32_->PrecisionReport(), "");
}

TEST_F(Bf16Test, GroupedAndDepthwiseConvolutionsAreBf16OrSayTheyAreNot) {
  Conv2DParams grouped = Conv(2, 10, 16, 32, 3);
  grouped.groups = 4;
  Conv2DParams depthwise = Conv(2, 10, 32, 32, 3);
  depthwise.groups = 32;
  depthwise.weight_layout = WeightLayout::kOIHW;
  for (const Conv2DParams& p : {grouped, depthwise}) {
    auto op = bf16_->MakeConv2D(p);
    ASSERT_TRUE(op.ok()) << op.status();
  }
  const std::string report = bf16_->PrecisionReport();
  // Each made op is either counted in bf16 or named as an fp32 fallback with oneDNN's reason.
  const bool both_bf16 = report.find("bf16 2 conv2d") != std::string::npos;
  const bool named = report.find("groups=") != std::string::npos;
  EXPECT_TRUE(both_bf16 || named) << report;
  if (both_bf16) {
    CheckConv(bf16_.get(), fp32_.get(), grouped);
    CheckConv(bf16_.get(), fp32_.get(), depthwise);
  }
}

// A 3x3 convolution with fp32 Winograd beside bf16 runs each pass on the faster (timed when made, pinned here by
// DTRAIN_CONV_BF16_PASSES): every split gives results within bf16's bound of fp32 (Winograd's own error is far
// smaller), including the splits where the backward passes run on an op whose Forward did not run and must
// round or reorder x and the filter themselves; the report names the passes that stayed fp32.
TEST_F(Bf16Test, ThreeByThreeConvolutionsSplitTheirPassesBetweenBf16AndFp32Winograd) {
  unsetenv("DTRAIN_CONV_WINOGRAD");
  const Conv2DParams p = Conv(2, 12, 32, 32, 3);
  for (int passes : {0, 1, 2, 4, 5, 6}) {
    setenv("DTRAIN_CONV_BF16_PASSES", std::to_string(passes).c_str(), 1);
    auto dev = CreateCpuDevice(DeviceSpec::Cpu(1, ComputeDtype::kBf16));
    ASSERT_TRUE(dev.ok()) << dev.status();
    const int64_t x_n = 2 * 12 * 12 * 32, y_n = 2 * 12 * 12 * 32, w_n = p.weights_size();
    const std::vector<float> x = Random(x_n, 1), w = Random(w_n, 2), dy = Random(y_n, 3), zero(32, 0.0f);
    auto run = [&](Device* d, const std::vector<float>& xi, const std::vector<float>& wi, const std::vector<float>& dyi) {
      Buffers b(d);
      auto op = d->MakeConv2D(p);
      EXPECT_TRUE(op.ok()) << op.status();
      float* xd = b.In(xi);
      float* wd = b.In(wi);
      float* y = b.Out(y_n);
      float* dx = b.Out(x_n);
      float* dw = b.Out(w_n);
      float* db = b.Out(32);
      float* dyd = b.In(dyi);
      EXPECT_TRUE((*op)->Forward(xd, wd, b.In(zero), y).ok());
      EXPECT_TRUE((*op)->BackwardWeights(xd, dyd, dw, db).ok());
      EXPECT_TRUE((*op)->BackwardData(dyd, wd, dx).ok());
      return std::vector<std::vector<float>>{b.Get(y, y_n), b.Get(dx, x_n), b.Get(dw, w_n)};
    };
    const auto got = run(dev->get(), x, w, dy);
    const auto exact = run(fp32_.get(), x, w, dy);
    const auto bound = run(fp32_.get(), Abs(x), Abs(w), Abs(dy));
    const int64_t ks[] = {9 * 32, 9 * 32, 2 * 12 * 12};
    for (int o = 0; o < 3; ++o) {
      ExpectWithin({absl::StrCat("split ", passes, " output ", o), ks[o]}, "within bf16 of fp32", got[o], exact[o],
                   bound[o], 2 * kU + kU * kU);
    }
    const std::string report = (*dev)->PrecisionReport();
    if (passes == 0) {
      EXPECT_NE(report.find("fp32 Winograd where it timed faster: conv2d[batch=2 in=12x12x32 out_c=32 k=3x3 "
                            "stride=1x1 SAME] forward, backward-data, backward-weights"),
                std::string::npos)
          << report;
    } else if (passes == 5) {
      EXPECT_NE(report.find("SAME] backward-data;"), std::string::npos) << report;
    }
  }
  unsetenv("DTRAIN_CONV_BF16_PASSES");
}

void CheckDense(Device* bf16, Device* fp32, const DenseParams& p) {
  const int64_t x_n = static_cast<int64_t>(p.batch) * p.in, y_n = static_cast<int64_t>(p.batch) * p.out;
  const int64_t w_n = static_cast<int64_t>(p.in) * p.out;
  const std::vector<float> x = Random(x_n, 4), w = Random(w_n, 5), dy = Random(y_n, 6);
  const std::vector<float> zero_bias(p.out, 0.0f);
  const std::string what = absl::StrCat("dense ", p.batch, "x", p.in, "x", p.out, p.weights_transposed ? " transposed" : "",
                                        " alpha=", p.alpha);
  auto run = [&](Device* dev, const std::vector<std::vector<float>>& in, bool backward) {
    Buffers b(dev);
    auto op = dev->MakeDense(p);
    EXPECT_TRUE(op.ok()) << op.status();
    float* xd = b.In(in[0]);
    float* wd = b.In(in[1]);
    float* y = b.Out(y_n);
    EXPECT_TRUE((*op)->Forward(xd, wd, p.has_bias ? b.In(zero_bias) : nullptr, y).ok());
    if (!backward) return std::vector<std::vector<float>>{b.Get(y, y_n)};
    float* dyd = b.In(in[2]);
    float* dw = b.Out(w_n);
    float* db = b.Out(p.out);
    float* dx = b.Out(x_n);
    EXPECT_TRUE((*op)->BackwardWeights(xd, dyd, dw, p.has_bias ? db : nullptr).ok());
    EXPECT_TRUE((*op)->BackwardData(dyd, wd, dx).ok());
    return std::vector<std::vector<float>>{b.Get(dx, x_n), b.Get(dw, w_n)};
  };
  CheckPass(bf16, fp32, {what + " forward", p.in}, {x, w},
            [&](Device* dev, const auto& in) { return run(dev, in, false); });
  // dx sums over `out`, dw over the batch: the longer bounds both.
  CheckPass(bf16, fp32, {what + " backward", std::max(p.out, p.batch)}, {x, w, dy},
            [&](Device* dev, const auto& in) { return run(dev, in, true); });
}

TEST_F(Bf16Test, DenseRoundsItsOperandsAndAccumulatesInFp32) {
  CheckDense(bf16_.get(), fp32_.get(), {.batch = 50, .in = 784, .out = 100});  // the mlp's first layer
  DenseParams gemm{.batch = 8, .in = 96, .out = 40};                          // ONNX Gemm transB, scaled
  gemm.weights_transposed = true;
  gemm.alpha = 0.5f;
  CheckDense(bf16_.get(), fp32_.get(), gemm);
  const std::string report = bf16_->PrecisionReport();
  EXPECT_NE(report.find("bf16 4 dense"), std::string::npos) << report;
  EXPECT_NE(report.find("fp32 fallback: none"), std::string::npos) << report;
}

void CheckMatMul(Device* bf16, Device* fp32, const MatMulParams& p) {
  const int64_t a_n = p.batch * p.m * p.k, b_n = p.batch * p.k * p.n, y_n = p.batch * p.m * p.n;
  const std::vector<float> a = Random(a_n, 7), bm = Random(b_n, 8), dy = Random(y_n, 9);
  const std::string what = absl::StrCat("matmul ", Describe(p));
  auto run = [&](Device* dev, const std::vector<std::vector<float>>& in, bool backward) {
    Buffers b(dev);
    auto op = dev->MakeMatMul(p);
    EXPECT_TRUE(op.ok()) << op.status();
    float* ad = b.In(in[0]);
    float* bd = b.In(in[1]);
    float* y = b.Out(y_n);
    EXPECT_TRUE((*op)->Forward(ad, bd, y).ok());
    if (!backward) return std::vector<std::vector<float>>{b.Get(y, y_n)};
    float* dyd = b.In(in[2]);
    float* da = b.Out(a_n);
    float* db = b.Out(b_n);
    EXPECT_TRUE((*op)->BackwardA(dyd, bd, da).ok());
    EXPECT_TRUE((*op)->BackwardB(ad, dyd, db).ok());
    return std::vector<std::vector<float>>{b.Get(da, a_n), b.Get(db, b_n)};
  };
  CheckPass(bf16, fp32, {what + " forward", p.k}, {a, bm},
            [&](Device* dev, const auto& in) { return run(dev, in, false); });
  CheckPass(bf16, fp32, {what + " backward", std::max(p.n, p.m)}, {a, bm, dy},
            [&](Device* dev, const auto& in) { return run(dev, in, true); });
}

TEST_F(Bf16Test, BatchedMatMulRoundsItsOperandsAndAccumulatesInFp32) {
  CheckMatMul(bf16_.get(), fp32_.get(), {.batch = 6, .m = 17, .n = 17, .k = 64, .trans_b = true});  // q k^T
  CheckMatMul(bf16_.get(), fp32_.get(), {.batch = 6, .m = 17, .n = 64, .k = 17});                   // attn v
  CheckMatMul(bf16_.get(), fp32_.get(), {.batch = 2, .m = 9, .n = 12, .k = 20, .trans_a = true});
  const std::string report = bf16_->PrecisionReport();
  EXPECT_NE(report.find("bf16 6 matmul"), std::string::npos) << report;  // 3 shapes, forward and backward
  // With bf16 instructions every product runs on an optimized kernel (a transposed output would not: the op
  // computes the transposed product instead).
  if (report.find("on oneDNN's avx512_core_bf16") != std::string::npos ||
      report.find("on oneDNN's avx512_core_amx") != std::string::npos) {
    EXPECT_EQ(report.find("ref:"), std::string::npos) << report;
  }
}

TEST_F(Bf16Test, TheReportNamesTheInstructionSet) {
  auto op = bf16_->MakeDense({.batch = 4, .in = 8, .out = 8});
  ASSERT_TRUE(op.ok()) << op.status();
  const std::string report = bf16_->PrecisionReport();
  EXPECT_NE(report.find("compute bf16 (fp32 accumulation) on oneDNN's "), std::string::npos) << report;
  EXPECT_NE(report.find("pooling, normalization"), std::string::npos) << report;
  std::printf("%s\n", report.c_str());
}

TEST(ComputeDtypeTest, ParsesItsTwoNamesAndRefusesOthers) {
  EXPECT_EQ(*ParseComputeDtype("fp32"), ComputeDtype::kFp32);
  EXPECT_EQ(*ParseComputeDtype("bf16"), ComputeDtype::kBf16);
  const absl::StatusOr<ComputeDtype> bad = ParseComputeDtype("fp16");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--compute_dtype=fp16: expected fp32 or bf16"), absl::string_view::npos);
  EXPECT_STREQ(ComputeDtypeName(ComputeDtype::kBf16), "bf16");
}

}  // namespace
}  // namespace dtrain::kernels
