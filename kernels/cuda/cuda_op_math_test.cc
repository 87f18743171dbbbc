// The CUDA backend's kernel math on the host, without a GPU: the __host__ __device__ functions of op_math.h that
// every new kernel is a loop around, and the shapes kernel_shapes.h makes from the interface's params, run here
// the way the kernels run them (one call per thread index) and compared with naive loops written from the
// interface's definitions (kernels/device.h), and gradients with finite differences. What this cannot check is
// CUDA itself (launch geometry, shared memory, atomics): cuda_imported_ops_test does that against the CPU backend
// on a machine with a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/kernel_shapes.h"
#include "kernels/cuda/op_math.h"
#include "kernels/device.h"
#include "kernels/reference_ops.h"
#include "kernels/tensor_ops.h"

namespace dtrain::kernels::cuda {
namespace {

std::vector<float> RandomVec(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

::testing::AssertionResult Close(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol * (1.0 + std::fabs(want[i])))) {
      return ::testing::AssertionFailure() << "[" << i << "] got " << got[i] << " want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- pooling ----

// Max and average pooling written from the interface: windows start at o * stride - pad_before; max over the real
// elements (first maximum); average divided by the real elements or, with count_include_pad, by the window clipped
// to [-before, in + after) (PyTorch's pool_size rule).
void ReferencePool(const PoolParams& p, bool average, const std::vector<float>& x, const std::vector<float>& dy,
                   std::vector<double>* y, std::vector<double>* dx) {
  const int oh_n = p.out_h(), ow_n = p.out_w();
  const Pads ph = p.pads_h(), pw = p.pads_w();
  y->assign(int64_t{p.batch} * oh_n * ow_n * p.channels, 0.0);
  dx->assign(x.size(), 0.0);
  auto xi = [&](int n, int h, int w, int c) { return ((int64_t{n} * p.in_h + h) * p.in_w + w) * p.channels + c; };
  for (int n = 0; n < p.batch; ++n) {
    for (int oh = 0; oh < oh_n; ++oh) {
      for (int ow = 0; ow < ow_n; ++ow) {
        for (int c = 0; c < p.channels; ++c) {
          const int64_t o = ((int64_t{n} * oh_n + oh) * ow_n + ow) * p.channels + c;
          const int hs = oh * p.sh() - ph.before, ws = ow * p.sw() - pw.before;
          const int he = std::min(hs + p.kh(), p.in_h + ph.after), we = std::min(ws + p.kw(), p.in_w + pw.after);
          const int pool_size = (he - hs) * (we - ws);
          const int h0 = std::max(hs, 0), h1 = std::min(he, p.in_h), w0 = std::max(ws, 0), w1 = std::min(we, p.in_w);
          if (average) {
            const int divisor = p.count_include_pad ? pool_size : (h1 - h0) * (w1 - w0);
            double sum = 0.0;
            for (int h = h0; h < h1; ++h)
              for (int w = w0; w < w1; ++w) sum += x[xi(n, h, w, c)];
            (*y)[o] = sum / divisor;
            for (int h = h0; h < h1; ++h)
              for (int w = w0; w < w1; ++w) (*dx)[xi(n, h, w, c)] += dy[o] / divisor;
          } else {
            int64_t best = -1;
            // The window reaches past the data only in padding: clip to the data.
            for (int h = h0; h < std::min(hs + p.kh(), p.in_h); ++h)
              for (int w = w0; w < std::min(ws + p.kw(), p.in_w); ++w)
                if (best < 0 || x[xi(n, h, w, c)] > x[best]) best = xi(n, h, w, c);
            (*y)[o] = x[best];
            (*dx)[best] += dy[o];
          }
        }
      }
    }
  }
}

PoolParams Explicit(int batch, int h, int w, int c, int kh, int kw, int sh, int sw, int top, int bottom, int left,
                    int right, bool ceil_mode, bool include_pad) {
  PoolParams p;
  p.batch = batch;
  p.in_h = h;
  p.in_w = w;
  p.channels = c;
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
  p.count_include_pad = include_pad;
  return p;
}

std::vector<PoolParams> PoolCases() {
  std::vector<PoolParams> cases;
  cases.push_back({2, 7, 7, 3, 2, 2, Padding::kSame});  // TensorFlow SAME: pad after only
  cases.push_back({1, 8, 9, 2, 3, 2, Padding::kSame});
  cases.push_back({2, 9, 9, 2, 3, 2, Padding::kValid});
  cases.push_back(Explicit(2, 6, 5, 3, 3, 2, 2, 1, 1, 0, 1, 1, false, false));
  cases.push_back(Explicit(2, 6, 5, 3, 3, 3, 2, 1, 1, 2, 2, 1, true, false));
  cases.push_back(Explicit(1, 6, 6, 2, 3, 3, 2, 2, 0, 0, 0, 0, true, false));   // ceil_mode overhang, no pads
  cases.push_back(Explicit(1, 6, 6, 2, 3, 3, 2, 2, 1, 1, 1, 1, true, true));    // overhang beyond the pads
  cases.push_back(Explicit(2, 5, 7, 2, 3, 3, 2, 3, 1, 1, 1, 1, false, true));
  cases.push_back(Explicit(1, 7, 4, 1, 7, 4, 1, 1, 0, 0, 0, 0, false, false));  // global pooling
  PoolParams same_avg{2, 7, 6, 2, 3, 2, Padding::kSame};
  same_avg.count_include_pad = true;
  cases.push_back(same_avg);
  return cases;
}

TEST(PoolMathTest, MaxAndAveragePoolingMatchTheInterface) {
  for (const PoolParams& p : PoolCases()) {
    SCOPED_TRACE(::testing::Message() << "in " << p.in_h << "x" << p.in_w << " window " << p.kh() << "x" << p.kw()
                                      << " stride " << p.sh() << "x" << p.sw() << " explicit " << p.explicit_padding
                                      << " ceil " << p.ceil_mode << " include_pad " << p.count_include_pad);
    auto shape = MakePoolShape(p, "test");
    ASSERT_TRUE(shape.ok()) << shape.status();
    const PoolShape& s = *shape;
    const int64_t nx = int64_t{p.batch} * p.in_h * p.in_w * p.channels;
    const int64_t ny = int64_t{p.batch} * s.out_h * s.out_w * p.channels;
    const std::vector<float> x = RandomVec(nx, 1, -2.0f, -0.1f), dy = RandomVec(ny, 2);
    for (bool average : {false, true}) {
      SCOPED_TRACE(average ? "average" : "max");
      std::vector<double> want_y, want_dx;
      ReferencePool(p, average, x, dy, &want_y, &want_dx);
      std::vector<float> y(ny), dx(nx);
      std::vector<int32_t> argmax(ny);
      for (int64_t o = 0; o < ny; ++o) {
        y[o] = average ? AvgPoolOutput(x.data(), s, o) : MaxPoolOutput(x.data(), s, o, &argmax[o]);
      }
      for (int64_t i = 0; i < nx; ++i) {
        dx[i] = average ? AvgPoolInputGrad(dy.data(), s, i) : MaxPoolInputGrad(dy.data(), argmax.data(), s, i);
      }
      EXPECT_TRUE(Close(y, want_y, 1e-6)) << "y";
      EXPECT_TRUE(Close(dx, want_dx, 1e-6)) << "dx";
    }
  }
}

TEST(PoolMathTest, CeilModeAverageByHand) {
  // 3x3 input 1..9, window 2, stride 2, ceil_mode: windows {1,2,4,5}, {3,6}, {7,8}, {9}.
  const PoolParams p = Explicit(1, 3, 3, 1, 2, 2, 2, 2, 0, 0, 0, 0, true, true);
  auto s = MakePoolShape(p, "test");
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->out_h, 2);
  ASSERT_EQ(s->out_w, 2);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<float> y(4);
  for (int o = 0; o < 4; ++o) y[o] = AvgPoolOutput(x.data(), *s, o);
  EXPECT_EQ(y, (std::vector<float>{3.0f, 4.5f, 7.5f, 9.0f})) << "the overhang never counts";
}

TEST(PoolMathTest, BadParamsAreInvalidArgument) {
  PoolParams p = Explicit(1, 4, 4, 1, 2, 2, 2, 2, -1, 0, 0, 0, false, false);
  EXPECT_EQ(MakePoolShape(p, "t").status().code(), absl::StatusCode::kInvalidArgument);
  p = Explicit(1, 4, 4, 1, 6, 2, 2, 2, 0, 0, 0, 0, false, false);
  EXPECT_EQ(MakePoolShape(p, "t").status().code(), absl::StatusCode::kInvalidArgument);
  p = Explicit(0, 4, 4, 1, 2, 2, 2, 2, 0, 0, 0, 0, false, false);
  EXPECT_EQ(MakePoolShape(p, "t").status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- convolution padding ----

// A 1-D dilated correlation of x padded with (before, after), `out` outputs.
std::vector<double> Correlate(const std::vector<double>& x, const std::vector<double>& w, int before, int after,
                              int stride, int dilation, int out) {
  std::vector<double> padded(before, 0.0);
  padded.insert(padded.end(), x.begin(), x.end());
  padded.insert(padded.end(), after, 0.0);
  std::vector<double> y(out, 0.0);
  for (int o = 0; o < out; ++o)
    for (size_t k = 0; k < w.size(); ++k) y[o] += w[k] * padded.at(o * stride + k * dilation);
  return y;
}

// Where NeedsExplicitPadding says cuDNN's symmetric padding suffices, it computes the op's outputs.
TEST(ConvPaddingTest, SymmetricPaddingOnlyWhereItGivesTheSameOutputs) {
  int symmetric = 0, explicit_pad = 0;
  for (int in = 1; in <= 9; ++in)
    for (int k = 1; k <= 4; ++k)
      for (int dilation = 1; dilation <= 2; ++dilation)
        for (int stride = 1; stride <= 3; ++stride)
          for (int before = 0; before <= 3; ++before)
            for (int after = 0; after <= 3; ++after) {
              Conv2DParams p;
              p.batch = 1;
              p.in_h = in;
              p.in_w = 1;
              p.in_c = p.out_c = 1;
              p.k_h = k;
              p.k_w = 1;
              p.stride_h = stride;
              p.dilation_h = dilation;
              p.explicit_padding = true;
              p.pad_top = before;
              p.pad_bottom = after;
              if (p.out_h() <= 0) continue;
              if (NeedsExplicitPadding(p)) {
                ++explicit_pad;
                continue;
              }
              ++symmetric;
              std::vector<double> x(in), w(k);
              for (int i = 0; i < in; ++i) x[i] = i + 1;
              for (int i = 0; i < k; ++i) w[i] = 10 * (i + 1);
              EXPECT_EQ(Correlate(x, w, before, after, stride, dilation, p.out_h()),
                        Correlate(x, w, before, before, stride, dilation, p.out_h()))
                  << "in=" << in << " k=" << k << " d=" << dilation << " s=" << stride << " pads=" << before << ","
                  << after;
            }
  EXPECT_GT(symmetric, 100);
  EXPECT_GT(explicit_pad, 100);
  Conv2DParams same{2, 8, 8, 3, 4, 3, 3, 2, 2, Padding::kSame};  // odd total padding: after only
  EXPECT_TRUE(NeedsExplicitPadding(same));
  same.stride_h = same.stride_w = 1;
  EXPECT_FALSE(NeedsExplicitPadding(same));
}

// ---- broadcasting ----

struct BroadcastCase {
  int rank;
  std::vector<int64_t> dims, a, b;
};

BroadcastParams ToParams(const BroadcastCase& c, BinaryOp op) {
  BroadcastParams p;
  p.op = op;
  p.rank = c.rank;
  for (int d = 0; d < c.rank; ++d) {
    p.dims[d] = c.dims[d];
    p.a_strides[d] = c.a[d];
    p.b_strides[d] = c.b[d];
  }
  return p;
}

std::vector<BroadcastCase> BroadcastCases() {
  return {
      {2, {6, 4}, {4, 1}, {0, 1}},                                       // per-channel bias
      {2, {5, 7}, {1, 0}, {0, 1}},                                       // outer product shape
      {3, {3, 4, 5}, {20, 5, 1}, {0, 0, 0}},                             // scalar b
      {2, {2, 3}, {3, 1}, {3, 1}},                                       // no broadcast
      {5, {2, 3, 1, 4, 5}, {60, 20, 20, 5, 1}, {0, 5, 0, 0, 1}},         // rank 5, size-1 dim
      {4, {2, 3, 4, 5}, {60, 20, 5, 1}, {20, 0, 5, 1}},                  // broadcast in the middle
      {2, {5000, 8}, {8, 1}, {0, 1}},                                    // long reduction: several chunks
      {2, {3, 4}, {8, 1}, {0, 1}},                                       // a with gaps between rows
      {2, {4, 3}, {1, 4}, {3, 1}},                                       // a read transposed
      {3, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}},                              // one element
  };
}

TEST(BroadcastMathTest, ForwardAndGradientsMatchNaiveLoops) {
  for (const BroadcastCase& c : BroadcastCases()) {
    for (BinaryOp op : {BinaryOp::kAdd, BinaryOp::kSub, BinaryOp::kMul, BinaryOp::kDiv}) {
      const BroadcastParams p = ToParams(c, op);
      SCOPED_TRACE(::testing::Message() << "rank " << c.rank << " dims[0] " << c.dims[0] << " op "
                                        << static_cast<int>(op));
      auto shape = MakeBroadcastShape(p);
      ASSERT_TRUE(shape.ok()) << shape.status();
      const int64_t n = p.out_size();
      const std::vector<float> a = RandomVec(p.a_size(), 3), b = RandomVec(p.b_size(), 4, 0.5f, 1.5f);
      const std::vector<float> dy = RandomVec(n, 5);
      // Naive: straight from the unsimplified params.
      std::vector<double> want_y(n), want_da(p.a_size(), 0.0), want_db(p.b_size(), 0.0);
      for (int64_t o = 0; o < n; ++o) {
        int64_t rest = o, ao = 0, bo = 0;
        for (int d = p.rank - 1; d >= 0; --d) {
          ao += (rest % p.dims[d]) * p.a_strides[d];
          bo += (rest % p.dims[d]) * p.b_strides[d];
          rest /= p.dims[d];
        }
        const double av = a[ao], bv = b[bo], g = dy[o];
        switch (op) {
          case BinaryOp::kAdd:
            want_y[o] = av + bv, want_da[ao] += g, want_db[bo] += g;
            break;
          case BinaryOp::kSub:
            want_y[o] = av - bv, want_da[ao] += g, want_db[bo] -= g;
            break;
          case BinaryOp::kMul:
            want_y[o] = av * bv, want_da[ao] += g * bv, want_db[bo] += g * av;
            break;
          case BinaryOp::kDiv:
            want_y[o] = av / bv, want_da[ao] += g / bv, want_db[bo] -= g * av / (bv * bv);
            break;
        }
      }
      std::vector<float> y(n);
      for (int64_t o = 0; o < n; ++o) {
        int64_t ao, bo;
        BroadcastOffsets(*shape, o, &ao, &bo);
        y[o] = BinaryValue(static_cast<int>(op), a[ao], b[bo]);
      }
      EXPECT_TRUE(Close(y, want_y, 1e-6)) << "y";
      for (int which = 0; which < 2; ++which) {
        const ReduceShape r = MakeReduceShape(*shape, which);
        ASSERT_TRUE(ReduceTargetsAreDistinct(r));
        ASSERT_GE(r.chunks * r.chunk_len, r.reduced_count);
        // What CudaBinary + broadcast.cu do: zero the unreached elements, partial sums, then chunks in order.
        std::vector<float> dx(which == 0 ? p.a_size() : p.b_size(), 0.0f);
        std::vector<double> partial(r.chunks * r.kept_count);
        for (int64_t t = 0; t < r.chunks * r.kept_count; ++t) {
          partial[t] = BinaryGradPartial(r, static_cast<int>(op), a.data(), b.data(), dy.data(), t);
        }
        for (int64_t k = 0; k < r.kept_count; ++k) {
          double acc = 0.0;
          for (int64_t ch = 0; ch < r.chunks; ++ch) acc += partial[ch * r.kept_count + k];
          dx[ReduceTarget(r, k)] = static_cast<float>(acc);
        }
        EXPECT_TRUE(Close(dx, which == 0 ? want_da : want_db, 1e-5)) << (which == 0 ? "da" : "db");
      }
    }
  }
}

TEST(BroadcastMathTest, SimplifiesAndPlans) {
  auto bias = MakeBroadcastShape(ToParams({4, {2, 3, 4, 5}, {60, 20, 5, 1}, {0, 0, 0, 1}}, BinaryOp::kAdd));
  ASSERT_TRUE(bias.ok());
  EXPECT_EQ(bias->rank, 2) << "the three outer dims merge";
  EXPECT_EQ(bias->dims[0], 24);
  EXPECT_EQ(bias->dims[1], 5);
  const ReduceShape db = MakeReduceShape(*bias, 1);
  EXPECT_EQ(db.kept_count, 5);
  EXPECT_EQ(db.reduced_count, 24);
  auto same = MakeBroadcastShape(ToParams({3, {2, 3, 4}, {12, 4, 1}, {12, 4, 1}}, BinaryOp::kMul));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->rank, 1);
  EXPECT_EQ(same->dims[0], 24);
  // Overlapping strides: no well-defined gradient element by element.
  auto overlap = MakeBroadcastShape(ToParams({2, {3, 4}, {1, 1}, {4, 1}}, BinaryOp::kAdd));
  ASSERT_TRUE(overlap.ok());
  EXPECT_FALSE(ReduceTargetsAreDistinct(MakeReduceShape(*overlap, 0)));
  EXPECT_TRUE(ReduceTargetsAreDistinct(MakeReduceShape(*overlap, 1)));
  EXPECT_EQ(MakeBroadcastShape(ToParams({2, {3, 0}, {1, 1}, {1, 1}}, BinaryOp::kAdd)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeBroadcastShape(ToParams({2, {3, 2}, {-1, 1}, {1, 1}}, BinaryOp::kAdd)).status().code(),
            absl::StatusCode::kInvalidArgument);
  BroadcastParams rank6;
  rank6.rank = 6;
  EXPECT_EQ(MakeBroadcastShape(rank6).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReductionSplitTest, CoversEveryTermOnce) {
  for (int64_t outputs : {int64_t{1}, int64_t{3}, int64_t{64}, int64_t{70000}}) {
    for (int64_t length : {int64_t{1}, int64_t{31}, int64_t{33}, int64_t{1000}, int64_t{123457}}) {
      const ChunkSplit s = SplitReduction(outputs, length);
      EXPECT_GE(s.chunks, 1);
      EXPECT_GE(s.chunks * s.chunk_len, length);
      EXPECT_LT((s.chunks - 1) * s.chunk_len, length) << "no empty chunk";
      if (outputs >= 70000) {
        EXPECT_EQ(s.chunks, 1);
      }
    }
  }
}

// ---- batch normalization ----

TEST(BatchNormMathTest, StatisticsAndGradientsMatchNaiveAndFiniteDifferences) {
  for (auto [rows, channels] : {std::pair<int64_t, int>{37 * 5, 3}, std::pair<int64_t, int>{10000, 2}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << channels);
    const float eps = 1e-5f;
    const ChunkSplit split = SplitReduction(channels, rows);
    const ColumnShape s{rows, channels, split.chunks, split.chunk_len};
    const std::vector<float> x = RandomVec(rows * channels, 6, -1.0f, 3.0f), dy = RandomVec(rows * channels, 7);
    const std::vector<float> scale = RandomVec(channels, 8, 0.5f, 1.5f), bias = RandomVec(channels, 9);
    const int64_t parts = s.chunks * channels;
    std::vector<double> p0(parts), p1(parts);
    for (int64_t t = 0; t < parts; ++t) BatchNormStatsPartial(x.data(), s, t, &p0[t], &p1[t]);
    std::vector<float> mean(channels), var(channels);
    for (int c = 0; c < channels; ++c) BatchNormStatsFinal(p0.data(), p1.data(), s, c, mean.data(), var.data());
    std::vector<double> want_mean(channels, 0.0), want_var(channels, 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < channels; ++c) want_mean[c] += x[r * channels + c] / static_cast<double>(rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int c = 0; c < channels; ++c)
        want_var[c] += std::pow(x[r * channels + c] - want_mean[c], 2) / static_cast<double>(rows);
    EXPECT_TRUE(Close(mean, want_mean, 1e-6)) << "mean";
    EXPECT_TRUE(Close(var, want_var, 1e-6)) << "biased variance";

    for (int64_t t = 0; t < parts; ++t) {
      BatchNormGradPartial(x.data(), dy.data(), mean.data(), var.data(), eps, s, t, &p0[t], &p1[t]);
    }
    std::vector<float> dscale(channels), dbias(channels), dx(rows * channels);
    for (int c = 0; c < channels; ++c) BatchNormGradFinal(p0.data(), p1.data(), s, c, dscale.data(), dbias.data());
    for (int64_t i = 0; i < rows * channels; ++i) {
      const int c = static_cast<int>(i % channels);
      dx[i] = BatchNormInputGrad(x[i], dy[i], scale[c], mean[c], var[c], dscale[c], dbias[c], eps,
                                 1.0f / static_cast<float>(rows));
    }
    // L = sum dy * y(x) in double; its derivatives by central differences (the batch statistics move with x).
    auto loss = [&](const std::vector<double>& xd, const std::vector<double>& sc, const std::vector<double>& bi) {
      double total = 0.0;
      for (int c = 0; c < channels; ++c) {
        double m = 0.0, v = 0.0;
        for (int64_t r = 0; r < rows; ++r) m += xd[r * channels + c];
        m /= rows;
        for (int64_t r = 0; r < rows; ++r) v += (xd[r * channels + c] - m) * (xd[r * channels + c] - m);
        v /= rows;
        for (int64_t r = 0; r < rows; ++r) {
          total += dy[r * channels + c] * ((xd[r * channels + c] - m) / std::sqrt(v + eps) * sc[c] + bi[c]);
        }
      }
      return total;
    };
    std::vector<double> xd(x.begin(), x.end()), sc(scale.begin(), scale.end()), bi(bias.begin(), bias.end());
    const double h = 1e-4;
    for (int64_t i : {int64_t{0}, int64_t{5}, rows * channels - 1}) {
      xd[i] += h;
      const double up = loss(xd, sc, bi);
      xd[i] -= 2 * h;
      const double down = loss(xd, sc, bi);
      xd[i] += h;
      EXPECT_NEAR(dx[i], (up - down) / (2 * h), 2e-3) << "dx[" << i << "]";
    }
    for (int c = 0; c < channels; ++c) {
      sc[c] += h;
      const double up = loss(xd, sc, bi);
      sc[c] -= 2 * h;
      const double down = loss(xd, sc, bi);
      sc[c] += h;
      EXPECT_NEAR(dscale[c], (up - down) / (2 * h), 1e-3 * (1 + std::fabs(dscale[c]))) << "dscale " << c;
      double want_dbias = 0.0;
      for (int64_t r = 0; r < rows; ++r) want_dbias += dy[r * channels + c];
      EXPECT_NEAR(dbias[c], want_dbias, 1e-4 * (1 + std::fabs(want_dbias))) << "dbias " << c;
    }
  }
}

// ---- activations and sigmoid cross-entropy ----

TEST(ActivationMathTest, GradientsMatchFiniteDifferences) {
  const std::vector<ActivationArgs> kinds = {{kActLeakyRelu, 0.1f, 0, 0, 0, 0}, {kActClip, 0, -0.5f, 0.7f, 0, 0},
                                             {kActSigmoid, 0, 0, 0, 0, 0}, {kActTanh, 0, 0, 0, 0, 0}};
  for (const ActivationArgs& a : kinds) {
    SCOPED_TRACE(::testing::Message() << "kind " << a.kind);
    for (float x : {-3.0f, -0.9f, -0.3f, 0.2f, 0.6f, 0.9f, 4.0f}) {
      const double h = 1e-3;
      const double fd = (static_cast<double>(ActivationValue(a, x + h)) - ActivationValue(a, x - h)) / (2 * h);
      EXPECT_NEAR(ActivationGrad(a, x, ActivationValue(a, x), 1.0f), fd, 2e-3) << "x=" << x;
    }
  }
  EXPECT_EQ(ActivationValue(kinds[0], -2.0f), -0.2f);
  EXPECT_EQ(ActivationValue(kinds[1], 3.0f), 0.7f);
  EXPECT_EQ(ActivationValue(kinds[1], -3.0f), -0.5f);
  EXPECT_EQ(ActivationGrad(kinds[1], 0.7f, 0.7f, 1.0f), 0.0f) << "0 at the bound";
  EXPECT_TRUE(std::isnan(ActivationValue(kinds[1], NAN)));
  EXPECT_GE(Sigmoid(-100.0f), 0.0f);  // no overflow to NaN for either sign
  EXPECT_LT(Sigmoid(-100.0f), 1e-40f);
  EXPECT_EQ(Sigmoid(100.0f), 1.0f);
}

TEST(SigmoidCrossEntropyMathTest, LossAndGradientAreStable) {
  for (float z : {-30.0f, -2.0f, -0.1f, 0.0f, 0.5f, 3.0f, 30.0f}) {
    for (float t : {0.0f, 1.0f}) {
      const double zd = z;
      const double want = std::max(zd, 0.0) - zd * t + std::log1p(std::exp(-std::fabs(zd)));
      EXPECT_NEAR(SigmoidCrossEntropyLoss(z, t), want, 1e-6 * (1 + want)) << z << " " << t;
      const double h = 1e-3;
      const double fd = (SigmoidCrossEntropyLoss(z + h, t) - SigmoidCrossEntropyLoss(z - h, t)) / (2 * h);
      EXPECT_NEAR(Sigmoid(z) - t, fd, 2e-3) << z << " " << t;
    }
  }
  EXPECT_TRUE(IsBinaryLabel(0.0f) && IsBinaryLabel(1.0f));
  EXPECT_FALSE(IsBinaryLabel(0.5f) || IsBinaryLabel(2.0f) || IsBinaryLabel(-1.0f) || IsBinaryLabel(NAN));
}

// ---- embedding bags and interaction ----

TEST(GatherMathTest, BagRangesAndRows) {
  const GatherShape s{10, 4, 6, 3, 0};
  const std::vector<int32_t> good = {0, 2, 2, 6}, reversed = {0, 3, 2, 6}, past = {0, 2, 4, 7};
  int64_t lo, hi;
  EXPECT_TRUE(BagRange(good.data(), s, 1, &lo, &hi));
  EXPECT_EQ(lo, 2);
  EXPECT_EQ(hi, 2) << "an empty bag is fine";
  EXPECT_FALSE(BagRange(reversed.data(), s, 1, &lo, &hi));
  EXPECT_EQ(lo, hi);
  EXPECT_FALSE(BagRange(past.data(), s, 2, &lo, &hi));
  const std::vector<int32_t> short_last = {0, 2, 4, 5};  // lookup 5 in no bag: refused, as on the CPU
  EXPECT_TRUE(BagRange(short_last.data(), s, 1, &lo, &hi));
  EXPECT_FALSE(BagRange(short_last.data(), s, 2, &lo, &hi));
  EXPECT_TRUE(BagRange(good.data(), s, 2, &lo, &hi));
  EXPECT_TRUE(IsTableRow(0, 10) && IsTableRow(9, 10));
  EXPECT_FALSE(IsTableRow(10, 10) || IsTableRow(-1, 10));
}

TEST(InteractionMathTest, PairIndexRoundTrips) {
  int64_t p = 0;
  for (int i = 1; i < 3000; ++i) {
    for (int j = 0; j < i; ++j, ++p) {
      ASSERT_EQ(PairIndex(i, j), p);
      int ri, rj;
      PairOf(p, &ri, &rj);
      ASSERT_EQ(ri, i) << "p=" << p;
      ASSERT_EQ(rj, j) << "p=" << p;
    }
  }
}

TEST(InteractionMathTest, ForwardAndBackwardMatchNaiveAndFiniteDifferences) {
  const int features = 5, dim = 7;
  const int64_t pairs = PairIndex(features, 0);
  const std::vector<float> z = RandomVec(features * dim, 10), dy = RandomVec(pairs, 11);
  // The kernels read z with rows `ld` apart: dim from global memory, dim + 1 when staged in shared memory.
  for (int ld : {dim, dim + 1}) {
    SCOPED_TRACE(::testing::Message() << "ld " << ld);
    std::vector<float> staged(features * ld, 0.0f);
    for (int i = 0; i < features; ++i)
      for (int k = 0; k < dim; ++k) staged[i * ld + k] = z[i * dim + k];
    std::vector<float> y(pairs), dx(features * dim);
    for (int64_t p = 0; p < pairs; ++p) {
      int i, j;
      PairOf(p, &i, &j);
      y[p] = InteractionDot(staged.data(), ld, dim, i, j);
    }
    for (int e = 0; e < features * dim; ++e) {
      dx[e] = InteractionInputGrad(staged.data(), ld, dy.data(), features, e / dim, e % dim);
    }
    std::vector<double> want_y;
    for (int i = 1; i < features; ++i) {
      for (int j = 0; j < i; ++j) {
        double d = 0.0;
        for (int k = 0; k < dim; ++k) d += static_cast<double>(z[i * dim + k]) * z[j * dim + k];
        want_y.push_back(d);
      }
    }
    EXPECT_TRUE(Close(y, want_y, 1e-6)) << "y, row-major lower triangle";
    // L = dy . y is bilinear in z: central differences are exact up to rounding.
    std::vector<double> want_dx(features * dim);
    for (int e = 0; e < features * dim; ++e) {
      auto loss = [&](double delta) {
        std::vector<double> zd(z.begin(), z.end());
        zd[e] += delta;
        double total = 0.0;
        int64_t p = 0;
        for (int i = 1; i < features; ++i)
          for (int j = 0; j < i; ++j, ++p) {
            double d = 0.0;
            for (int k = 0; k < dim; ++k) d += zd[i * dim + k] * zd[j * dim + k];
            total += dy[p] * d;
          }
        return total;
      };
      want_dx[e] = (loss(1e-3) - loss(-1e-3)) / 2e-3;
    }
    EXPECT_TRUE(Close(dx, want_dx, 1e-5)) << "dx";
  }
}

// ---- activations of imported graphs ----

ActivationArgs ArgsOf(const ActivationParams& p) {
  return {static_cast<int>(p.kind), p.alpha, p.lo, p.hi, p.beta, p.exponent};
}

ActivationParams Kind(ActivationParams::Kind kind, float alpha = 0.01f, float beta = 0.5f, float exponent = 2.0f) {
  ActivationParams p;
  p.kind = kind;
  p.alpha = alpha;
  p.beta = beta;
  p.exponent = exponent;
  return p;
}

TEST(ActivationMathTest, ImportedKindsMatchTheReferenceAndFiniteDifferences) {
  using K = ActivationParams::Kind;
  const std::vector<float> general = {-4.0f, -1.3f, -0.2f, 0.0f, 0.4f, 1.7f, 5.0f};
  const std::vector<float> positive = {0.01f, 0.3f, 1.0f, 2.5f, 100.0f};
  const std::vector<float> nonzero = {-2.5f, -0.4f, 0.3f, 1.0f, 3.5f};
  // Points away from the kinks (finite differences straddle no kink).
  const std::vector<std::pair<ActivationParams, std::vector<float>>> cases = {
      {Kind(K::kHardSigmoid, 0.2f, 0.5f), {-4.0f, -2.4f, -1.0f, 0.0f, 0.7f, 2.4f, 3.0f}},
      {Kind(K::kHardSigmoid, 1.0f / 6.0f, 0.5f), {-4.0f, -2.9f, 0.0f, 1.5f, 2.9f, 3.1f}},
      {Kind(K::kHardSwish), {-5.0f, -2.9f, -1.0f, 0.0f, 0.5f, 2.9f, 4.0f}},
      {Kind(K::kGelu), general},
      {Kind(K::kSilu), general},
      {Kind(K::kErf), general},
      {Kind(K::kSqrt), positive},
      {Kind(K::kPow, 0, 0, 2.0f), general},
      {Kind(K::kPow, 0, 0, 3.0f), general},
      {Kind(K::kPow, 0, 0, 0.5f), positive},
      {Kind(K::kPow, 0, 0, -1.0f), nonzero},
  };
  for (const auto& [p, xs] : cases) {
    const ActivationArgs a = ArgsOf(p);
    SCOPED_TRACE(::testing::Message() << ActivationName(p.kind) << " alpha " << p.alpha << " exponent " << p.exponent);
    for (float x : xs) {
      float want_y, want_dx;
      const float dy = 0.7f;
      reference::Activation(p, &x, &want_y, 1);
      const float y = ActivationValue(a, x);
      EXPECT_NEAR(y, want_y, 2e-6 * (1 + std::fabs(want_y))) << "y at x=" << x;
      reference::ActivationBackward(p, &x, &want_y, &dy, &want_dx, 1);
      // Only the input the kind's gradient reads is given; the other is NaN.
      const bool reads_y = ActivationGradReadsY(a.kind);
      const float g = ActivationGrad(a, reads_y ? NAN : x, reads_y ? y : NAN, dy);
      EXPECT_NEAR(g, want_dx, 2e-5 * (1 + std::fabs(want_dx))) << "dx at x=" << x;
      const double h = 1e-3 * std::max(1.0f, std::fabs(x)) * (p.kind == K::kSqrt || p.exponent < 1 ? 1e-2 : 1);
      const double fd = (static_cast<double>(ActivationValue(a, static_cast<float>(x + h))) -
                         ActivationValue(a, static_cast<float>(x - h))) /
                        (static_cast<float>(x + h) - static_cast<float>(x - h));
      EXPECT_NEAR(g / dy, fd, 3e-3 * (1 + std::fabs(fd))) << "finite difference at x=" << x;
    }
  }
}

TEST(ActivationMathTest, ImportedKindsFollowPyTorchAtTheKinks) {
  using K = ActivationParams::Kind;
  const ActivationArgs hard_swish = ArgsOf(Kind(K::kHardSwish));
  EXPECT_EQ(ActivationGrad(hard_swish, -3.5f, NAN, 1.0f), 0.0f);
  EXPECT_EQ(ActivationGrad(hard_swish, -3.0f, NAN, 1.0f), -0.5f) << "x / 3 + 1 / 2 from -3 on";
  EXPECT_EQ(ActivationGrad(hard_swish, 3.0f, NAN, 1.0f), 1.5f) << "x / 3 + 1 / 2 up to 3 inclusive";
  EXPECT_EQ(ActivationGrad(hard_swish, 3.001f, NAN, 2.0f), 2.0f);
  EXPECT_EQ(ActivationValue(hard_swish, -3.0f), 0.0f);
  EXPECT_EQ(ActivationValue(hard_swish, 3.0f), 3.0f);
  // alpha 1/4, beta 1/2: u is exactly 0 at x = -2 and 1 at x = 2, where the gradient is 0.
  const ActivationArgs hard_sigmoid = ArgsOf(Kind(K::kHardSigmoid, 0.25f, 0.5f));
  EXPECT_EQ(ActivationGrad(hard_sigmoid, -2.0f, NAN, 1.0f), 0.0f);
  EXPECT_EQ(ActivationGrad(hard_sigmoid, 2.0f, NAN, 1.0f), 0.0f);
  EXPECT_EQ(ActivationGrad(hard_sigmoid, 1.0f, NAN, 1.0f), 0.25f);
  EXPECT_EQ(ActivationValue(hard_sigmoid, 10.0f), 1.0f);
  EXPECT_TRUE(std::isnan(ActivationValue(hard_sigmoid, NAN)));
  const ActivationArgs gelu = ArgsOf(Kind(K::kGelu));
  EXPECT_EQ(ActivationValue(gelu, 0.0f), 0.0f);
  EXPECT_FLOAT_EQ(ActivationGrad(gelu, 0.0f, NAN, 1.0f), 0.5f);
  const ActivationArgs silu = ArgsOf(Kind(K::kSilu));
  EXPECT_FLOAT_EQ(ActivationGrad(silu, 0.0f, NAN, 1.0f), 0.5f);
  EXPECT_LT(std::fabs(ActivationValue(silu, -100.0f)), 1e-40f) << "no overflow to NaN for large negative x";
  EXPECT_EQ(ActivationValue(silu, 100.0f), 100.0f);
  const ActivationArgs square = ArgsOf(Kind(K::kPow, 0, 0, 2.0f));
  EXPECT_EQ(ActivationValue(square, -1.1f), -1.1f * -1.1f) << "squares exactly, as the CPU";
  EXPECT_EQ(ActivationGrad(square, -1.5f, NAN, 1.0f), -3.0f);
  const ActivationArgs sqrt_kind = ArgsOf(Kind(K::kSqrt));
  EXPECT_EQ(ActivationGrad(sqrt_kind, NAN, 2.0f, 1.0f), 0.25f) << "Sqrt's gradient reads y only";
  // Which input each backward reads (CudaDevice::ActivationBackward checks that one is given).
  for (int kind = kActLeakyRelu; kind <= kActPow; ++kind) {
    const bool reads_y = kind == kActSigmoid || kind == kActTanh || kind == kActSqrt;
    EXPECT_EQ(ActivationGradReadsY(kind), reads_y) << "kind " << kind;
  }
}

// ---- strided copies ----

StridedCopyParams Copy(std::vector<int64_t> dims, std::vector<int64_t> src, std::vector<int64_t> dst) {
  StridedCopyParams p;
  p.rank = static_cast<int>(dims.size());
  for (int k = 0; k < p.rank; ++k) {
    p.dims[k] = dims[k];
    p.src_strides[k] = src[k];
    p.dst_strides[k] = dst[k];
  }
  return p;
}

TEST(StridedCopyMathTest, OffsetsOfTheSimplifiedCopyMatchTheReference) {
  const std::vector<StridedCopyParams> cases = {
      Copy({7, 5}, {1, 7}, {5, 1}),                                      // transpose [5, 7] -> [7, 5]
      Copy({6, 3}, {8, 1}, {3, 1}),                                      // slice x[:, 2:5] of [6, 8] (src + 2)
      Copy({3, 4}, {0, 1}, {4, 1}),                                      // broadcast a row
      Copy({2, 3, 4}, {1, 0, 2}, {12, 4, 1}),                            // broadcast the middle, permute
      Copy({2, 1, 3, 4, 5}, {60, 99, 1, 15, 3}, {60, 60, 20, 5, 1}),     // rank 5 with a size-1 dim
      Copy({4, 6, 5}, {30, 5, 1}, {30, 5, 1}),                           // contiguous: one dim
      Copy({2, 3, 2, 2, 2, 2, 2, 2}, {0, 1, 3, 6, 12, 24, 48, 96}, {384, 128, 64, 32, 16, 8, 4, 2}),  // rank 8
  };
  for (const StridedCopyParams& p : cases) {
    SCOPED_TRACE(Describe(p));
    ASSERT_TRUE(CheckStridedCopyParams("test", p).ok());
    const CopyShape s = MakeCopyShape(p);
    const int64_t offset = 2;  // the source starts inside its buffer
    const std::vector<float> src = RandomVec(p.src_span() + offset, 60);
    const std::vector<float> start = RandomVec(p.dst_span(), 61);
    for (bool accumulate : {false, true}) {
      std::vector<float> got = start, want = start;
      reference::StridedCopy(p, src.data() + offset, want.data(), accumulate);
      std::vector<int> writes(got.size(), 0);
      for (int64_t i = 0; i < p.count(); ++i) {
        int64_t so, d;
        CopyOffsets(s, i, &so, &d);
        ASSERT_GE(so, 0);
        ASSERT_LT(so, p.src_span());
        ASSERT_GE(d, 0);
        ASSERT_LT(d, p.dst_span());
        ++writes[d];
        got[d] = accumulate ? got[d] + src[offset + so] : src[offset + so];
      }
      EXPECT_EQ(got, want) << "accumulate " << accumulate;
      for (int64_t d = 0; d < static_cast<int64_t>(writes.size()); ++d) {
        EXPECT_LE(writes[d], 1) << "destination element " << d << " written twice (the kernel would race)";
      }
    }
  }
  EXPECT_EQ(SimplifyStridedCopy(cases[5]).rank, 1) << "a contiguous copy is one run";
}

// ---- reductions ----

TEST(ReduceMathTest, OutputsAndGradientsMatchTheReference) {
  const std::vector<ReduceParams> shapes = {{ReduceKind::kSum, 3, 5, 4}, {ReduceKind::kSum, 2, 100, 1},
                                            {ReduceKind::kSum, 1, 7, 9}, {ReduceKind::kSum, 4, 1, 3},
                                            {ReduceKind::kSum, 2, 33, 2}};
  for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean, ReduceKind::kMax}) {
    for (ReduceParams p : shapes) {
      p.kind = kind;
      SCOPED_TRACE(Describe(p));
      const ReduceDims s{static_cast<int>(kind), p.outer, p.reduce, p.inner};
      const int64_t nx = p.outer * p.reduce * p.inner, ny = p.outer * p.inner;
      // Values on a coarse grid, so that maxima tie.
      std::vector<float> x = RandomVec(nx, 62, -2.0f, 2.0f);
      for (float& v : x) v = std::round(v * 2.0f) / 2.0f;
      const std::vector<float> dy = RandomVec(ny, 63);
      std::vector<float> want_y(ny), want_dx(nx), y(ny), dx(nx);
      std::vector<int32_t> argmax(ny, -1);
      reference::ReduceForward(p, x.data(), want_y.data());
      reference::ReduceBackward(p, x.data(), dy.data(), want_dx.data());
      for (int64_t o = 0; o < ny; ++o) y[o] = ReduceOutput(x.data(), s, o, &argmax[o]);
      for (int64_t i = 0; i < nx; ++i) dx[i] = ReduceInputGrad(dy.data(), argmax.data(), s, i);
      std::vector<double> wy(want_y.begin(), want_y.end()), wdx(want_dx.begin(), want_dx.end());
      EXPECT_TRUE(Close(y, wy, 1e-5)) << "y";
      EXPECT_TRUE(Close(dx, wdx, 1e-6)) << "dx";
    }
  }
}

// ReduceRowsKernel's max: 32 lanes stride a row, then combine in a butterfly with MaxCandidateWins; every lane
// must end with the serial loop's first maximum whatever lane found it.
TEST(ReduceMathTest, WarpMaxCombinationKeepsTheFirstMaximum) {
  for (int64_t reduce : {1, 5, 32, 33, 100, 1000}) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      std::vector<float> x = RandomVec(reduce, 64 + seed, -3.0f, 3.0f);
      for (float& v : x) v = std::round(v);  // many ties
      const ReduceDims s{kReduceMax, 1, reduce, 1};
      int32_t want = -1;
      const float want_y = ReduceOutput(x.data(), s, 0, &want);
      float best[32];
      int64_t best_r[32];
      for (int lane = 0; lane < 32; ++lane) {
        best[lane] = x[0];
        best_r[lane] = 0;
        for (int64_t r = lane; r < reduce; r += 32) {
          if (MaxCandidateWins(x[r], r, best[lane], best_r[lane])) {
            best[lane] = x[r];
            best_r[lane] = r;
          }
        }
      }
      for (int off = 16; off > 0; off >>= 1) {
        float nb[32];
        int64_t nr[32];
        for (int lane = 0; lane < 32; ++lane) {
          const int other = lane ^ off;
          const bool take = MaxCandidateWins(best[other], best_r[other], best[lane], best_r[lane]);
          nb[lane] = take ? best[other] : best[lane];
          nr[lane] = take ? best_r[other] : best_r[lane];
        }
        std::copy(nb, nb + 32, best);
        std::copy(nr, nr + 32, best_r);
      }
      for (int lane = 0; lane < 32; ++lane) {
        EXPECT_EQ(best[lane], want_y) << "reduce " << reduce << " seed " << seed << " lane " << lane;
        EXPECT_EQ(best_r[lane], want) << "reduce " << reduce << " seed " << seed << " lane " << lane;
      }
    }
  }
}

