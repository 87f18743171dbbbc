// Elementwise kernels: ReLU, dropout, bias add, axpy, scale, fill, the activations of imported graphs, strided
// copies and BatchNorm's running-statistics delta. Kernels first, launchers below.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"
#include "kernels/dropout_rng.h"  // the RNG shared with the CPU backend (host+device under nvcc)

namespace dtrain::kernels::cuda {
namespace {

// ---- kernels ----

__global__ void ReluKernel(const float* x, float* y, int64_t n) {
  // std::max(x, 0.0f) as on the CPU: NaN propagates (fmaxf would hide it) and -0 stays -0.
  DTRAIN_GRID_STRIDE_LOOP(i, n) { y[i] = x[i] < 0.0f ? 0.0f : x[i]; }
}

__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, int64_t n) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

// Same expression as kernels/cpu's DropoutLoop, so masks match bit for bit.
__global__ void DropoutKernel(const float* x, float* y, float* mask, int64_t n, float keep_prob, float inv_keep,
                              uint64_t key) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) {
    const float m = DropoutUniform(key, static_cast<uint64_t>(i)) < keep_prob ? inv_keep : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

// The counter is read when the kernel runs; thread 0 of each block derives the key once.
__global__ void DropoutDeviceCounterKernel(const float* x, float* y, float* mask, int64_t n, float keep_prob,
                                           float inv_keep, uint64_t seed, const int64_t* counter,
                                           uint64_t stride, uint64_t offset) {
  __shared__ uint64_t key;
  if (threadIdx.x == 0) key = DropoutKey(seed, DropoutCounterFrom(*counter, stride, offset));
  __syncthreads();
  DTRAIN_GRID_STRIDE_LOOP(i, n) {
    const float m = DropoutUniform(key, static_cast<uint64_t>(i)) < keep_prob ? inv_keep : 0.0f;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void MultiplyKernel(const float* a, const float* b, float* out, int64_t n) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) { out[i] = a[i] * b[i]; }
}

__global__ void BiasAddKernel(float* y, const float* bias, int64_t n, int channels) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) { y[i] += bias[i % channels]; }
}

__global__ void ScaledBiasAddKernel(float* y, const float* bias, float scale, int64_t n, int channels) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) { y[i] += scale * bias[i % channels]; }
}

__global__ void ActivationKernel(ActivationArgs a, const float* x, float* y, int64_t n) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) { y[i] = ActivationValue(a, x[i]); }
}

// x or y may be null when the kind does not read it (the caller passes what device.h gives).
__global__ void ActivationBackwardKernel(ActivationArgs a, const float* x, const float* y, const float* dy,
                                         float* dx, int64_t n) {
  const bool reads_x = !ActivationGradReadsY(a.kind);
  DTRAIN_GRID_STRIDE_LOOP(i, n) {
    dx[i] = ActivationGrad(a, reads_x ? x[i] : 0.0f, reads_x ? 0.0f : y[i], dy[i]);
  }
}

__global__ void CopyStridedKernel(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                                  int64_t cols, int64_t n, bool accumulate) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) {
    const int64_t r = i / cols, c = i % cols;
    const float v = src[r * src_stride + c];
    float* d = dst + r * dst_stride + c;
    *d = accumulate ? *d + v : v;
  }
}

__global__ void BatchNormRunningDeltaKernel(const float* running_mean, const float* running_var,
                                            const float* batch_mean, const float* batch_var, int channels,
                                            float momentum, float var_factor, float* d_mean, float* d_var) {
  DTRAIN_GRID_STRIDE_LOOP(c, channels) {
    d_mean[c] = momentum * (running_mean[c] - batch_mean[c]);
    d_var[c] = momentum * (running_var[c] - batch_var[c] * var_factor);
  }
}

__global__ void AxpyKernel(float a, const float* x, float* y, int64_t n) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) { y[i] = fmaf(a, x[i], y[i]); }
}

__global__ void ScaleKernel(float a, const float* x, float* y, int64_t n) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) { y[i] = a * x[i]; }
}

