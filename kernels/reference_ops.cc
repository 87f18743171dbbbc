#include "kernels/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/dropout_rng.h"

namespace dtrain::kernels::reference {
namespace {

// Index helpers for NHWC activations.
inline int64_t Nhwc(int n, int h, int w, int c, int H, int W, int C) {
  return ((static_cast<int64_t>(n) * H + h) * W + w) * C + c;
}

// Index of the filter element linking output channel oc to input channel icg of its group at (kh, kw).
inline int64_t WeightIndex(const Conv2DParams& p, int oc, int icg, int kh, int kw) {
  const int icpg = p.in_c / p.groups;
  if (p.weight_layout == WeightLayout::kOIHW) {
    return ((static_cast<int64_t>(oc) * icpg + icg) * p.k_h + kh) * p.k_w + kw;
  }
  return ((static_cast<int64_t>(kh) * p.k_w + kw) * icpg + icg) * p.out_c + oc;
}

// Calls fn(x index, w index, y index) for every (input, filter, output) triple of the convolution that does
// not fall in the padding.
template <typename Fn>
void ForEachConvTap(const Conv2DParams& p, Fn fn) {
  const int oh_n = p.out_h(), ow_n = p.out_w();
  const int pad_top = p.pads_h().before, pad_left = p.pads_w().before;
  const int icpg = p.in_c / p.groups, ocpg = p.out_c / p.groups;
  for (int n = 0; n < p.batch; ++n)
    for (int oh = 0; oh < oh_n; ++oh)
      for (int ow = 0; ow < ow_n; ++ow)
        for (int oc = 0; oc < p.out_c; ++oc) {
          const int group = oc / ocpg;
          for (int kh = 0; kh < p.k_h; ++kh) {
            const int ih = oh * p.stride_h - pad_top + kh * p.dilation_h;
            if (ih < 0 || ih >= p.in_h) continue;
            for (int kw = 0; kw < p.k_w; ++kw) {
              const int iw = ow * p.stride_w - pad_left + kw * p.dilation_w;
              if (iw < 0 || iw >= p.in_w) continue;
              for (int icg = 0; icg < icpg; ++icg) {
                fn(Nhwc(n, ih, iw, group * icpg + icg, p.in_h, p.in_w, p.in_c), WeightIndex(p, oc, icg, kh, kw),
                   Nhwc(n, oh, ow, oc, oh_n, ow_n, p.out_c));
              }
            }
          }
        }
}

int64_t ConvOutSize(const Conv2DParams& p) { return static_cast<int64_t>(p.batch) * p.out_h() * p.out_w() * p.out_c; }

}  // namespace

void Conv2DForward(const Conv2DParams& p, const float* x, const float* w, const float* b, float* y) {
  const int64_t ny = ConvOutSize(p);
  std::vector<double> acc(ny);
  for (int64_t i = 0; i < ny; ++i) acc[i] = p.has_bias ? b[i % p.out_c] : 0.0;
  ForEachConvTap(p, [&](int64_t xi, int64_t wi, int64_t yi) { acc[yi] += static_cast<double>(x[xi]) * w[wi]; });
  for (int64_t i = 0; i < ny; ++i) y[i] = static_cast<float>(acc[i]);
}

void Conv2DBackwardData(const Conv2DParams& p, const float* dy, const float* w, float* dx) {
  std::vector<double> acc(static_cast<size_t>(p.batch) * p.in_h * p.in_w * p.in_c, 0.0);
  ForEachConvTap(p, [&](int64_t xi, int64_t wi, int64_t yi) { acc[xi] += static_cast<double>(dy[yi]) * w[wi]; });
  for (size_t i = 0; i < acc.size(); ++i) dx[i] = static_cast<float>(acc[i]);
}

void Conv2DBackwardWeights(const Conv2DParams& p, const float* x, const float* dy, float* dw, float* db) {
  std::vector<double> acc_w(p.weights_size(), 0.0);
  ForEachConvTap(p, [&](int64_t xi, int64_t wi, int64_t yi) { acc_w[wi] += static_cast<double>(dy[yi]) * x[xi]; });
  for (size_t i = 0; i < acc_w.size(); ++i) dw[i] = static_cast<float>(acc_w[i]);
  if (!p.has_bias || db == nullptr) return;
  std::vector<double> acc_b(p.out_c, 0.0);
  const int64_t ny = ConvOutSize(p);
  for (int64_t i = 0; i < ny; ++i) acc_b[i % p.out_c] += dy[i];
  for (int oc = 0; oc < p.out_c; ++oc) db[oc] = static_cast<float>(acc_b[oc]);
}

namespace {

// Calls fn(input_index) for every in-bounds input of output (n, oh, ow, c), in row-major window order.
template <typename Fn>
void ForEachInWindow(const PoolParams& p, int n, int oh, int ow, int c, Fn fn) {
  const int ph = p.pads_h().before, pw = p.pads_w().before;
  for (int kh = 0; kh < p.kh(); ++kh) {
    const int ih = oh * p.sh() - ph + kh;
    if (ih < 0 || ih >= p.in_h) continue;
    for (int kw = 0; kw < p.kw(); ++kw) {
      const int iw = ow * p.sw() - pw + kw;
      if (iw < 0 || iw >= p.in_w) continue;
      fn(Nhwc(n, ih, iw, c, p.in_h, p.in_w, p.channels));
    }
  }
}

// Index of the first maximal in-bounds input of an output's window.
int64_t ArgMax(const PoolParams& p, const float* x, int n, int oh, int ow, int c) {
  int64_t best = -1;
  ForEachInWindow(p, n, oh, ow, c, [&](int64_t i) {
    if (best < 0 || x[i] > x[best]) best = i;
  });
  return best;
}

// The divisor of an average-pooling output (see AvgPoolForward in the header).
int AvgDivisor(const PoolParams& p, int oh, int ow) {
  if (!p.count_include_pad) {
    int count = 0;
    ForEachInWindow(p, 0, oh, ow, 0, [&](int64_t) { ++count; });
    return count;
  }
  const int h0 = oh * p.sh() - p.pads_h().before, w0 = ow * p.sw() - p.pads_w().before;
  const int h1 = std::min(h0 + p.kh(), p.in_h + p.pads_h().after);
  const int w1 = std::min(w0 + p.kw(), p.in_w + p.pads_w().after);
  return (h1 - h0) * (w1 - w0);
}

}  // namespace

void MaxPoolForward(const PoolParams& p, const float* x, float* y) {
  const int oh_n = p.out_h(), ow_n = p.out_w();
  for (int n = 0; n < p.batch; ++n)
    for (int oh = 0; oh < oh_n; ++oh)
      for (int ow = 0; ow < ow_n; ++ow)
        for (int c = 0; c < p.channels; ++c)
          y[Nhwc(n, oh, ow, c, oh_n, ow_n, p.channels)] = x[ArgMax(p, x, n, oh, ow, c)];
}

void MaxPoolBackward(const PoolParams& p, const float* x, const float* dy, float* dx) {
  const int oh_n = p.out_h(), ow_n = p.out_w();
  std::fill(dx, dx + static_cast<int64_t>(p.batch) * p.in_h * p.in_w * p.channels, 0.0f);
  for (int n = 0; n < p.batch; ++n)
    for (int oh = 0; oh < oh_n; ++oh)
      for (int ow = 0; ow < ow_n; ++ow)
        for (int c = 0; c < p.channels; ++c)
          dx[ArgMax(p, x, n, oh, ow, c)] += dy[Nhwc(n, oh, ow, c, oh_n, ow_n, p.channels)];
}

void AvgPoolForward(const PoolParams& p, const float* x, float* y) {
  const int oh_n = p.out_h(), ow_n = p.out_w();
  for (int n = 0; n < p.batch; ++n)
    for (int oh = 0; oh < oh_n; ++oh)
      for (int ow = 0; ow < ow_n; ++ow)
        for (int c = 0; c < p.channels; ++c) {
          double sum = 0;
          ForEachInWindow(p, n, oh, ow, c, [&](int64_t i) { sum += x[i]; });
          y[Nhwc(n, oh, ow, c, oh_n, ow_n, p.channels)] = static_cast<float>(sum / AvgDivisor(p, oh, ow));
        }
}

void AvgPoolBackward(const PoolParams& p, const float* dy, float* dx) {
  const int oh_n = p.out_h(), ow_n = p.out_w();
  std::vector<double> acc(static_cast<size_t>(p.batch) * p.in_h * p.in_w * p.channels, 0.0);
  for (int n = 0; n < p.batch; ++n)
    for (int oh = 0; oh < oh_n; ++oh)
      for (int ow = 0; ow < ow_n; ++ow)
        for (int c = 0; c < p.channels; ++c) {
          const double g = static_cast<double>(dy[Nhwc(n, oh, ow, c, oh_n, ow_n, p.channels)]) / AvgDivisor(p, oh, ow);
          ForEachInWindow(p, n, oh, ow, c, [&](int64_t i) { acc[i] += g; });
        }
  for (size_t i = 0; i < acc.size(); ++i) dx[i] = static_cast<float>(acc[i]);
}

namespace {

// N_c = bias + alpha * sum of x^2 over the channel window around c, for one pixel's channel vector.
std::vector<double> LrnNorm(const LrnParams& p, const float* px) {
  std::vector<double> norm(p.channels);
  for (int c = 0; c < p.channels; ++c) {
    double s = 0;
    for (int j = std::max(0, c - p.depth_radius); j <= std::min(p.channels - 1, c + p.depth_radius); ++j)
      s += static_cast<double>(px[j]) * px[j];
    norm[c] = p.bias + p.alpha * s;
  }
  return norm;
}

}  // namespace

void LrnForward(const LrnParams& p, const float* x, float* y) {
  const int64_t pixels = static_cast<int64_t>(p.batch) * p.h * p.w;
  for (int64_t q = 0; q < pixels; ++q) {
    const float* px = x + q * p.channels;
    const std::vector<double> norm = LrnNorm(p, px);
    for (int c = 0; c < p.channels; ++c)
      y[q * p.channels + c] = static_cast<float>(px[c] * std::pow(norm[c], -p.beta));
  }
}

void LrnBackward(const LrnParams& p, const float* x, const float* dy, float* dx) {
  // y_i = x_i N_i^-b  =>  dx_j = dy_j N_j^-b - 2 a b x_j sum_{i: |i-j| <= r} dy_i x_i N_i^(-b-1).
  const int64_t pixels = static_cast<int64_t>(p.batch) * p.h * p.w;
  for (int64_t q = 0; q < pixels; ++q) {
    const float* px = x + q * p.channels;
    const float* pdy = dy + q * p.channels;
    const std::vector<double> norm = LrnNorm(p, px);
    for (int j = 0; j < p.channels; ++j) {
      double s = 0;
      for (int i = std::max(0, j - p.depth_radius); i <= std::min(p.channels - 1, j + p.depth_radius); ++i)
        s += static_cast<double>(pdy[i]) * px[i] * std::pow(norm[i], -p.beta - 1.0);
      dx[q * p.channels + j] =
          static_cast<float>(pdy[j] * std::pow(norm[j], -p.beta) - 2.0 * p.alpha * p.beta * px[j] * s);
    }
  }
}

namespace {

// Element (i, o) of the dense weights (or of dw), in either layout.
inline int64_t DenseWeightIndex(const DenseParams& p, int i, int o) {
  return p.weights_transposed ? static_cast<int64_t>(o) * p.in + i : static_cast<int64_t>(i) * p.out + o;
}

}  // namespace

void DenseForward(const DenseParams& p, const float* x, const float* w, const float* b, float* y) {
  for (int n = 0; n < p.batch; ++n)
    for (int o = 0; o < p.out; ++o) {
      double acc = 0;
      for (int i = 0; i < p.in; ++i) acc += static_cast<double>(x[int64_t{n} * p.in + i]) * w[DenseWeightIndex(p, i, o)];
      acc *= p.alpha;
      if (p.has_bias) acc += static_cast<double>(p.beta) * b[o];
      y[int64_t{n} * p.out + o] = static_cast<float>(acc);
    }
}

void DenseBackwardData(const DenseParams& p, const float* dy, const float* w, float* dx) {
  for (int n = 0; n < p.batch; ++n)
    for (int i = 0; i < p.in; ++i) {
      double acc = 0;
      for (int o = 0; o < p.out; ++o)
        acc += static_cast<double>(dy[int64_t{n} * p.out + o]) * w[DenseWeightIndex(p, i, o)];
      dx[int64_t{n} * p.in + i] = static_cast<float>(p.alpha * acc);
    }
}

void DenseBackwardWeights(const DenseParams& p, const float* x, const float* dy, float* dw, float* db) {
  for (int i = 0; i < p.in; ++i)
    for (int o = 0; o < p.out; ++o) {
      double acc = 0;
      for (int n = 0; n < p.batch; ++n)
        acc += static_cast<double>(x[int64_t{n} * p.in + i]) * dy[int64_t{n} * p.out + o];
      dw[DenseWeightIndex(p, i, o)] = static_cast<float>(p.alpha * acc);
    }
  if (!p.has_bias || db == nullptr) return;
  for (int o = 0; o < p.out; ++o) {
    double acc = 0;
    for (int n = 0; n < p.batch; ++n) acc += dy[int64_t{n} * p.out + o];
    db[o] = static_cast<float>(p.beta * acc);
  }
}

void Relu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0.0f;
}

void ReluBackward(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0 ? dy[i] : 0.0f;
}

double SoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes, float* dlogits) {
  double total = 0;
  for (int n = 0; n < batch; ++n) {
    const float* z = logits + int64_t{n} * classes;
    const int label = static_cast<int>(labels[n]);
    double m = -std::numeric_limits<double>::infinity();
    for (int c = 0; c < classes; ++c) m = std::max(m, static_cast<double>(z[c]));
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(z[c] - m);
    total += std::log(sum) + m - z[label];
    for (int c = 0; c < classes; ++c) {
      const double softmax = std::exp(z[c] - m) / sum;
      dlogits[int64_t{n} * classes + c] = static_cast<float>((softmax - (c == label ? 1.0 : 0.0)) / batch);
    }
  }
  return total / batch;
}

double L2Loss(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s / 2;
}

void DropoutMask(int64_t n, float keep_prob, uint64_t seed, uint64_t counter, float* mask) {
  const uint64_t key = DropoutKey(seed, counter);
  const float scale = 1.0f / keep_prob;
  for (int64_t i = 0; i < n; ++i)
    mask[i] = DropoutUniform(key, static_cast<uint64_t>(i)) < keep_prob ? scale : 0.0f;
}

}  // namespace dtrain::kernels::reference
