// Elementwise kernels: ReLU, dropout, bias add, axpy, scale, fill. Kernels first, launchers below.
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