// ---- softmax ----

TEST(SoftmaxMathTest, ColumnsMatchTheReference) {
  for (bool log : {false, true}) {
    for (SoftmaxParams p : {SoftmaxParams{2, 5, 3}, SoftmaxParams{3, 7, 1}, SoftmaxParams{1, 40, 2},
                            SoftmaxParams{4, 1, 5}}) {
      p.log = log;
      SCOPED_TRACE(Describe(p));
      const int64_t n = p.outer * p.n * p.inner;
      const std::vector<float> x = RandomVec(n, 70, -8.0f, 8.0f), dy = RandomVec(n, 71);
      std::vector<float> want_y(n), want_dx(n), y(n, NAN), dx(n, NAN);
      reference::SoftmaxForward(p, x.data(), want_y.data());
      reference::SoftmaxBackward(p, want_y.data(), dy.data(), want_dx.data());
      for (int64_t c = 0; c < p.outer * p.inner; ++c) {
        const int64_t start = SoftmaxColumnStart(c, p.n, p.inner);
        SoftmaxColumnForward(x.data() + start, y.data() + start, p.n, p.inner, log);
      }
      std::vector<double> wy(want_y.begin(), want_y.end()), wdx(want_dx.begin(), want_dx.end());
      EXPECT_TRUE(Close(y, wy, 1e-5)) << "y (every element written once)";
      for (int64_t c = 0; c < p.outer * p.inner; ++c) {
        const int64_t start = SoftmaxColumnStart(c, p.n, p.inner);
        SoftmaxColumnBackward(want_y.data() + start, dy.data() + start, dx.data() + start, p.n, p.inner, log);
      }
      EXPECT_TRUE(Close(dx, wdx, 1e-5)) << "dx";
      // In place: dx in dy's buffer.
      std::vector<float> g = dy;
      for (int64_t c = 0; c < p.outer * p.inner; ++c) {
        const int64_t start = SoftmaxColumnStart(c, p.n, p.inner);
        SoftmaxColumnBackward(want_y.data() + start, g.data() + start, g.data() + start, p.n, p.inner, log);
      }
      EXPECT_EQ(g, dx) << "dx aliasing dy";
    }
  }
}

