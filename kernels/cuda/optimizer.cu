// Optimizer (every kind of kernels/optimizer_math.h; learning-rate schedules; gradient clipping by a global norm
// gathered on the device; fused moving average) and step-counter kernels. The arithmetic is optimizer_math.h's,
// shared with the CPU backend and the parameter server; this file is compiled with --fmad=false
// (kernels/cuda/CMakeLists.txt) so that no multiply-add is fused and the per-element results are the CPU's bits.
// Kernels first, launchers below.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"
#include "kernels/optimizer_math.h"

namespace dtrain::kernels::cuda {
namespace {

// ---- kernels ----

// Every block reads the step (and the clipping norm) when it runs (a graph replay sees the current values) and
// derives the step's scalars once in shared memory; then a grid-stride loop updates the elements.
template <bool kShadow>
__global__ void OptimizerApplyKernel(OptimizerParams p, const int64_t* step_ptr, const double* norm_sq,
                                     float grad_scale, const float* grad, float* var, float* slot0, float* slot1,
                                     float* slot2, float* shadow, int64_t n) {
  __shared__ OptimizerStepScalars scalars;
  __shared__ float shared_scale, shared_ma_rate;
  if (threadIdx.x == 0) {
    const int64_t step = *step_ptr;
    scalars = StepScalarsFor(p, step);
    float gs = grad_scale;
    if (p.clip_norm > 0.0f) gs *= ClipFactor(p.clip_norm, sqrt(*norm_sq));
    shared_scale = gs;
    shared_ma_rate = kShadow ? 1.0f - MovingAverageDecay(p.moving_average_decay, step + 1) : 0.0f;
  }
  __syncthreads();
  const OptimizerStepScalars s = scalars;
  const float gs = shared_scale, ma_rate = shared_ma_rate;
  const int slots = p.num_slots();
  DTRAIN_GRID_STRIDE_LOOP(i, n) {
    float w = var[i];
    float a = slots > 0 ? slot0[i] : 0.0f, b = slots > 1 ? slot1[i] : 0.0f, c = slots > 2 ? slot2[i] : 0.0f;
    UpdateElement(p, s, gs, grad[i], w, a, b, c);
    var[i] = w;
    if (slots > 0) slot0[i] = a;
    if (slots > 1) slot1[i] = b;
    if (slots > 2) slot2[i] = c;
    if constexpr (kShadow) {
      float sh = shadow[i];
      MovingAverageElement(ma_rate, w, sh);
      shadow[i] = sh;
    }
  }
}

// Pass 1 of the norm: each block's sum of x^2 (grid-stride, then a fixed tree) into partials[blockIdx.x].
__global__ void NormPartialsKernel(const float* x, int64_t n, double* partials) {
  __shared__ double shared[kThreads];
  double sum = 0.0;
  DTRAIN_GRID_STRIDE_LOOP(i, n) {
    const double v = static_cast<double>(x[i]);
    sum += v * v;
  }
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// Pass 2: one block of kNormPartials threads adds the partials (fixed tree), scaled, to *norm_sq.
__global__ void NormAccumulateKernel(const double* partials, int count, double scale_sq, double* norm_sq) {
  __shared__ double shared[kNormPartials];
  shared[threadIdx.x] = threadIdx.x < count ? partials[threadIdx.x] : 0.0;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *norm_sq += shared[0] * scale_sq;
}

__global__ void NormClearKernel(double* norm_sq) { *norm_sq = 0.0; }

static_assert(kThreads == 256 && kNormPartials == 256, "the norm's reductions assume power-of-two blocks");

__global__ void CounterSetKernel(int64_t* counter, int64_t value) { *counter = value; }
__global__ void CounterIncrementKernel(int64_t* counter) { *counter += 1; }

}  // namespace

// ---- launchers ----

cudaError_t LaunchOptimizerApply(const OptimizerParams& p, const int64_t* step, const double* norm_sq,
                                 float grad_scale, const float* grad, float* var, float* slot0, float* slot1,
                                 float* slot2, float* shadow, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (p.clip_norm > 0.0f && norm_sq == nullptr) return cudaErrorInvalidValue;
  if (shadow != nullptr) {
    OptimizerApplyKernel<true><<<BlocksFor(n), kThreads, 0, stream>>>(p, step, norm_sq, grad_scale, grad, var,
                                                                       slot0, slot1, slot2, shadow, n);
  } else {
    OptimizerApplyKernel<false><<<BlocksFor(n), kThreads, 0, stream>>>(p, step, norm_sq, grad_scale, grad, var,
                                                                        slot0, slot1, slot2, shadow, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchNormClear(double* norm_sq, cudaStream_t stream) {
  NormClearKernel<<<1, 1, 0, stream>>>(norm_sq);
  return cudaGetLastError();
}

cudaError_t LaunchNormAdd(const float* x, int64_t n, float grad_scale, double* partials, double* norm_sq,
                          cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  int blocks = BlocksFor(n);
  if (blocks > kNormPartials) blocks = kNormPartials;
  NormPartialsKernel<<<blocks, kThreads, 0, stream>>>(x, n, partials);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const double scale = static_cast<double>(grad_scale);
  NormAccumulateKernel<<<1, kNormPartials, 0, stream>>>(partials, blocks, scale * scale, norm_sq);
  return cudaGetLastError();
}

cudaError_t LaunchCounterSet(int64_t* counter, int64_t value, cudaStream_t stream) {
  CounterSetKernel<<<1, 1, 0, stream>>>(counter, value);
  return cudaGetLastError();
}

cudaError_t LaunchCounterIncrement(int64_t* counter, cudaStream_t stream) {
  CounterIncrementKernel<<<1, 1, 0, stream>>>(counter);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
