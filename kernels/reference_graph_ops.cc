// Reference loops for the ops of imported graphs and sparse models (kernels/reference_ops.h): BatchNorm,
// broadcasting Binary, activations, strided copies, transposes, the BatchNorm running-statistics delta,
// embedding Gather, DLRM interaction and sigmoid cross-entropy. Written for obviousness, in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/reference_ops.h"

namespace dtrain::kernels::reference {

void BatchNormForwardTraining(const BatchNormParams& p, const float* x, const float* scale, const float* bias,
                              float* y, float* batch_mean, float* batch_var) {
  const int64_t count = p.batch * p.spatial;
  const int C = p.channels;
  for (int c = 0; c < C; ++c) {
    double sum = 0;
    for (int64_t r = 0; r < count; ++r) sum += x[r * C + c];
    const double mean = sum / count;
    double sq = 0;
    for (int64_t r = 0; r < count; ++r) sq += (x[r * C + c] - mean) * (x[r * C + c] - mean);
    const double var = sq / count;  // biased
    const double inv_std = 1.0 / std::sqrt(var + p.epsilon);
    for (int64_t r = 0; r < count; ++r) {
      y[r * C + c] = static_cast<float>(scale[c] * (x[r * C + c] - mean) * inv_std + bias[c]);
    }
    batch_mean[c] = static_cast<float>(mean);
    batch_var[c] = static_cast<float>(var);
  }
}

void BatchNormForwardInference(const BatchNormParams& p, const float* x, const float* scale, const float* bias,
                               const float* mean, const float* var, float* y) {
  const int64_t count = p.batch * p.spatial;
  const int C = p.channels;
  for (int64_t r = 0; r < count; ++r)
    for (int c = 0; c < C; ++c) {
      const double inv_std = 1.0 / std::sqrt(static_cast<double>(var[c]) + p.epsilon);
      y[r * C + c] = static_cast<float>(scale[c] * (x[r * C + c] - static_cast<double>(mean[c])) * inv_std + bias[c]);
    }
}

void BatchNormBackward(const BatchNormParams& p, const float* x, const float* dy, const float* scale,
                       const float* batch_mean, const float* batch_var, float* dx, float* dscale, float* dbias) {
  // With xhat = (x - mean) / sqrt(var + eps), both statistics functions of x:
  //   dbias = sum dy, dscale = sum dy xhat, dx = scale / sqrt(var + eps) (dy - dbias / N - xhat dscale / N).
  const int64_t count = p.batch * p.spatial;
  const int C = p.channels;
  for (int c = 0; c < C; ++c) {
    const double mean = batch_mean[c];
    const double inv_std = 1.0 / std::sqrt(static_cast<double>(batch_var[c]) + p.epsilon);
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t r = 0; r < count; ++r) {
      sum_dy += dy[r * C + c];
      sum_dy_xhat += dy[r * C + c] * (x[r * C + c] - mean) * inv_std;
    }
    for (int64_t r = 0; r < count; ++r) {
      const double xhat = (x[r * C + c] - mean) * inv_std;
      dx[r * C + c] =
          static_cast<float>(scale[c] * inv_std * (dy[r * C + c] - sum_dy / count - xhat * sum_dy_xhat / count));
    }
    dscale[c] = static_cast<float>(sum_dy_xhat);
    dbias[c] = static_cast<float>(sum_dy);
  }
}

namespace {

// Calls fn(output index, a offset, b offset) for every output element, in row-major order.
template <typename Fn>
void ForEachBroadcast(const BroadcastParams& p, Fn fn) {
  const int64_t n = p.out_size();
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, a_off = 0, b_off = 0;
    for (int d = p.rank - 1; d >= 0; --d) {
      const int64_t idx = rest % p.dims[d];
      rest /= p.dims[d];
      a_off += idx * p.a_strides[d];
      b_off += idx * p.b_strides[d];
    }
    fn(i, a_off, b_off);
  }
}

double Apply(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::kAdd:
      return a + b;
    case BinaryOp::kSub:
      return a - b;
    case BinaryOp::kMul:
      return a * b;
    case BinaryOp::kDiv:
      return a / b;
  }
  return 0;
}

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

void BinaryForward(const BroadcastParams& p, const float* a, const float* b, float* y) {
  ForEachBroadcast(p, [&](int64_t i, int64_t ai, int64_t bi) { y[i] = static_cast<float>(Apply(p.op, a[ai], b[bi])); });
}