// ---- layer normalization ----

TEST(LayerNormMathTest, ForwardAndGradientsMatchTheReference) {
  for (LayerNormParams p : {LayerNormParams{5, 7, 1e-5f, true}, LayerNormParams{300, 3, 1e-3f, true},
                            LayerNormParams{4, 70, 1e-5f, false}, LayerNormParams{1, 1, 1e-5f, true}}) {
    SCOPED_TRACE(Describe(p));
    const int64_t n = p.rows * p.cols;
    const std::vector<float> x = RandomVec(n, 80, -2.0f, 3.0f), dy = RandomVec(n, 81);
    const std::vector<float> scale = RandomVec(p.cols, 82, 0.5f, 1.5f), bias = RandomVec(p.cols, 83);
    std::vector<float> want_y(n), mean(p.rows), var(p.rows), want_dx(n), want_ds(p.cols), want_db(p.cols);
    reference::LayerNormForward(p, x.data(), scale.data(), bias.data(), want_y.data(), mean.data(), var.data());
    reference::LayerNormBackward(p, x.data(), dy.data(), scale.data(), want_dx.data(), want_ds.data(),
                                 want_db.data());
    // Forward: the kernel's per-element formula with the row's statistics.
    std::vector<float> y(n);
    for (int64_t r = 0; r < p.rows; ++r) {
      const float inv_std = BatchNormInvStd(var[r], p.epsilon);
      for (int64_t c = 0; c < p.cols; ++c) {
        y[r * p.cols + c] =
            LayerNormValue(x[r * p.cols + c], mean[r], inv_std, scale[c], p.has_bias ? bias[c] : 0.0f);
      }
    }
    EXPECT_TRUE(Close(y, std::vector<double>(want_y.begin(), want_y.end()), 1e-5)) << "y";
    // The parameter gradients as the kernels run them: partial sums per (column, chunk), then the chunks in order.
    const ChunkSplit split = SplitReduction(p.cols, p.rows);
    const ColumnShape s{p.rows, static_cast<int>(p.cols), split.chunks, split.chunk_len};
    const int64_t total = s.chunks * s.channels;
    std::vector<double> sum_dy(total), sum_dy_xhat(total);
    for (int64_t t = 0; t < total; ++t) {
      LayerNormParamGradPartial(x.data(), dy.data(), mean.data(), var.data(), p.epsilon, s, t, &sum_dy[t],
                                &sum_dy_xhat[t]);
    }
    std::vector<float> ds(p.cols), db(p.cols, -7.0f);
    for (int c = 0; c < s.channels; ++c) {
      LayerNormParamGradFinal(sum_dy.data(), sum_dy_xhat.data(), s, c, ds.data(), p.has_bias ? db.data() : nullptr);
    }
    EXPECT_TRUE(Close(ds, std::vector<double>(want_ds.begin(), want_ds.end()), 1e-4)) << "dscale";
    if (p.has_bias) {
      EXPECT_TRUE(Close(db, std::vector<double>(want_db.begin(), want_db.end()), 1e-4)) << "dbias";
    } else {
      EXPECT_EQ(db, std::vector<float>(p.cols, -7.0f)) << "no bias: dbias untouched";
    }
    // dx: each row's two means, then the per-element formula.
    std::vector<float> dx(n);
    for (int64_t r = 0; r < p.rows; ++r) {
      const float inv_std = BatchNormInvStd(var[r], p.epsilon);
      double m1 = 0, m2 = 0;
      for (int64_t c = 0; c < p.cols; ++c) {
        const double dxhat = dy[r * p.cols + c] * scale[c];
        m1 += dxhat;
        m2 += dxhat * ((x[r * p.cols + c] - mean[r]) * inv_std);
      }
      for (int64_t c = 0; c < p.cols; ++c) {
        dx[r * p.cols + c] = LayerNormInputGrad(x[r * p.cols + c], dy[r * p.cols + c], scale[c], mean[r], inv_std,
                                                static_cast<float>(m1 / p.cols), static_cast<float>(m2 / p.cols));
      }
    }
    EXPECT_TRUE(Close(dx, std::vector<double>(want_dx.begin(), want_dx.end()), 1e-4)) << "dx";
  }
}

