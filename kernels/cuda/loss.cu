// Loss kernels: softmax and sigmoid cross-entropy (mean over the batch, with the gradient) and L2 loss. All reduce
// in a fixed order, so results are deterministic run to run. Kernels first, launchers below.
#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kXentThreads = 256;  // 8 warps; each warp owns rows warp, warp + 8, ...

__device__ float WarpMax(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

__device__ float WarpSum(float v) {
  for (int off = kWarp / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// ---- kernels ----

__global__ void SoftmaxCrossEntropyKernel(const float* logits, const float* labels, int batch, int classes,
                                          float* dlogits, float* loss, DeviceErrorInfo* error) {
  __shared__ float warp_loss[kXentThreads / kWarp];
  __shared__ int first_bad_row;  // batch when every label is valid
  if (threadIdx.x == 0) first_bad_row = batch;
  __syncthreads();
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, warps = blockDim.x / kWarp;
  const float inv_batch = 1.0f / static_cast<float>(batch);
  float loss_sum = 0.0f;  // meaningful in lane 0
  for (int r = warp; r < batch; r += warps) {
    const float* row = logits + static_cast<int64_t>(r) * classes;
    float* drow = dlogits + static_cast<int64_t>(r) * classes;
    float m = -INFINITY;
    for (int c = lane; c < classes; c += kWarp) m = fmaxf(m, row[c]);
    m = WarpMax(m);
    float s = 0.0f;
    for (int c = lane; c < classes; c += kWarp) s += expf(row[c] - m);
    s = WarpSum(s);
    const float label_f = labels[r];
    const bool valid = label_f >= 0.0f && label_f < static_cast<float>(classes) && floorf(label_f) == label_f;
    const int label = valid ? static_cast<int>(label_f) : -1;
    const float inv_s = 1.0f / s;
    for (int c = lane; c < classes; c += kWarp) {
      const float p = expf(row[c] - m) * inv_s;
      drow[c] = valid ? (p - (c == label ? 1.0f : 0.0f)) * inv_batch : NAN;
    }
    if (lane == 0) loss_sum += valid ? (m + logf(s) - row[label]) : NAN;
    if (lane == 0 && !valid) atomicMin(&first_bad_row, r);
  }
  if (lane == 0) warp_loss[warp] = loss_sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += warp_loss[w];
    *loss = total * inv_batch;
    // Report the first bad row in host-mapped memory (one thread, plain stores; only when nothing is
    // pending).
    if (first_bad_row < batch && error != nullptr && error->code == DeviceErrorInfo::kNone) {
      error->row = first_bad_row;
      error->label = labels[first_bad_row];
      error->classes = classes;
      __threadfence_system();
      error->code = DeviceErrorInfo::kBadLabel;
    }
  }
}

// One block: each thread sums its rows' losses (in double), then a fixed-order tree over the threads.
__global__ void SigmoidCrossEntropyKernel(const float* logits, const float* labels, int batch, float* dlogits,
                                          float* loss, DeviceErrorInfo* error) {
  __shared__ double partial[kXentThreads];
  __shared__ int first_bad_row;  // batch when every label is valid
  if (threadIdx.x == 0) first_bad_row = batch;
  __syncthreads();
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double acc = 0.0;
  for (int r = threadIdx.x; r < batch; r += blockDim.x) {
    const float z = logits[r], t = labels[r];
    if (IsBinaryLabel(t)) {
      acc += static_cast<double>(SigmoidCrossEntropyLoss(z, t));
      dlogits[r] = (Sigmoid(z) - t) * inv_batch;
    } else {
      acc = NAN;
      dlogits[r] = NAN;
      atomicMin(&first_bad_row, r);
    }
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = static_cast<float>(partial[0] / batch);
    if (first_bad_row < batch && error != nullptr && error->code == DeviceErrorInfo::kNone) {
      error->row = first_bad_row;
      error->label = labels[first_bad_row];
      __threadfence_system();
      error->code = DeviceErrorInfo::kBadBinaryLabel;
    }
  }
}

// Each block writes the sum of squares of its grid-stride share of x to partials[blockIdx.x].
__global__ void SumSquaresKernel(const float* x, int64_t n, float* partials) {
  __shared__ float shared[kThreads];
  float acc = 0.0f;
  DTRAIN_GRID_STRIDE_LOOP(i, n) { acc = fmaf(x[i], x[i], acc); }
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// One block of kL2LossPartials threads: *out = sum(partials[0..count)) / 2.
__global__ void HalfSumKernel(const float* partials, int count, float* out) {
  __shared__ float shared[kL2LossPartials];
  shared[threadIdx.x] = threadIdx.x < count ? partials[threadIdx.x] : 0.0f;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = 0.5f * shared[0];
}

static_assert(kThreads == 256 && kL2LossPartials == 256 && kXentThreads == 256,
              "reductions assume power-of-two block sizes");

}  // namespace

// ---- launchers ----

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes,
                                      float* dlogits, float* loss, DeviceErrorInfo* error,
                                      cudaStream_t stream) {
  SoftmaxCrossEntropyKernel<<<1, kXentThreads, 0, stream>>>(logits, labels, batch, classes, dlogits, loss,
                                                            error);
  return cudaGetLastError();
}

cudaError_t LaunchSigmoidCrossEntropy(const float* logits, const float* labels, int batch, float* dlogits,
                                      float* loss, DeviceErrorInfo* error, cudaStream_t stream) {
  SigmoidCrossEntropyKernel<<<1, kXentThreads, 0, stream>>>(logits, labels, batch, dlogits, loss, error);
  return cudaGetLastError();
}

cudaError_t LaunchL2Loss(const float* x, int64_t n, float* partials, float* out, cudaStream_t stream) {
  int blocks = BlocksFor(n);
  if (blocks > kL2LossPartials) blocks = kL2LossPartials;
  SumSquaresKernel<<<blocks, kThreads, 0, stream>>>(x, n, partials);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  HalfSumKernel<<<1, kL2LossPartials, 0, stream>>>(partials, blocks, out);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
