// The CPU backend's tensor ops of imported graphs (kernels/tensor_ops.h) against the reference loops, with
// central-difference checks of every backward: strided copies (transposes, slices, broadcasts, accumulation),
// reductions (sum, mean, max), softmax and log-softmax along any axis, layer normalization and batched matrix
// products of two tensors with either operand transposed.
#include <cmath>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_test_util.h"
#include "kernels/reference_ops.h"

namespace dtrain::kernels::testing {
namespace {

class TensorOpsTest : public CpuDeviceTest {};

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

// Row-major strides of dims permuted: the source strides that read a row-major tensor of `dims` in the order
// `perm` (a transpose into a row-major destination of the permuted dims).
StridedCopyParams Permute(const std::vector<int64_t>& dims, const std::vector<int>& perm) {
  std::vector<int64_t> stride(dims.size(), 1);
  for (int k = static_cast<int>(dims.size()) - 2; k >= 0; --k) stride[k] = stride[k + 1] * dims[k + 1];
  std::vector<int64_t> out_dims, src;
  for (int k : perm) {
    out_dims.push_back(dims[k]);
    src.push_back(stride[k]);
  }
  std::vector<int64_t> dst(dims.size(), 1);
  for (int k = static_cast<int>(dims.size()) - 2; k >= 0; --k) dst[k] = dst[k + 1] * out_dims[k + 1];
  return Copy(out_dims, src, dst);
}

TEST_P(TensorOpsTest, StridedCopiesMatchReference) {
  const std::vector<std::tuple<std::string, StridedCopyParams, int64_t, int64_t>> cases = {
      {"transpose [3,5] -> [5,3]", Permute({3, 5}, {1, 0}), 15, 15},
      {"transpose [197,64,96]", Permute({197, 64, 96}, {1, 0, 2}), 197 * 64 * 96, 197 * 64 * 96},
      {"NHWC -> NCHW [4,14,14,40]", Permute({4, 14, 14, 40}, {0, 3, 1, 2}), 4 * 14 * 14 * 40, 4 * 14 * 14 * 40},
      {"window partition", Permute({2, 8, 7, 8, 7, 24}, {0, 1, 3, 2, 4, 5}), 2 * 56 * 56 * 24, 2 * 56 * 56 * 24},
      {"heads [2,50,3,12,64] -> [3,2,12,50,64]", Permute({2, 50, 3, 12, 64}, {2, 0, 3, 1, 4}), 2 * 50 * 3 * 12 * 64,
       2 * 50 * 3 * 12 * 64},
      {"slice x[:, 2:5] of [9, 8]", Copy({9, 3}, {8, 1}, {3, 1}), 72, 27},
      {"step-2 slice of rows and columns", Copy({4, 4, 3}, {2 * 8 * 3, 2 * 3, 1}, {12, 3, 1}), 8 * 8 * 3, 48},
      {"broadcast [1, 5] -> [7, 5]", Copy({7, 5}, {0, 1}, {5, 1}), 5, 35},
      {"broadcast a column [6, 1] -> [6, 4]", Copy({6, 4}, {1, 0}, {4, 1}), 6, 24},
      {"concat block into [10, 12]", Copy({10, 5}, {5, 1}, {12, 1}), 50, 120},
      {"size-1 and empty dims", Copy({1, 3, 1}, {9, 1, 4}, {3, 1, 3}), 3, 3},
  };
  for (const auto& [name, p, src_n, dst_n] : cases) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(CheckStridedCopyParams("test", p).ok());
    const std::vector<float> src = RandomVector(src_n, 1), base = RandomVector(dst_n, 2);
    for (bool accumulate : {false, true}) {
      float *ds = Upload(src), *dd = Upload(base);
      ASSERT_TRUE(dev_->StridedCopy(p, ds, dd, accumulate).ok());
      std::vector<float> want = base;
      reference::StridedCopy(p, src.data(), want.data(), accumulate);
      EXPECT_ARRAYS_NEAR(Download(dd, dst_n), want, accumulate ? 1e-7 : 0, 0);
    }
  }
}

TEST_P(TensorOpsTest, StridedCopyRejectsBadParams) {
  float* buf = Zeros(64);
  EXPECT_EQ(dev_->StridedCopy(Copy({4, 4}, {4, 1}, {0, 1}), buf, buf + 32, false).code(),
            absl::StatusCode::kInvalidArgument);  // destination stride 0: elements written twice
  EXPECT_EQ(dev_->StridedCopy(Copy({4, 4}, {4, 1}, {2, 1}), buf, buf + 32, false).code(),
            absl::StatusCode::kInvalidArgument);  // overlapping destination rows
  EXPECT_EQ(dev_->StridedCopy(Copy({-1}, {1}, {1}), buf, buf + 32, false).code(), absl::StatusCode::kInvalidArgument);
  StridedCopyParams too_deep;
  too_deep.rank = kMaxCopyRank + 1;
  EXPECT_EQ(dev_->StridedCopy(too_deep, buf, buf + 32, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(dev_->StridedCopy(Copy({0, 4}, {4, 1}, {4, 1}), buf, buf + 32, false).ok());  // nothing to copy
}

// Checks an op's input gradient by central differences of L = sum(forward(x) * r).
void CheckInputGradient(CpuDeviceTest* t, const std::vector<float>& x, const std::vector<float>& analytic,
                        const std::vector<float>& r, const std::function<std::vector<float>(const std::vector<float>&)>& fwd,
                        double step = 1e-2) {
  GradCheckOptions opt;
  opt.step = step;
  opt.max_coords = 60;
  EXPECT_GRADIENT_OK(CheckGradient(x, analytic, [&](const std::vector<float>& v) { return Dot(fwd(v), r); }, opt));
}

TEST_P(TensorOpsTest, ReduceMatchesReferenceAndFiniteDifferences) {
  for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean, ReduceKind::kMax}) {
    for (auto [outer, reduce, inner] : {std::tuple<int64_t, int64_t, int64_t>{3, 7, 1}, {2, 5, 9}, {1, 40000, 1},
                                        {64, 49, 40}, {5, 1, 3}}) {
      const ReduceParams p{kind, outer, reduce, inner};
      SCOPED_TRACE(Describe(p));
      auto op = dev_->MakeReduce(p);
      ASSERT_TRUE(op.ok()) << op.status();
      const int64_t nx = outer * reduce * inner, ny = outer * inner;
      const std::vector<float> x = RandomVector(nx, 1, -2.0f, 2.0f), r = RandomVector(ny, 2);
      float *dx = Upload(x), *dy = Zeros(ny), *dr = Upload(r), *dgx = Upload(RandomVector(nx, 3));
      ASSERT_TRUE((*op)->Forward(dx, dy).ok());
      ASSERT_TRUE((*op)->Backward(dr, dgx).ok());
      std::vector<float> y_ref(ny), gx_ref(nx);
      reference::ReduceForward(p, x.data(), y_ref.data());
      reference::ReduceBackward(p, x.data(), r.data(), gx_ref.data());
      EXPECT_ARRAYS_NEAR(Download(dy, ny), y_ref, 1e-5, 1e-5);
      EXPECT_ARRAYS_NEAR(Download(dgx, nx), gx_ref, 1e-6, 1e-7);
      if (nx > 5000) continue;
      // Max is piecewise linear: steps smaller than the gaps between the random values keep the winners.
      float* probe = Zeros(nx);
      CheckInputGradient(this, x, Download(dgx, nx), r, [&](const std::vector<float>& v) {
        Write(v, probe);
        EXPECT_TRUE((*op)->Forward(probe, dy).ok());
        return Download(dy, ny);
      }, kind == ReduceKind::kMax ? 1e-4 : 1e-2);
      ASSERT_TRUE((*op)->Forward(dx, dy).ok());  // the argmax of x again
    }
  }
  EXPECT_EQ(dev_->MakeReduce({ReduceKind::kSum, 0, 3, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_P(TensorOpsTest, SoftmaxMatchesReferenceAndFiniteDifferences) {
  for (bool log : {false, true}) {
    for (auto [outer, n, inner] : {std::tuple<int64_t, int64_t, int64_t>{4, 10, 1}, {2, 7, 5}, {192, 197, 1},
                                   {1, 3, 16}}) {
      const SoftmaxParams p{outer, n, inner, log};
      SCOPED_TRACE(Describe(p));
      auto op = dev_->MakeSoftmax(p);
      ASSERT_TRUE(op.ok()) << op.status();
      const int64_t size = outer * n * inner;
      const std::vector<float> x = RandomVector(size, 1, -3.0f, 3.0f), r = RandomVector(size, 2);
      float *dx = Upload(x), *dy = Zeros(size), *dr = Upload(r), *dgx = Zeros(size);
      ASSERT_TRUE((*op)->Forward(dx, dy).ok());
      ASSERT_TRUE((*op)->Backward(dy, dr, dgx).ok());
      std::vector<float> y_ref(size), gx_ref(size);
      reference::SoftmaxForward(p, x.data(), y_ref.data());
      const std::vector<float> y = Download(dy, size);
      reference::SoftmaxBackward(p, y.data(), r.data(), gx_ref.data());
      EXPECT_ARRAYS_NEAR(y, y_ref, 1e-5, 1e-6);
      EXPECT_ARRAYS_NEAR(Download(dgx, size), gx_ref, 1e-4, 1e-6);
      ASSERT_TRUE((*op)->Backward(dy, dr, dr).ok());  // dx == dy
      EXPECT_ARRAYS_NEAR(Download(dr, size), gx_ref, 1e-4, 1e-6);
      if (size > 5000) continue;
      float* probe = Zeros(size);
      CheckInputGradient(this, x, Download(dgx, size), r, [&](const std::vector<float>& v) {
        Write(v, probe);
        EXPECT_TRUE((*op)->Forward(probe, dy).ok());
        return Download(dy, size);
      });
    }
  }
}

TEST_P(TensorOpsTest, LayerNormMatchesReferenceAndFiniteDifferences) {
  for (bool has_bias : {true, false}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{6, 16}, {3, 7}, {64 * 65, 192}, {2, 768}}) {
      const LayerNormParams p{rows, cols, 1e-6f, has_bias};
      SCOPED_TRACE(Describe(p));
      auto op = dev_->MakeLayerNorm(p);
      ASSERT_TRUE(op.ok()) << op.status();
      const int64_t n = rows * cols;
      // Rows with an offset and scale of their own, as activations have.
      std::vector<float> x = RandomVector(n, 1, -1.0f, 1.0f);
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] * (1.0f + i / cols % 3) + 0.5f * (i / cols % 5);
      const std::vector<float> scale = RandomVector(cols, 2, 0.5f, 1.5f), bias = RandomVector(cols, 3);
      const std::vector<float> r = RandomVector(n, 4);
      float *dx = Upload(x), *dscale = Upload(scale), *dbias = Upload(bias), *dy = Zeros(n);
      float *mean = Zeros(rows), *var = Zeros(rows), *dr = Upload(r), *dgx = Zeros(n);
      float *dgs = Zeros(cols), *dgb = Zeros(cols);
      ASSERT_TRUE((*op)->Forward(dx, dscale, has_bias ? dbias : nullptr, dy, mean, var).ok());
      absl::Status bs = (*op)->Backward(dx, dr, dscale, mean, var, dgx, dgs, has_bias ? dgb : nullptr);
      ASSERT_TRUE(bs.ok()) << bs;
      std::vector<float> y_ref(n), mean_ref(rows), var_ref(rows), gx_ref(n), gs_ref(cols), gb_ref(cols);
      reference::LayerNormForward(p, x.data(), scale.data(), bias.data(), y_ref.data(), mean_ref.data(),
                                  var_ref.data());
      reference::LayerNormBackward(p, x.data(), r.data(), scale.data(), gx_ref.data(), gs_ref.data(), gb_ref.data());
      EXPECT_ARRAYS_NEAR(Download(dy, n), y_ref, 1e-4, 1e-5);
      EXPECT_ARRAYS_NEAR(Download(mean, rows), mean_ref, 1e-5, 1e-6);
      EXPECT_ARRAYS_NEAR(Download(var, rows), var_ref, 1e-4, 1e-6);
      EXPECT_ARRAYS_NEAR(Download(dgx, n), gx_ref, 1e-3, 1e-5);
      EXPECT_ARRAYS_NEAR(Download(dgs, cols), gs_ref, 1e-3, 1e-4);
      if (has_bias) EXPECT_ARRAYS_NEAR(Download(dgb, cols), gb_ref, 1e-4, 1e-4);
      if (n > 5000) continue;
      // Finite differences for x, scale and bias.
      float* probe = Zeros(std::max(n, cols));
      auto forward = [&](const float* in, const float* s, const float* b) {
        EXPECT_TRUE((*op)->Forward(in, s, has_bias ? b : nullptr, dy, mean, var).ok());
        return Download(dy, n);
      };
      CheckInputGradient(this, x, Download(dgx, n), r, [&](const std::vector<float>& v) {
        Write(v, probe);
        return forward(probe, dscale, dbias);
      });
      CheckInputGradient(this, scale, Download(dgs, cols), r, [&](const std::vector<float>& v) {
        Write(v, probe);
        return forward(dx, probe, dbias);
      });
      if (has_bias) {
        CheckInputGradient(this, bias, Download(dgb, cols), r, [&](const std::vector<float>& v) {
          Write(v, probe);
          return forward(dx, dscale, probe);
        });
      }
    }
  }
}

TEST_P(TensorOpsTest, MatMulMatchesReferenceAndFiniteDifferences) {
  for (auto [batch, m, n, k] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 3, 4, 5}, {6, 7, 5, 3},
                                {2 * 3, 50, 50, 64}, {4, 1, 9, 2}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const MatMulParams p{batch, m, n, k, ta, tb};
        SCOPED_TRACE(Describe(p));
        auto op = dev_->MakeMatMul(p);
        ASSERT_TRUE(op.ok()) << op.status();
        const int64_t na = batch * m * k, nb = batch * k * n, ny = batch * m * n;
        const std::vector<float> a = RandomVector(na, 1), b = RandomVector(nb, 2), r = RandomVector(ny, 3);
        float *da = Upload(a), *db = Upload(b), *dy = Zeros(ny), *dr = Upload(r), *dga = Zeros(na),
              *dgb = Zeros(nb);
        ASSERT_TRUE((*op)->Forward(da, db, dy).ok());
        ASSERT_TRUE((*op)->BackwardA(dr, db, dga).ok());
        ASSERT_TRUE((*op)->BackwardB(da, dr, dgb).ok());
        std::vector<float> y_ref(ny), ga_ref(na), gb_ref(nb);
        reference::MatMulForward(p, a.data(), b.data(), y_ref.data());
        reference::MatMulBackwardA(p, r.data(), b.data(), ga_ref.data());
        reference::MatMulBackwardB(p, a.data(), r.data(), gb_ref.data());
        EXPECT_ARRAYS_NEAR(Download(dy, ny), y_ref, 1e-5, 1e-5);
        EXPECT_ARRAYS_NEAR(Download(dga, na), ga_ref, 1e-5, 1e-5);
        EXPECT_ARRAYS_NEAR(Download(dgb, nb), gb_ref, 1e-5, 1e-5);
        if (ny > 5000) continue;
        float* probe = Zeros(std::max(na, nb));
        CheckInputGradient(this, a, Download(dga, na), r, [&](const std::vector<float>& v) {
          Write(v, probe);
          EXPECT_TRUE((*op)->Forward(probe, db, dy).ok());
          return Download(dy, ny);
        });
        CheckInputGradient(this, b, Download(dgb, nb), r, [&](const std::vector<float>& v) {
          Write(v, probe);
          EXPECT_TRUE((*op)->Forward(da, probe, dy).ok());
          return Download(dy, ny);
        });
      }
    }
  }
  EXPECT_EQ(dev_->MakeMatMul({1, 0, 3, 3}).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Threads, TensorOpsTest, ::testing::Values(1, 2));

}  // namespace
}  // namespace dtrain::kernels::testing