void BinaryBackward(const BroadcastParams& p, const float* a, const float* b, const float* dy, float* da,
                    float* db) {
  std::vector<double> ga(p.a_size(), 0.0), gb(p.b_size(), 0.0);
  ForEachBroadcast(p, [&](int64_t i, int64_t ai, int64_t bi) {
    const double g = dy[i];
    switch (p.op) {
      case BinaryOp::kAdd:
        ga[ai] += g;
        gb[bi] += g;
        break;
      case BinaryOp::kSub:
        ga[ai] += g;
        gb[bi] -= g;
        break;
      case BinaryOp::kMul:
        ga[ai] += g * b[bi];
        gb[bi] += g * a[ai];
        break;
      case BinaryOp::kDiv:
        ga[ai] += g / b[bi];
        gb[bi] -= g * a[ai] / (static_cast<double>(b[bi]) * b[bi]);
        break;
    }
  });
  if (da != nullptr) std::transform(ga.begin(), ga.end(), da, [](double v) { return static_cast<float>(v); });
  if (db != nullptr) std::transform(gb.begin(), gb.end(), db, [](double v) { return static_cast<float>(v); });
}

void Activation(const ActivationParams& p, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    double r = 0;
    switch (p.kind) {
      case ActivationParams::Kind::kLeakyRelu:
        r = v < 0 ? p.alpha * v : v;
        break;
      case ActivationParams::Kind::kClip:
        r = std::min<double>(std::max<double>(v, p.lo), p.hi);
        break;
      case ActivationParams::Kind::kSigmoid:
        r = Sigmoid(v);
        break;
      case ActivationParams::Kind::kTanh:
        r = std::tanh(v);
        break;
      case ActivationParams::Kind::kHardSigmoid:
        r = std::clamp(p.alpha * v + p.beta, 0.0, 1.0);
        break;
      case ActivationParams::Kind::kHardSwish:
        r = v * std::clamp(v / 6 + 0.5, 0.0, 1.0);
        break;
      case ActivationParams::Kind::kGelu:
        r = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
        break;
      case ActivationParams::Kind::kSilu:
        r = v * Sigmoid(v);
        break;
      case ActivationParams::Kind::kErf:
        r = std::erf(v);
        break;
      case ActivationParams::Kind::kSqrt:
        r = std::sqrt(v);
        break;
      case ActivationParams::Kind::kPow:
        r = std::pow(v, static_cast<double>(p.exponent));
        break;
    }
    y[i] = static_cast<float>(r);
  }
}

void ActivationBackward(const ActivationParams& p, const float* x, const float* y, const float* dy, float* dx,
                        int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    double d = 0;
    switch (p.kind) {
      case ActivationParams::Kind::kLeakyRelu:
        d = v > 0 ? 1.0 : p.alpha;  // slope alpha at 0, as PyTorch
        break;
      case ActivationParams::Kind::kClip:
        d = (v > p.lo && v < p.hi) ? 1.0 : 0.0;
        break;
      case ActivationParams::Kind::kSigmoid:
        d = Sigmoid(v) * (1 - Sigmoid(v));
        break;
      case ActivationParams::Kind::kTanh:
        d = 1 - std::tanh(v) * std::tanh(v);
        break;
      case ActivationParams::Kind::kHardSigmoid: {
        const double u = p.alpha * v + p.beta;
        d = u > 0 && u < 1 ? p.alpha : 0.0;
        break;
      }
      case ActivationParams::Kind::kHardSwish:
        d = v < -3 ? 0.0 : v <= 3 ? v / 3 + 0.5 : 1.0;  // PyTorch's hardswish_backward
        break;
      case ActivationParams::Kind::kGelu:
        d = 0.5 * (1 + std::erf(v / std::sqrt(2.0))) + v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
        break;
      case ActivationParams::Kind::kSilu:
        d = Sigmoid(v) * (1 + v * (1 - Sigmoid(v)));
        break;
      case ActivationParams::Kind::kErf:
        d = 2 / std::sqrt(M_PI) * std::exp(-v * v);
        break;
      case ActivationParams::Kind::kSqrt:
        d = 0.5 / std::sqrt(v);
        break;
      case ActivationParams::Kind::kPow:
        d = p.exponent * std::pow(v, static_cast<double>(p.exponent) - 1);
        break;
    }
    dx[i] = static_cast<float>(dy[i] * d);
  }
}

void CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                 bool accumulate) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& d = dst[r * dst_stride + c];
      d = accumulate ? d + src[r * src_stride + c] : src[r * src_stride + c];
    }
}

