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
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/kernel_shapes.h"
#include "kernels/cuda/op_math.h"
#include "kernels/device.h"

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
  const std::vector<ActivationArgs> kinds = {{kActLeakyRelu, 0.1f, 0, 0}, {kActClip, 0, -0.5f, 0.7f},
                                             {kActSigmoid, 0, 0, 0},      {kActTanh, 0, 0, 0}};
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

}  // namespace
}  // namespace dtrain::kernels::cuda
