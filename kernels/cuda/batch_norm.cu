// Batch normalization over an NHWC tensor viewed as [rows, channels]: per-channel statistics and gradient sums
// as fixed-order reductions (one thread per (channel, chunk of rows) sums in double, then one thread per
// channel adds the chunks in order: no atomics, identical results run to run), and elementwise passes for y and
// dx. cuDNN's batch-norm calls are not used: they return a saved inverse standard deviation rather than the
// biased variance the interface hands out, and fold the running averages in, which dtrain does on the ps
// (Device::BatchNormRunningDelta). Kernels first, launchers below; the math is op_math.h's.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

// ---- kernels ----

__global__ void StatsPartialKernel(const float* x, ColumnShape s, double* sum, double* sumsq, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(t, total) { BatchNormStatsPartial(x, s, t, &sum[t], &sumsq[t]); }
}

__global__ void StatsFinalKernel(const double* sum, const double* sumsq, ColumnShape s, float* mean, float* var) {
  DTRAIN_GRID_STRIDE_LOOP(c, s.channels) { BatchNormStatsFinal(sum, sumsq, s, static_cast<int>(c), mean, var); }
}

__global__ void ApplyKernel(const float* x, const float* scale, const float* bias, const float* mean,
                            const float* var, float epsilon, int channels, float* y, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) {
    const int c = static_cast<int>(i % channels);
    y[i] = BatchNormValue(x[i], scale[c], bias[c], mean[c], var[c], epsilon);
  }
}

__global__ void GradPartialKernel(const float* x, const float* dy, const float* mean, const float* var,
                                  float epsilon, ColumnShape s, double* sum_dy, double* sum_dy_xhat,
                                  int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(t, total) {
    BatchNormGradPartial(x, dy, mean, var, epsilon, s, t, &sum_dy[t], &sum_dy_xhat[t]);
  }
}

__global__ void GradFinalKernel(const double* sum_dy, const double* sum_dy_xhat, ColumnShape s, float* dscale,
                                float* dbias) {
  DTRAIN_GRID_STRIDE_LOOP(c, s.channels) {
    BatchNormGradFinal(sum_dy, sum_dy_xhat, s, static_cast<int>(c), dscale, dbias);
  }
}

__global__ void InputGradKernel(const float* x, const float* dy, const float* scale, const float* mean,
                                const float* var, const float* dscale, const float* dbias, float epsilon,
                                float inv_rows, int channels, float* dx, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) {
    const int c = static_cast<int>(i % channels);
    dx[i] = BatchNormInputGrad(x[i], dy[i], scale[c], mean[c], var[c], dscale[c], dbias[c], epsilon, inv_rows);
  }
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchBatchNormStats(const float* x, const ColumnShape& s, double* partial, float* mean, float* var,
                                 cudaStream_t stream) {
  const int64_t total = s.chunks * s.channels;
  if (total <= 0 || s.rows <= 0) return cudaSuccess;
  double* sum = partial;
  double* sumsq = partial + total;
  StatsPartialKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, s, sum, sumsq, total);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  StatsFinalKernel<<<BlocksFor(s.channels), kThreads, 0, stream>>>(sum, sumsq, s, mean, var);
  return cudaGetLastError();
}

cudaError_t LaunchBatchNormApply(const float* x, const float* scale, const float* bias, const float* mean,
                                 const float* var, float epsilon, int64_t rows, int channels, float* y,
                                 cudaStream_t stream) {
  const int64_t total = rows * channels;
  if (total <= 0) return cudaSuccess;
  ApplyKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, scale, bias, mean, var, epsilon, channels, y, total);
  return cudaGetLastError();
}

cudaError_t LaunchBatchNormBackward(const float* x, const float* dy, const float* scale, const float* mean,
                                    const float* var, float epsilon, const ColumnShape& s, double* partial,
                                    float* dx, float* dscale, float* dbias, cudaStream_t stream) {
  const int64_t total = s.chunks * s.channels;
  if (total <= 0 || s.rows <= 0) return cudaSuccess;
  double* sum_dy = partial;
  double* sum_dy_xhat = partial + total;
  GradPartialKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, dy, mean, var, epsilon, s, sum_dy, sum_dy_xhat,
                                                                total);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  GradFinalKernel<<<BlocksFor(s.channels), kThreads, 0, stream>>>(sum_dy, sum_dy_xhat, s, dscale, dbias);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t n = s.rows * s.channels;
  InputGradKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, dy, scale, mean, var, dscale, dbias, epsilon,
                                                          1.0f / static_cast<float>(s.rows), s.channels, dx, n);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