void Transpose(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) y[(b * cols + c) * rows + r] = x[(b * rows + r) * cols + c];
}

void BatchNormRunningDelta(const float* running_mean, const float* running_var, const float* batch_mean,
                           const float* batch_var, int channels, int64_t count, float momentum, bool unbiased,
                           float* d_mean, float* d_var) {
  const double correction = unbiased ? static_cast<double>(count) / (count - 1) : 1.0;
  for (int c = 0; c < channels; ++c) {
    d_mean[c] = static_cast<float>(momentum * (static_cast<double>(running_mean[c]) - batch_mean[c]));
    d_var[c] = static_cast<float>(momentum * (running_var[c] - batch_var[c] * correction));
  }
}

void Gather(const GatherParams& p, const float* table, const int32_t* indices, const int32_t* offsets, float* y) {
  if (p.num_bags == 0) {
    for (int64_t i = 0; i < p.count; ++i)
      for (int d = 0; d < p.dim; ++d) y[i * p.dim + d] = table[int64_t{indices[i]} * p.dim + d];
    return;
  }
  for (int64_t bag = 0; bag < p.num_bags; ++bag) {
    const int64_t size = offsets[bag + 1] - offsets[bag];
    for (int d = 0; d < p.dim; ++d) {
      double sum = 0;
      for (int64_t j = offsets[bag]; j < offsets[bag + 1]; ++j) sum += table[int64_t{indices[j]} * p.dim + d];
      y[bag * p.dim + d] = static_cast<float>(p.mean && size > 0 ? sum / size : sum);
    }
  }
}

void GatherBackward(const GatherParams& p, const float* dy, const int32_t* indices, const int32_t* offsets,
                    float* dtable) {
  if (p.num_bags == 0) {
    for (int64_t i = 0; i < p.count; ++i)
      for (int d = 0; d < p.dim; ++d) dtable[int64_t{indices[i]} * p.dim + d] += dy[i * p.dim + d];
    return;
  }
  for (int64_t bag = 0; bag < p.num_bags; ++bag) {
    const int64_t size = offsets[bag + 1] - offsets[bag];
    for (int64_t j = offsets[bag]; j < offsets[bag + 1]; ++j)
      for (int d = 0; d < p.dim; ++d) {
        const double g = dy[bag * p.dim + d];
        dtable[int64_t{indices[j]} * p.dim + d] += static_cast<float>(p.mean ? g / size : g);
      }
  }
}

void Interaction(const InteractionParams& p, const float* x, float* y) {
  for (int b = 0; b < p.batch; ++b) {
    const float* z = x + int64_t{b} * p.features * p.dim;
    int64_t k = int64_t{b} * p.outputs();
    for (int i = 1; i < p.features; ++i)
      for (int j = 0; j < i; ++j) {
        double dot = 0;
        for (int d = 0; d < p.dim; ++d) dot += static_cast<double>(z[i * p.dim + d]) * z[j * p.dim + d];
        y[k++] = static_cast<float>(dot);
      }
  }
}

void InteractionBackward(const InteractionParams& p, const float* x, const float* dy, float* dx) {
  for (int b = 0; b < p.batch; ++b) {
    const float* z = x + int64_t{b} * p.features * p.dim;
    std::vector<double> g(static_cast<size_t>(p.features) * p.dim, 0.0);
    int64_t k = int64_t{b} * p.outputs();
    for (int i = 1; i < p.features; ++i)
      for (int j = 0; j < i; ++j, ++k)
        for (int d = 0; d < p.dim; ++d) {
          g[i * p.dim + d] += static_cast<double>(dy[k]) * z[j * p.dim + d];
          g[j * p.dim + d] += static_cast<double>(dy[k]) * z[i * p.dim + d];
        }
    for (size_t i = 0; i < g.size(); ++i) dx[int64_t{b} * p.features * p.dim + i] = static_cast<float>(g[i]);
  }
}

double SigmoidCrossEntropy(const float* logits, const float* labels, int batch, float* dlogits) {
  double total = 0;
  for (int r = 0; r < batch; ++r) {
    const double z = logits[r], t = labels[r];
    total += std::max(z, 0.0) - z * t + std::log1p(std::exp(-std::fabs(z)));
    dlogits[r] = static_cast<float>((Sigmoid(z) - t) / batch);
  }
  return total / batch;
}

}  // namespace dtrain::kernels::reference