__global__ void FillKernel(float value, float* x, int64_t n) {
  DTRAIN_GRID_STRIDE_LOOP(i, n) { x[i] = value; }
}

__global__ void CopyToCounterSlotKernel(const float* src, float* slots, int64_t num_slots,
                                        const int64_t* counter) {
  int64_t k = *counter % num_slots;
  if (k < 0) k += num_slots;
  slots[k] = *src;
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchRelu(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ReluKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ReluBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(y, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t LaunchDropout(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                          uint64_t counter, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  DropoutKernel<<<BlocksFor(n), kThreads, 0, stream>>>(x, y, mask, n, keep_prob, 1.0f / keep_prob,
                                                        DropoutKey(seed, counter));
  return cudaGetLastError();
}

cudaError_t LaunchDropoutDeviceCounter(const float* x, float* y, float* mask, int64_t n, float keep_prob,
                                       uint64_t seed, const int64_t* device_counter, uint64_t counter_stride,
                                       uint64_t counter_offset, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  DropoutDeviceCounterKernel<<<BlocksFor(n), kThreads, 0, stream>>>(
      x, y, mask, n, keep_prob, 1.0f / keep_prob, seed, device_counter, counter_stride, counter_offset);
  return cudaGetLastError();
}

cudaError_t LaunchMultiply(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  MultiplyKernel<<<BlocksFor(n), kThreads, 0, stream>>>(a, b, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchBiasAdd(float* y, const float* bias, int64_t rows, int channels, cudaStream_t stream) {
  const int64_t n = rows * channels;
  if (n <= 0) return cudaSuccess;
  BiasAddKernel<<<BlocksFor(n), kThreads, 0, stream>>>(y, bias, n, channels);
  return cudaGetLastError();
}

cudaError_t LaunchScaledBiasAdd(float* y, const float* bias, float scale, int64_t rows, int channels,
                                cudaStream_t stream) {
  const int64_t n = rows * channels;
  if (n <= 0) return cudaSuccess;
  ScaledBiasAddKernel<<<BlocksFor(n), kThreads, 0, stream>>>(y, bias, scale, n, channels);
  return cudaGetLastError();
}

cudaError_t LaunchActivation(const ActivationArgs& a, const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ActivationKernel<<<BlocksFor(n), kThreads, 0, stream>>>(a, x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchActivationBackward(const ActivationArgs& a, const float* x, const float* y, const float* dy,
                                     float* dx, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ActivationBackwardKernel<<<BlocksFor(n), kThreads, 0, stream>>>(a, x, y, dy, dx, n);
  return cudaGetLastError();
}

cudaError_t LaunchCopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                              int64_t cols, bool accumulate, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return cudaSuccess;
  CopyStridedKernel<<<BlocksFor(n), kThreads, 0, stream>>>(src, src_stride, dst, dst_stride, cols, n, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchBatchNormRunningDelta(const float* running_mean, const float* running_var,
                                        const float* batch_mean, const float* batch_var, int channels,
                                        float momentum, float var_factor, float* d_mean, float* d_var,
                                        cudaStream_t stream) {
  if (channels <= 0) return cudaSuccess;
  BatchNormRunningDeltaKernel<<<BlocksFor(channels), kThreads, 0, stream>>>(
      running_mean, running_var, batch_mean, batch_var, channels, momentum, var_factor, d_mean, d_var);
  return cudaGetLastError();
}

cudaError_t LaunchAxpy(float a, const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AxpyKernel<<<BlocksFor(n), kThreads, 0, stream>>>(a, x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchScale(float a, const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<BlocksFor(n), kThreads, 0, stream>>>(a, x, y, n);
  return cudaGetLastError();
}

cudaError_t LaunchFill(float value, float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillKernel<<<BlocksFor(n), kThreads, 0, stream>>>(value, x, n);
  return cudaGetLastError();
}

cudaError_t LaunchCopyToCounterSlot(const float* src, float* slots, int64_t num_slots, const int64_t* counter,
                                    cudaStream_t stream) {
  CopyToCounterSlotKernel<<<1, 1, 0, stream>>>(src, slots, num_slots, counter);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
