// The tensor ops of imported graphs (kernels/tensor_ops.h): strided copies, reductions over the middle axis
// of [outer, reduce, inner], softmax along the middle axis of [outer, n, inner], and layer normalization of
// rows. Batched MatMul is cuBLAS (cuda_tensor_ops.cc). Every reduction has a fixed order (a serial loop per
// thread, or a warp's lanes striding a row and then a butterfly of shuffles; the parameter gradients of
// LayerNorm in per-chunk double partial sums added in order): results are the same run to run and no atomics
// are used. Kernels first, launchers below; the per-element math is op_math.h's.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;

// Blocks for one warp per row.
int BlocksForRows(int64_t rows) {
  int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks < 1) blocks = 1;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Grid-stride loop of whole warps over rows: every lane of a warp sees the same row (shuffles are safe).
#define DTRAIN_WARP_ROW_LOOP(row, rows)                                                                   \
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; row < (rows); \
       row += static_cast<int64_t>(blockDim.x) * gridDim.x / kWarp)

// Butterfly reductions: every lane ends with the same value, combined in the same order every run.
__device__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ float WarpMax(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// ---- kernels ----

__global__ void StridedCopyKernel(CopyShape s, const float* src, float* dst, int64_t count, bool accumulate) {
  DTRAIN_GRID_STRIDE_LOOP(i, count) {
    int64_t so, d;
    CopyOffsets(s, i, &so, &d);
    const float v = src[so];
    dst[d] = accumulate ? dst[d] + v : v;
  }
}

// One thread per output (coalesced across the inner axis).
__global__ void ReduceColumnsKernel(ReduceDims s, const float* x, float* y, int32_t* argmax) {
  DTRAIN_GRID_STRIDE_LOOP(o, s.outer * s.inner) {
    int32_t best = 0;
    y[o] = ReduceOutput(x, s, o, &best);
    if (s.kind == kReduceMax) argmax[o] = best;
  }
}

// inner == 1: one warp per output, its lanes striding the contiguous row.
__global__ void ReduceRowsKernel(ReduceDims s, const float* x, float* y, int32_t* argmax) {
  const int lane = threadIdx.x % kWarp;
  DTRAIN_WARP_ROW_LOOP(o, s.outer) {
    const float* v = x + o * s.reduce;
    if (s.kind == kReduceMax) {
      float best = v[0];
      int64_t best_r = 0;
      for (int64_t r = lane; r < s.reduce; r += kWarp) {
        if (MaxCandidateWins(v[r], r, best, best_r)) {
          best = v[r];
          best_r = r;
        }
      }
      for (int off = kWarp / 2; off > 0; off >>= 1) {
        const float b = __shfl_xor_sync(kFullMask, best, off);
        const int64_t rb = __shfl_xor_sync(kFullMask, best_r, off);
        if (MaxCandidateWins(b, rb, best, best_r)) {
          best = b;
          best_r = rb;
        }
      }
      if (lane == 0) {
        y[o] = best;
        argmax[o] = static_cast<int32_t>(best_r);
      }
      continue;
    }
    float acc = 0.0f;
    for (int64_t r = lane; r < s.reduce; r += kWarp) acc += v[r];
    acc = WarpSum(acc);
    if (lane == 0) y[o] = s.kind == kReduceMean ? acc * (1.0f / static_cast<float>(s.reduce)) : acc;
  }
}

__global__ void ReduceBackwardKernel(ReduceDims s, const float* dy, const int32_t* argmax, float* dx,
                                     int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) { dx[i] = ReduceInputGrad(dy, argmax, s, i); }
}

// inner > 1: one thread per column (coalesced across the inner axis).
__global__ void SoftmaxColumnsKernel(const float* x, float* y, int64_t n, int64_t inner, int64_t columns,
                                     bool log) {
  DTRAIN_GRID_STRIDE_LOOP(c, columns) {
    const int64_t start = SoftmaxColumnStart(c, n, inner);
    SoftmaxColumnForward(x + start, y + start, n, inner, log);
  }
}

__global__ void SoftmaxColumnsBackwardKernel(const float* y, const float* dy, float* dx, int64_t n,
                                             int64_t inner, int64_t columns, bool log) {
  DTRAIN_GRID_STRIDE_LOOP(c, columns) {
    const int64_t start = SoftmaxColumnStart(c, n, inner);
    SoftmaxColumnBackward(y + start, dy + start, dx + start, n, inner, log);
  }
}

