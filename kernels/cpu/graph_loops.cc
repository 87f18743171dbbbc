#include "kernels/cpu/graph_loops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/parallel.h"

namespace dtrain::kernels::cpu {
namespace {

using Kind = ActivationParams::Kind;

// sigmoid(x) without overflow: exp of a non-positive argument only.
inline float Sigmoid(float x) {
  const float e = std::exp(-std::fabs(x));
  const float s = 1.0f / (1.0f + e);
  return x >= 0 ? s : e * s;
}

// Rows of `cols` floats per chunk so that a chunk holds about kParallelMinElements floats.
int64_t MinRows(int64_t cols) { return std::max<int64_t>(1, kParallelMinElements / std::max<int64_t>(cols, 1)); }

}  // namespace

void ActivationLoop(const ActivationParams& p, const float* x, float* y, int64_t n, int threads) {
  // The transcendental ones are slower per element: parallel from fewer elements.
  const bool cheap = p.kind == Kind::kLeakyRelu || p.kind == Kind::kClip || p.kind == Kind::kHardSigmoid ||
                     p.kind == Kind::kHardSwish;
  const int64_t min_parallel = cheap ? kParallelMinElements : kParallelMinElements / 8;
  ForChunks(n, threads, min_parallel, [&](int64_t b, int64_t e) {
    switch (p.kind) {
      case Kind::kLeakyRelu: {
        const float alpha = p.alpha;
        for (int64_t i = b; i < e; ++i) y[i] = x[i] < 0 ? alpha * x[i] : x[i];
        break;
      }
      case Kind::kClip: {
        const float lo = p.lo, hi = p.hi;
        for (int64_t i = b; i < e; ++i) y[i] = std::min(std::max(x[i], lo), hi);
        break;
      }
      case Kind::kSigmoid:
        for (int64_t i = b; i < e; ++i) y[i] = Sigmoid(x[i]);
        break;
      case Kind::kTanh:
        for (int64_t i = b; i < e; ++i) y[i] = std::tanh(x[i]);
        break;
      case Kind::kHardSigmoid: {
        const float alpha = p.alpha, beta = p.beta;
        for (int64_t i = b; i < e; ++i) y[i] = std::min(std::max(alpha * x[i] + beta, 0.0f), 1.0f);
        break;
      }
      case Kind::kHardSwish:
        for (int64_t i = b; i < e; ++i) y[i] = x[i] * std::min(std::max(x[i] * (1.0f / 6.0f) + 0.5f, 0.0f), 1.0f);
        break;
      case Kind::kGelu:
        for (int64_t i = b; i < e; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * static_cast<float>(M_SQRT1_2)));
        break;
      case Kind::kSilu:
        for (int64_t i = b; i < e; ++i) y[i] = x[i] * Sigmoid(x[i]);
        break;
      case Kind::kErf:
        for (int64_t i = b; i < e; ++i) y[i] = std::erf(x[i]);
        break;
      case Kind::kSqrt:
        for (int64_t i = b; i < e; ++i) y[i] = std::sqrt(x[i]);
        break;
      case Kind::kPow: {
        const float k = p.exponent;
        if (k == 2.0f) {
          for (int64_t i = b; i < e; ++i) y[i] = x[i] * x[i];
        } else {
          for (int64_t i = b; i < e; ++i) y[i] = std::pow(x[i], k);
        }
        break;
      }
    }
  });
}

void ActivationBackwardLoop(const ActivationParams& p, const float* x, const float* y, const float* dy, float* dx,
                            int64_t n, int threads) {
  // Sigmoid, Tanh and Sqrt read y, the others x (dx may alias dy).
  ForChunks(n, threads, kParallelMinElements, [&](int64_t b, int64_t e) {
    switch (p.kind) {
      case Kind::kLeakyRelu: {
        const float alpha = p.alpha;
        for (int64_t i = b; i < e; ++i) dx[i] = x[i] > 0 ? dy[i] : alpha * dy[i];  // slope alpha at 0 (PyTorch)
        break;
      }
      case Kind::kClip: {
        const float lo = p.lo, hi = p.hi;
        for (int64_t i = b; i < e; ++i) {
          const float g = dy[i];  // read unconditionally: branch-free, vectorized (as ReluBackwardLoop)
          dx[i] = x[i] > lo && x[i] < hi ? g : 0.0f;
        }
        break;
      }
      case Kind::kSigmoid:
        for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
        break;
      case Kind::kTanh:
        for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
        break;
      case Kind::kHardSigmoid: {
        const float alpha = p.alpha, beta = p.beta;
        for (int64_t i = b; i < e; ++i) {
          const float u = alpha * x[i] + beta, g = dy[i];
          dx[i] = u > 0.0f && u < 1.0f ? alpha * g : 0.0f;
        }
        break;
      }
      case Kind::kHardSwish:
        for (int64_t i = b; i < e; ++i) {
          const float v = x[i], g = dy[i];
          dx[i] = v < -3.0f ? 0.0f : v <= 3.0f ? g * (v * (1.0f / 3.0f) + 0.5f) : g;
        }
        break;
      case Kind::kGelu:
        for (int64_t i = b; i < e; ++i) {
          const float v = x[i];
          const float cdf = 0.5f * (1.0f + std::erf(v * static_cast<float>(M_SQRT1_2)));
          const float pdf = std::exp(-0.5f * v * v) * static_cast<float>(0.5 * M_2_SQRTPI * M_SQRT1_2);
          dx[i] = dy[i] * (cdf + v * pdf);
        }
        break;
      case Kind::kSilu:
        for (int64_t i = b; i < e; ++i) {
          const float s = Sigmoid(x[i]);
          dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
        }
        break;
      case Kind::kErf:
        for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * static_cast<float>(M_2_SQRTPI) * std::exp(-x[i] * x[i]);
        break;
      case Kind::kSqrt:
        for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * 0.5f / y[i];
        break;
      case Kind::kPow: {
        const float k = p.exponent;
        for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * k * std::pow(x[i], k - 1.0f);
        break;
      }
    }
  });
}

