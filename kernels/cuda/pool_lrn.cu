// NHWC max pooling (with TensorFlow's asymmetric SAME padding, where padded positions never win) and TensorFlow
// LRN across channels. Written by hand rather than with cuDNN: cuDNN pooling has only symmetric padding, and in
// NHWC the LRN channel window is contiguous, so plain kernels are simple and exact. Kernels first, launchers below.
#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

// ---- kernels ----

// One thread per output element (n, oh, ow, c).
__global__ void MaxPoolForwardKernel(const float* x, float* y, int32_t* argmax, PoolShape s, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(o, total) {
    int64_t t = o;
    const int c = static_cast<int>(t % s.channels);
    t /= s.channels;
    const int ow = static_cast<int>(t % s.out_w);
    t /= s.out_w;
    const int oh = static_cast<int>(t % s.out_h);
    const int64_t n = t / s.out_h;
    const int h0 = oh * s.stride - s.pad_top, w0 = ow * s.stride - s.pad_left;
    const int h_begin = max(h0, 0), h_end = min(h0 + s.window, s.in_h);
    const int w_begin = max(w0, 0), w_end = min(w0 + s.window, s.in_w);
    float best = -INFINITY;
    int64_t best_i = -1;
    for (int ih = h_begin; ih < h_end; ++ih) {
      for (int iw = w_begin; iw < w_end; ++iw) {
        const int64_t i = ((n * s.in_h + ih) * s.in_w + iw) * s.channels + c;
        const float v = x[i];
        if (best_i < 0 || v > best) {  // first maximum wins
          best = v;
          best_i = i;
        }
      }
    }
    y[o] = best;
    argmax[o] = static_cast<int32_t>(best_i);
  }
}

// One thread per input element (n, ih, iw, c): sums dy over the outputs whose window holds it and chose it.
__global__ void MaxPoolBackwardKernel(const float* dy, const int32_t* argmax, float* dx, PoolShape s,
                                      int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(i, total) {
    int64_t t = i;
    const int c = static_cast<int>(t % s.channels);
    t /= s.channels;
    const int iw = static_cast<int>(t % s.in_w);
    t /= s.in_w;
    const int ih = static_cast<int>(t % s.in_h);
    const int64_t n = t / s.in_h;
    // Output oh covers rows [oh * stride - pad_top, oh * stride - pad_top + window).
    const int lo_h = ih + s.pad_top - s.window + 1, lo_w = iw + s.pad_left - s.window + 1;
    const int oh_begin = lo_h <= 0 ? 0 : (lo_h + s.stride - 1) / s.stride;
    const int ow_begin = lo_w <= 0 ? 0 : (lo_w + s.stride - 1) / s.stride;
    const int oh_end = min(s.out_h - 1, (ih + s.pad_top) / s.stride);
    const int ow_end = min(s.out_w - 1, (iw + s.pad_left) / s.stride);
    float acc = 0.0f;
    for (int oh = oh_begin; oh <= oh_end; ++oh) {
      for (int ow = ow_begin; ow <= ow_end; ++ow) {
        const int64_t o = ((n * s.out_h + oh) * s.out_w + ow) * s.channels + c;
        if (argmax[o] == static_cast<int32_t>(i)) acc += dy[o];
      }
    }
    dx[i] = acc;
  }
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