// inner == 1: one warp per contiguous row of n.
__global__ void SoftmaxRowsKernel(const float* x, float* y, int64_t rows, int64_t n, bool log) {
  const int lane = threadIdx.x % kWarp;
  DTRAIN_WARP_ROW_LOOP(row, rows) {
    const float* xr = x + row * n;
    float* yr = y + row * n;
    float m = -INFINITY;
    for (int64_t j = lane; j < n; j += kWarp) m = fmaxf(m, xr[j]);
    m = WarpMax(m);
    float sum = 0.0f;
    for (int64_t j = lane; j < n; j += kWarp) sum += expf(xr[j] - m);
    sum = WarpSum(sum);
    for (int64_t j = lane; j < n; j += kWarp) yr[j] = SoftmaxValue(xr[j], m, sum, log);
  }
}

// dx may alias dy: each lane reads its elements' dy before writing their dx.
__global__ void SoftmaxRowsBackwardKernel(const float* y, const float* dy, float* dx, int64_t rows, int64_t n,
                                          bool log) {
  const int lane = threadIdx.x % kWarp;
  DTRAIN_WARP_ROW_LOOP(row, rows) {
    const float* yr = y + row * n;
    const float* gr = dy + row * n;
    float* dr = dx + row * n;
    float s = 0.0f;
    for (int64_t j = lane; j < n; j += kWarp) s += SoftmaxGradTerm(yr[j], gr[j], log);
    s = WarpSum(s);
    for (int64_t j = lane; j < n; j += kWarp) dr[j] = SoftmaxGrad(yr[j], gr[j], s, log);
  }
}

// One warp per row: the mean, then the biased variance from a second pass over the (cached) row.
__global__ void LayerNormForwardKernel(const float* x, const float* scale, const float* bias, float epsilon,
                                       int64_t rows, int64_t cols, float* y, float* mean, float* var) {
  const int lane = threadIdx.x % kWarp;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  DTRAIN_WARP_ROW_LOOP(row, rows) {
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    float sum = 0.0f;
    for (int64_t c = lane; c < cols; c += kWarp) sum += xr[c];
    const float mu = WarpSum(sum) * inv_cols;
    float sq = 0.0f;
    for (int64_t c = lane; c < cols; c += kWarp) {
      const float d = xr[c] - mu;
      sq += d * d;
    }
    const float v = WarpSum(sq) * inv_cols;
    const float inv_std = BatchNormInvStd(v, epsilon);
    for (int64_t c = lane; c < cols; c += kWarp) {
      yr[c] = LayerNormValue(xr[c], mu, inv_std, scale[c], bias != nullptr ? bias[c] : 0.0f);
    }
    if (lane == 0) {
      if (mean != nullptr) mean[row] = mu;
      if (var != nullptr) var[row] = v;
    }
  }
}

__global__ void LayerNormParamPartialKernel(const float* x, const float* dy, const float* mean,
                                            const float* var, float epsilon, ColumnShape s, double* sum_dy,
                                            double* sum_dy_xhat, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(t, total) {
    LayerNormParamGradPartial(x, dy, mean, var, epsilon, s, t, &sum_dy[t], &sum_dy_xhat[t]);
  }
}

__global__ void LayerNormParamFinalKernel(const double* sum_dy, const double* sum_dy_xhat, ColumnShape s,
                                          float* dscale, float* dbias) {
  DTRAIN_GRID_STRIDE_LOOP(c, s.channels) {
    LayerNormParamGradFinal(sum_dy, sum_dy_xhat, s, static_cast<int>(c), dscale, dbias);
  }
}