void CopyStridedLoop(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                     int64_t cols, bool accumulate, int threads) {
  ForChunks(
      rows, threads, MinRows(cols),
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const float* __restrict s = src + r * src_stride;
          float* __restrict d = dst + r * dst_stride;
          if (accumulate) {
            for (int64_t c = 0; c < cols; ++c) d[c] += s[c];
          } else {
            std::memcpy(d, s, sizeof(float) * cols);
          }
        }
      },
      /*align=*/1);
}

void TransposeLoop(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols, int threads) {
  // 32x32 tiles: a tile's reads and writes each touch 32 cache lines.
  constexpr int64_t kTile = 32;
  const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
  const int64_t tiles = batch * row_tiles * col_tiles;
  ForChunks(
      tiles, threads, std::max<int64_t>(1, kParallelMinElements / (kTile * kTile)),
      [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          const int64_t n = t / (row_tiles * col_tiles), rt = t / col_tiles % row_tiles, ct = t % col_tiles;
          const float* __restrict xb = x + n * rows * cols;
          float* __restrict yb = y + n * rows * cols;
          const int64_t r1 = std::min(rows, (rt + 1) * kTile), c1 = std::min(cols, (ct + 1) * kTile);
          for (int64_t r = rt * kTile; r < r1; ++r)
            for (int64_t c = ct * kTile; c < c1; ++c) yb[c * rows + r] = xb[r * cols + c];
        }
      },
      /*align=*/1);
}

void BatchNormRunningDeltaLoop(const float* running_mean, const float* running_var, const float* batch_mean,
                               const float* batch_var, int channels, int64_t count, float momentum, bool unbiased,
                               float* d_mean, float* d_var) {
  const float correction = unbiased ? static_cast<float>(static_cast<double>(count) / (count - 1)) : 1.0f;
  for (int c = 0; c < channels; ++c) {
    d_mean[c] = momentum * (running_mean[c] - batch_mean[c]);
    d_var[c] = momentum * (running_var[c] - batch_var[c] * correction);
  }
}

absl::Status CheckGatherData(const char* op, const GatherParams& p, const int32_t* indices,
                             const int32_t* offsets) {
  for (int64_t i = 0; i < p.count; ++i) {
    if (indices[i] < 0 || indices[i] >= p.rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": index ", indices[i], " of lookup ", i, " is not a row in [0, ", p.rows, ")"));
    }
  }
  if (p.num_bags == 0) return absl::OkStatus();
  // kernels/device.h's message (the CUDA backend reports the same).
  for (int64_t b = 0; b < p.num_bags; ++b) {
    const bool last = b + 1 == p.num_bags;
    if (offsets[b] < 0 || offsets[b] > offsets[b + 1] || offsets[b + 1] > p.count ||
        (last && offsets[b + 1] != p.count)) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": bag ", b, " has offsets [", offsets[b], ", ",
                                                     offsets[b + 1], "), not an ascending range in [0, ", p.count,
                                                     "]"));
    }
  }
  return absl::OkStatus();
}