// ---- batched matrix products through column-major GEMMs ----

// What cublasSgemmStridedBatched computes, from its documentation: C = op(A) op(B) per batch entry, every matrix
// column-major with its leading dimension; checks the leading dimensions it would reject.
::testing::AssertionResult ColumnMajorGemm(const GemmPlan& g, int64_t batch, const float* a, const float* b,
                                           float* c) {
  if (g.ld_first < (g.trans_first ? g.k : g.m) || g.ld_second < (g.trans_second ? g.n : g.k) || g.ldc < g.m) {
    return ::testing::AssertionFailure() << "a leading dimension is too small";
  }
  for (int64_t t = 0; t < batch; ++t) {
    const float* at = a + t * g.stride_first;
    const float* bt = b + t * g.stride_second;
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0.0;
        for (int64_t l = 0; l < g.k; ++l) {
          const float av = g.trans_first ? at[l + i * g.ld_first] : at[i + l * g.ld_first];
          const float bv = g.trans_second ? bt[j + l * g.ld_second] : bt[l + j * g.ld_second];
          acc += static_cast<double>(av) * bv;
        }
        c[t * g.stride_c + i + j * g.ldc] = static_cast<float>(acc);
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(MatMulMathTest, GemmPlansGiveTheReferenceProducts) {
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      MatMulParams p;
      p.batch = 3;
      p.m = 4;
      p.n = 5;
      p.k = 6;
      p.trans_a = trans_a;
      p.trans_b = trans_b;
      SCOPED_TRACE(Describe(p));
      const int64_t na = p.batch * p.m * p.k, nb = p.batch * p.k * p.n, ny = p.batch * p.m * p.n;
      const std::vector<float> a = RandomVec(na, 90), b = RandomVec(nb, 91), dy = RandomVec(ny, 92);
      std::vector<float> want_y(ny), want_da(na), want_db(nb);
      reference::MatMulForward(p, a.data(), b.data(), want_y.data());
      reference::MatMulBackwardA(p, dy.data(), b.data(), want_da.data());
      reference::MatMulBackwardB(p, a.data(), dy.data(), want_db.data());
      const float* operands[3] = {a.data(), b.data(), dy.data()};  // MatMulOperand's order
      const std::vector<std::pair<int, std::vector<float>*>> passes = {
          {kMatMulForward, &want_y}, {kMatMulBackwardA, &want_da}, {kMatMulBackwardB, &want_db}};
      for (const auto& [pass, want] : passes) {
        const MatMulGemm g = PlanMatMul(pass, p.m, p.n, p.k, p.trans_a, p.trans_b);
        EXPECT_EQ(g.plan.stride_c * p.batch, static_cast<int64_t>(want->size())) << "pass " << pass;
        std::vector<float> got(want->size(), NAN);
        ASSERT_TRUE(ColumnMajorGemm(g.plan, p.batch, operands[g.first], operands[g.second], got.data()))
            << "pass " << pass;
        EXPECT_TRUE(Close(got, std::vector<double>(want->begin(), want->end()), 1e-5)) << "pass " << pass;
      }
    }
  }
}

}  // namespace
}  // namespace dtrain::kernels::cuda
