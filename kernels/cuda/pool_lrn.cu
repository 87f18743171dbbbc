// NHWC max and average pooling (rectangular windows and strides, asymmetric padding: TensorFlow's SAME or
// explicit pads, ceil_mode; padded positions never win a max) and TensorFlow LRN across channels. Written by
// hand rather than with cuDNN: cuDNN pooling has only symmetric padding and no ceil_mode overhang, and in NHWC
// the LRN channel window is contiguous, so plain kernels are simple and exact. The backward passes gather over
// the windows that cover each input (no atomics, deterministic). Kernels first, launchers below.
#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

// ---- kernels ----

// One thread per output element (n, oh, ow, c); op_math.h has the window math.
__global__ void MaxPoolForwardKernel(const float* x, float* y, int32_t* argmax, PoolShape s, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(o, total) { y[o] = MaxPoolOutput(x, s, o, &argmax[o]); }
}

// One thread per input element (n, ih, iw, c): sums dy over the outputs whose window holds it and chose it.
__global__ void MaxPoolBackwardKernel(const float* dy, const int32_t* argmax, float* dx, PoolShape s,
                                      int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) { dx[i] = MaxPoolInputGrad(dy, argmax, s, i); }
}

__global__ void AvgPoolForwardKernel(const float* x, float* y, PoolShape s, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(o, total) { y[o] = AvgPoolOutput(x, s, o); }
}

__global__ void AvgPoolBackwardKernel(const float* dy, float* dx, PoolShape s, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) { dx[i] = AvgPoolInputGrad(dy, s, i); }
}

// Sum of x^2 over the channel window of element (pixel, c).
__device__ float WindowSumSquares(const float* px, int c, int channels, int radius) {
  const int begin = max(c - radius, 0), end = min(c + radius, channels - 1);
  float acc = 0.0f;
  for (int k = begin; k <= end; ++k) acc = fmaf(px[k], px[k], acc);
  return acc;
}

__global__ void LrnForwardKernel(const float* x, float* y, LrnShape s, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) {
    const int c = static_cast<int>(i % s.channels);
    const float* px = x + (i - c);
    const float scale = s.bias + s.alpha * WindowSumSquares(px, c, s.channels, s.depth_radius);
    y[i] = x[i] * powf(scale, -s.beta);
  }
}

// Pass 1: t[j] = dy_j * y_j / s_j and p[j] = s_j^-beta.
__global__ void LrnBackwardPrepareKernel(const float* x, const float* y, const float* dy, float* t, float* p,
                                         LrnShape s, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) {
    const int c = static_cast<int>(i % s.channels);
    const float scale = s.bias + s.alpha * WindowSumSquares(x + (i - c), c, s.channels, s.depth_radius);
    t[i] = dy[i] * y[i] / scale;
    p[i] = powf(scale, -s.beta);
  }
}

// Pass 2: dx_c = dy_c * p_c - 2 alpha beta x_c * sum_{j in window(c)} t_j (the window is symmetric).
__global__ void LrnBackwardKernel(const float* x, const float* dy, const float* t, const float* p, float* dx,
                                  LrnShape s, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) {
    const int c = static_cast<int>(i % s.channels);
    const float* pt = t + (i - c);
    const int begin = max(c - s.depth_radius, 0), end = min(c + s.depth_radius, s.channels - 1);
    float acc = 0.0f;
    for (int k = begin; k <= end; ++k) acc += pt[k];
    dx[i] = dy[i] * p[i] - 2.0f * s.alpha * s.beta * x[i] * acc;
  }
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchMaxPoolForward(const float* x, float* y, int32_t* argmax, const PoolShape& s,
                                 cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(s.batch) * s.out_h * s.out_w * s.channels;
  if (total <= 0) return cudaSuccess;
  MaxPoolForwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, y, argmax, s, total);
  return cudaGetLastError();
}

cudaError_t LaunchMaxPoolBackward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& s,
                                  cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(s.batch) * s.in_h * s.in_w * s.channels;
  if (total <= 0) return cudaSuccess;
  MaxPoolBackwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(dy, argmax, dx, s, total);
  return cudaGetLastError();
}

cudaError_t LaunchAvgPoolForward(const float* x, float* y, const PoolShape& s, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(s.batch) * s.out_h * s.out_w * s.channels;
  if (total <= 0) return cudaSuccess;
  AvgPoolForwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, y, s, total);
  return cudaGetLastError();
}

cudaError_t LaunchAvgPoolBackward(const float* dy, float* dx, const PoolShape& s, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(s.batch) * s.in_h * s.in_w * s.channels;
  if (total <= 0) return cudaSuccess;
  AvgPoolBackwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(dy, dx, s, total);
  return cudaGetLastError();
}

cudaError_t LaunchLrnForward(const float* x, float* y, const LrnShape& s, cudaStream_t stream) {
  const int64_t total = s.pixels * s.channels;
  if (total <= 0) return cudaSuccess;
  LrnForwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, y, s, total);
  return cudaGetLastError();
}

cudaError_t LaunchLrnBackward(const float* x, const float* y, const float* dy, float* dx, float* scratch,
                              const LrnShape& s, cudaStream_t stream) {
  const int64_t total = s.pixels * s.channels;
  if (total <= 0) return cudaSuccess;
  float* t = scratch;
  float* p = scratch + total;
  LrnBackwardPrepareKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, y, dy, t, p, s, total);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  LrnBackwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(x, dy, t, p, dx, s, total);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