void GatherLoop(const GatherParams& p, const float* table, const int32_t* indices, const int32_t* offsets, float* y,
                int threads) {
  const int64_t dim = p.dim;
  const int64_t out_rows = p.num_bags > 0 ? p.num_bags : p.count;
  ForChunks(
      out_rows, threads, MinRows(dim),
      [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          float* __restrict out = y + r * dim;
          if (p.num_bags == 0) {
            std::memcpy(out, table + int64_t{indices[r]} * dim, sizeof(float) * dim);
            continue;
          }
          std::fill(out, out + dim, 0.0f);
          for (int64_t j = offsets[r]; j < offsets[r + 1]; ++j) {
            const float* __restrict row = table + int64_t{indices[j]} * dim;
            for (int64_t d = 0; d < dim; ++d) out[d] += row[d];
          }
          const int64_t size = offsets[r + 1] - offsets[r];
          if (p.mean && size > 1) {
            const float inv = 1.0f / static_cast<float>(size);
            for (int64_t d = 0; d < dim; ++d) out[d] *= inv;
          }
        }
      },
      /*align=*/1);
}

void GatherBackwardLoop(const GatherParams& p, const float* dy, const int32_t* indices, const int32_t* offsets,
                        float* dtable, int threads) {
  // Repeated indices make rows collide: the threads split the columns instead, each adding every lookup's
  // slice of its columns (in lookup order, so the sums are deterministic).
  const int64_t dim = p.dim;
  const int64_t work = p.count * dim;
  const int column_threads = dim >= 32 && work >= kParallelMinElements ? threads : 1;
  ForChunks(
      dim, column_threads, 1,
      [&](int64_t c0, int64_t c1) {
        auto add = [&](int64_t row, const float* g, float scale) {
          float* __restrict t = dtable + row * dim;
          for (int64_t d = c0; d < c1; ++d) t[d] += scale * g[d];
        };
        if (p.num_bags == 0) {
          for (int64_t i = 0; i < p.count; ++i) add(indices[i], dy + i * dim, 1.0f);
          return;
        }
        for (int64_t b = 0; b < p.num_bags; ++b) {
          const int64_t size = offsets[b + 1] - offsets[b];
          const float scale = p.mean && size > 0 ? 1.0f / static_cast<float>(size) : 1.0f;
          for (int64_t j = offsets[b]; j < offsets[b + 1]; ++j) add(indices[j], dy + b * dim, scale);
        }
      },
      /*align=*/16);
}

void InteractionLoop(const InteractionParams& p, const float* x, float* y, int threads) {
  const int F = p.features, D = p.dim;
  const int64_t outs = p.outputs();
  const int64_t per_example = std::max<int64_t>(1, outs * D);
  ForChunks(
      p.batch, threads, std::max<int64_t>(1, kParallelMinElements / per_example),
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const float* __restrict z = x + b * F * D;
          float* __restrict out = y + b * outs;
          for (int i = 1; i < F; ++i)
            for (int j = 0; j < i; ++j) {
              float dot = 0;
              for (int d = 0; d < D; ++d) dot += z[i * D + d] * z[j * D + d];
              *out++ = dot;
            }
        }
      },
      /*align=*/1);
}

void InteractionBackwardLoop(const InteractionParams& p, const float* x, const float* dy, float* dx, int threads) {
  // dz_i = sum_{j < i} dy_ij z_j + sum_{k > i} dy_ki z_k.
  const int F = p.features, D = p.dim;
  const int64_t outs = p.outputs();
  const int64_t per_example = std::max<int64_t>(1, outs * D);
  ForChunks(
      p.batch, threads, std::max<int64_t>(1, kParallelMinElements / per_example),
      [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
          const float* __restrict z = x + b * F * D;
          const float* __restrict g = dy + b * outs;
          float* __restrict dz = dx + b * F * D;
          std::fill(dz, dz + int64_t{F} * D, 0.0f);
          for (int i = 1; i < F; ++i)
            for (int j = 0; j < i; ++j) {
              const float gij = *g++;
              for (int d = 0; d < D; ++d) {
                dz[i * D + d] += gij * z[j * D + d];
                dz[j * D + d] += gij * z[i * D + d];
              }
            }
        }
      },
      /*align=*/1);
}

absl::Status SigmoidCrossEntropyLoop(const float* logits, const float* labels, int batch, float* dlogits, float* loss,
                                     int threads) {
  for (int r = 0; r < batch; ++r) {
    if (labels[r] != 0.0f && labels[r] != 1.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("SigmoidCrossEntropy: label ", labels[r], " of row ", r, " is not 0 or 1"));
    }
  }
  const float inv_batch = 1.0f / static_cast<float>(batch);
  const double total = ParallelSum(batch, threads, kParallelMinElements / 8, [=](int64_t b, int64_t e) {
    double sum = 0;
    for (int64_t r = b; r < e; ++r) {
      const float z = logits[r], t = labels[r];
      const double zd = z;
      sum += std::max(zd, 0.0) - zd * t + std::log1p(std::exp(-std::fabs(zd)));
      dlogits[r] = (Sigmoid(z) - t) * inv_batch;
    }
    return sum;
  });
  *loss = static_cast<float>(total / batch);
  return absl::OkStatus();
}

}  // namespace dtrain::kernels::cpu
