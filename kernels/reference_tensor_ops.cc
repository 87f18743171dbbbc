// Reference loops for the tensor ops of imported graphs (kernels/tensor_ops.h, kernels/reference_ops.h):
// strided copies, reductions, softmax, layer normalization and batched matrix products, accumulating in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/reference_ops.h"

namespace dtrain::kernels::reference {

void StridedCopy(const StridedCopyParams& p, const float* src, float* dst, bool accumulate) {
  const int64_t n = p.count();
  std::vector<int64_t> idx(p.rank, 0);
  for (int64_t e = 0; e < n; ++e) {
    int64_t s = 0, d = 0;
    for (int k = 0; k < p.rank; ++k) {
      s += idx[k] * p.src_strides[k];
      d += idx[k] * p.dst_strides[k];
    }
    dst[d] = accumulate ? dst[d] + src[s] : src[s];
    for (int k = p.rank - 1; k >= 0; --k) {
      if (++idx[k] < p.dims[k]) break;
      idx[k] = 0;
    }
  }
}

namespace {

// The first maximum of group (o, i): its r.
int64_t ArgMax(const ReduceParams& p, const float* x, int64_t o, int64_t i) {
  int64_t best = 0;
  for (int64_t r = 1; r < p.reduce; ++r) {
    if (x[(o * p.reduce + r) * p.inner + i] > x[(o * p.reduce + best) * p.inner + i]) best = r;
  }
  return best;
}

}  // namespace

void ReduceForward(const ReduceParams& p, const float* x, float* y) {
  for (int64_t o = 0; o < p.outer; ++o)
    for (int64_t i = 0; i < p.inner; ++i) {
      if (p.kind == ReduceKind::kMax) {
        y[o * p.inner + i] = x[(o * p.reduce + ArgMax(p, x, o, i)) * p.inner + i];
        continue;
      }
      double sum = 0;
      for (int64_t r = 0; r < p.reduce; ++r) sum += x[(o * p.reduce + r) * p.inner + i];
      y[o * p.inner + i] = static_cast<float>(p.kind == ReduceKind::kMean ? sum / p.reduce : sum);
    }
}

void ReduceBackward(const ReduceParams& p, const float* x, const float* dy, float* dx) {
  for (int64_t o = 0; o < p.outer; ++o)
    for (int64_t i = 0; i < p.inner; ++i) {
      const double g = dy[o * p.inner + i];
      const int64_t best = p.kind == ReduceKind::kMax ? ArgMax(p, x, o, i) : -1;
      for (int64_t r = 0; r < p.reduce; ++r) {
        double v = g;
        if (p.kind == ReduceKind::kMean) v = g / p.reduce;
        if (p.kind == ReduceKind::kMax) v = r == best ? g : 0.0;
        dx[(o * p.reduce + r) * p.inner + i] = static_cast<float>(v);
      }
    }
}

void SoftmaxForward(const SoftmaxParams& p, const float* x, float* y) {
  for (int64_t o = 0; o < p.outer; ++o)
    for (int64_t i = 0; i < p.inner; ++i) {
      auto at = [&](int64_t j) { return (o * p.n + j) * p.inner + i; };
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < p.n; ++j) m = std::max<double>(m, x[at(j)]);
      double sum = 0;
      for (int64_t j = 0; j < p.n; ++j) sum += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < p.n; ++j) {
        y[at(j)] = static_cast<float>(p.log ? x[at(j)] - m - std::log(sum) : std::exp(x[at(j)] - m) / sum);
      }
    }
}

void SoftmaxBackward(const SoftmaxParams& p, const float* y, const float* dy, float* dx) {
  for (int64_t o = 0; o < p.outer; ++o)
    for (int64_t i = 0; i < p.inner; ++i) {
      auto at = [&](int64_t j) { return (o * p.n + j) * p.inner + i; };
      double s = 0;
      for (int64_t j = 0; j < p.n; ++j) s += p.log ? dy[at(j)] : static_cast<double>(dy[at(j)]) * y[at(j)];
      std::vector<double> g(p.n);
      for (int64_t j = 0; j < p.n; ++j) {
        g[j] = p.log ? dy[at(j)] - std::exp(static_cast<double>(y[at(j)])) * s : y[at(j)] * (dy[at(j)] - s);
      }
      for (int64_t j = 0; j < p.n; ++j) dx[at(j)] = static_cast<float>(g[j]);
    }
}