// One warp per row: the row's means of dxhat and dxhat xhat, then dx (dx may alias dy: each lane reads its
// elements before writing them).
__global__ void LayerNormInputGradKernel(const float* x, const float* dy, const float* scale,
                                         const float* mean, const float* var, float epsilon, int64_t rows,
                                         int64_t cols, float* dx) {
  const int lane = threadIdx.x % kWarp;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  DTRAIN_WARP_ROW_LOOP(row, rows) {
    const float* xr = x + row * cols;
    const float* gr = dy + row * cols;
    float* dr = dx + row * cols;
    const float mu = mean[row], inv_std = BatchNormInvStd(var[row], epsilon);
    float a = 0.0f, b = 0.0f;
    for (int64_t c = lane; c < cols; c += kWarp) {
      const float dxhat = gr[c] * scale[c];
      a += dxhat;
      b += dxhat * ((xr[c] - mu) * inv_std);
    }
    const float m1 = WarpSum(a) * inv_cols, m2 = WarpSum(b) * inv_cols;
    for (int64_t c = lane; c < cols; c += kWarp) {
      dr[c] = LayerNormInputGrad(xr[c], gr[c], scale[c], mu, inv_std, m1, m2);
    }
  }
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchStridedCopy(const CopyShape& s, const float* src, float* dst, int64_t count,
                              bool accumulate, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  StridedCopyKernel<<<BlocksFor(count), kThreads, 0, stream>>>(s, src, dst, count, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchReduceForward(const ReduceDims& s, const float* x, float* y, int32_t* argmax,
                                cudaStream_t stream) {
  const int64_t outputs = s.outer * s.inner;
  if (outputs <= 0 || s.reduce <= 0) return cudaSuccess;
  if (s.inner == 1 && s.reduce >= kWarp) {
    ReduceRowsKernel<<<BlocksForRows(s.outer), kThreads, 0, stream>>>(s, x, y, argmax);
  } else {
    ReduceColumnsKernel<<<BlocksFor(outputs), kThreads, 0, stream>>>(s, x, y, argmax);
  }
  return cudaGetLastError();
}

cudaError_t LaunchReduceBackward(const ReduceDims& s, const float* dy, const int32_t* argmax, float* dx,
                                 cudaStream_t stream) {
  const int64_t total = s.outer * s.reduce * s.inner;
  if (total <= 0) return cudaSuccess;
  ReduceBackwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(s, dy, argmax, dx, total);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxForward(const float* x, float* y, int64_t outer, int64_t n, int64_t inner, bool log,
                                 cudaStream_t stream) {
  if (outer <= 0 || n <= 0 || inner <= 0) return cudaSuccess;
  if (inner == 1) {
    SoftmaxRowsKernel<<<BlocksForRows(outer), kThreads, 0, stream>>>(x, y, outer, n, log);
  } else {
    const int64_t columns = outer * inner;
    SoftmaxColumnsKernel<<<BlocksFor(columns), kThreads, 0, stream>>>(x, y, n, inner, columns, log);
  }
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxBackward(const float* y, const float* dy, float* dx, int64_t outer, int64_t n,
                                  int64_t inner, bool log, cudaStream_t stream) {
  if (outer <= 0 || n <= 0 || inner <= 0) return cudaSuccess;
  if (inner == 1) {
    SoftmaxRowsBackwardKernel<<<BlocksForRows(outer), kThreads, 0, stream>>>(y, dy, dx, outer, n, log);
  } else {
    const int64_t columns = outer * inner;
    SoftmaxColumnsBackwardKernel<<<BlocksFor(columns), kThreads, 0, stream>>>(y, dy, dx, n, inner, columns,
                                                                              log);
  }
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormForward(const float* x, const float* scale, const float* bias, float epsilon,
                                   int64_t rows, int64_t cols, float* y, float* mean, float* var,
                                   cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  LayerNormForwardKernel<<<BlocksForRows(rows), kThreads, 0, stream>>>(x, scale, bias, epsilon, rows, cols, y,
                                                                       mean, var);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(const float* x, const float* dy, const float* scale, const float* mean,
                                    const float* var, float epsilon, const ColumnShape& s, double* partial,
                                    float* dx, float* dscale, float* dbias, cudaStream_t stream) {
  if (s.rows <= 0 || s.channels <= 0) return cudaSuccess;
  // The parameter gradients first: they read dy, which dx may alias.
  const int64_t total = s.chunks * s.channels;
  LayerNormParamPartialKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, dy, mean, var, epsilon, s,
                                                                         partial, partial + total, total);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  LayerNormParamFinalKernel<<<BlocksFor(s.channels), kThreads, 0, stream>>>(partial, partial + total, s,
                                                                            dscale, dbias);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  LayerNormInputGradKernel<<<BlocksForRows(s.rows), kThreads, 0, stream>>>(x, dy, scale, mean, var, epsilon,
                                                                           s.rows, s.channels, dx);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