void LayerNormForward(const LayerNormParams& p, const float* x, const float* scale, const float* bias, float* y,
                      float* mean, float* var) {
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* row = x + r * p.cols;
    double sum = 0;
    for (int64_t c = 0; c < p.cols; ++c) sum += row[c];
    const double mu = sum / p.cols;
    double sq = 0;
    for (int64_t c = 0; c < p.cols; ++c) sq += (row[c] - mu) * (row[c] - mu);
    const double inv = 1.0 / std::sqrt(sq / p.cols + p.epsilon);
    for (int64_t c = 0; c < p.cols; ++c) {
      y[r * p.cols + c] = static_cast<float>((row[c] - mu) * inv * scale[c] + (p.has_bias ? bias[c] : 0.0f));
    }
    if (mean != nullptr) mean[r] = static_cast<float>(mu);
    if (var != nullptr) var[r] = static_cast<float>(sq / p.cols);
  }
}

void LayerNormBackward(const LayerNormParams& p, const float* x, const float* dy, const float* scale, float* dx,
                       float* dscale, float* dbias) {
  std::vector<double> gs(p.cols, 0.0), gb(p.cols, 0.0);
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* row = x + r * p.cols;
    const float* g = dy + r * p.cols;
    double sum = 0;
    for (int64_t c = 0; c < p.cols; ++c) sum += row[c];
    const double mu = sum / p.cols;
    double sq = 0;
    for (int64_t c = 0; c < p.cols; ++c) sq += (row[c] - mu) * (row[c] - mu);
    const double inv = 1.0 / std::sqrt(sq / p.cols + p.epsilon);
    // dxhat = dy scale; dx = inv (dxhat - mean(dxhat) - xhat mean(dxhat xhat)).
    double m1 = 0, m2 = 0;
    for (int64_t c = 0; c < p.cols; ++c) {
      const double xhat = (row[c] - mu) * inv;
      const double dxhat = static_cast<double>(g[c]) * scale[c];
      m1 += dxhat;
      m2 += dxhat * xhat;
      gs[c] += g[c] * xhat;
      gb[c] += g[c];
    }
    m1 /= p.cols;
    m2 /= p.cols;
    for (int64_t c = 0; c < p.cols; ++c) {
      const double xhat = (row[c] - mu) * inv;
      dx[r * p.cols + c] = static_cast<float>(inv * (static_cast<double>(g[c]) * scale[c] - m1 - xhat * m2));
    }
  }
  for (int64_t c = 0; c < p.cols; ++c) {
    dscale[c] = static_cast<float>(gs[c]);
    if (p.has_bias && dbias != nullptr) dbias[c] = static_cast<float>(gb[c]);
  }
}

namespace {

// Element (i, j) of op(a[b]) ([m, k]) and op(b[b]) ([k, n]).
float A(const MatMulParams& p, const float* a, int64_t b, int64_t i, int64_t j) {
  return p.trans_a ? a[(b * p.k + j) * p.m + i] : a[(b * p.m + i) * p.k + j];
}
float B(const MatMulParams& p, const float* m, int64_t b, int64_t i, int64_t j) {
  return p.trans_b ? m[(b * p.n + j) * p.k + i] : m[(b * p.k + i) * p.n + j];
}

}  // namespace

void MatMulForward(const MatMulParams& p, const float* a, const float* b, float* y) {
  for (int64_t t = 0; t < p.batch; ++t)
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t j = 0; j < p.n; ++j) {
        double s = 0;
        for (int64_t l = 0; l < p.k; ++l) s += static_cast<double>(A(p, a, t, i, l)) * B(p, b, t, l, j);
        y[(t * p.m + i) * p.n + j] = static_cast<float>(s);
      }
}

void MatMulBackwardA(const MatMulParams& p, const float* dy, const float* b, float* da) {
  // d op(a)[i, l] = sum_j dy[i, j] op(b)[l, j], stored in a's layout.
  for (int64_t t = 0; t < p.batch; ++t)
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t l = 0; l < p.k; ++l) {
        double s = 0;
        for (int64_t j = 0; j < p.n; ++j) s += static_cast<double>(dy[(t * p.m + i) * p.n + j]) * B(p, b, t, l, j);
        (p.trans_a ? da[(t * p.k + l) * p.m + i] : da[(t * p.m + i) * p.k + l]) = static_cast<float>(s);
      }
}

void MatMulBackwardB(const MatMulParams& p, const float* a, const float* dy, float* db) {
  // d op(b)[l, j] = sum_i op(a)[i, l] dy[i, j], stored in b's layout.
  for (int64_t t = 0; t < p.batch; ++t)
    for (int64_t l = 0; l < p.k; ++l)
      for (int64_t j = 0; j < p.n; ++j) {
        double s = 0;
        for (int64_t i = 0; i < p.m; ++i) s += static_cast<double>(A(p, a, t, i, l)) * dy[(t * p.m + i) * p.n + j];
        (p.trans_b ? db[(t * p.n + j) * p.k + l] : db[(t * p.k + l) * p.n + j]) = static_cast<float>(s);
      }
}

}  // namespace dtrain::kernels::reference
