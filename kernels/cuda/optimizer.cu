// Optimizer (SGD, momentum, Adam; exponential learning-rate decay; fused moving average) and step-counter
// kernels. The arithmetic is kernels/optimizer_math.h's, shared with the CPU backend and the parameter
// server; this file is compiled with --fmad=false (kernels/cuda/CMakeLists.txt) so that no multiply-add is
// fused and the per-element results are the CPU's bits. Kernels first, launchers below.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"
#include "kernels/optimizer_math.h"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kSgd = 0, kMomentum = 1, kAdam = 2;

// ---- kernels ----

// Every block reads the step when it runs (a graph replay sees the current value) and derives the step's
// scalars once in shared memory; then a grid-stride loop updates the elements.
template <int kKind, bool kShadow>
__global__ void OptimizerApplyKernel(OptimizerKernelParams p, const int64_t* step_ptr, float grad_scale,
                                     const float* grad, float* var, float* slot0, float* slot1, float* shadow,
                                     int64_t n) {
  __shared__ float scalars[4];  // sgd: lr * grad_scale, else lr | adam lr_t | 1 - moving-average decay | eps
  if (threadIdx.x == 0) {
    const int64_t step = *step_ptr;
    const float lr =
        DecayedLearningRate(p.learning_rate, p.decay_rate, p.decay_steps, p.staircase != 0, step);
    scalars[0] = kKind == kSgd ? lr * grad_scale : lr;
    scalars[1] = kKind == kAdam ? AdamLearningRate(lr, p.beta1, p.beta2, step) : 0.0f;
    scalars[2] = kShadow ? 1.0f - MovingAverageDecay(p.moving_average_decay, step + 1) : 0.0f;
    scalars[3] = 0.0f;
    if (kKind == kAdam && p.adam_paper_epsilon != 0) {
      PaperAdamScalars(lr, p.beta1, p.beta2, step, &scalars[1], &scalars[3]);  // step_size, bc2_sqrt
    }
  }
  __syncthreads();
  const float lr = scalars[0], lr_t = scalars[1], ma_rate = scalars[2], bc2_sqrt = scalars[3];
  DTRAIN_GRID_STRIDE_LOOP(i, n) {
    float w = var[i];
    if constexpr (kKind == kSgd) {
      SgdElement(lr, grad[i], w);
    } else if constexpr (kKind == kMomentum) {
      float a = slot0[i];
      MomentumElement(lr, p.momentum, grad_scale, grad[i], w, a);
      slot0[i] = a;
    } else {
      float m = slot0[i], v = slot1[i];
      if (p.adam_paper_epsilon != 0) {
        PaperAdamElement(lr_t, bc2_sqrt, p.beta1, p.one_minus_b1, p.beta2, p.one_minus_b2, p.epsilon, grad_scale,
                         grad[i], w, m, v);
      } else {
        AdamElement(lr_t, p.beta1, p.one_minus_b1, p.beta2, p.one_minus_b2, p.epsilon, grad_scale, grad[i], w,
                    m, v);
      }
      slot0[i] = m;
      slot1[i] = v;
    }
    var[i] = w;
    if constexpr (kShadow) {
      float s = shadow[i];
      MovingAverageElement(ma_rate, w, s);
      shadow[i] = s;
    }
  }
}

__global__ void CounterSetKernel(int64_t* counter, int64_t value) { *counter = value; }
__global__ void CounterIncrementKernel(int64_t* counter) { *counter += 1; }

template <int kKind, bool kShadow>
cudaError_t Launch(const OptimizerKernelParams& p, const int64_t* step, float grad_scale, const float* grad,
                   float* var, float* slot0, float* slot1, float* shadow, int64_t n, cudaStream_t stream) {
  OptimizerApplyKernel<kKind, kShadow>
      <<<BlocksFor(n), kThreads, 0, stream>>>(p, step, grad_scale, grad, var, slot0, slot1, shadow, n);
  return cudaGetLastError();
}

template <int kKind>
cudaError_t LaunchKind(const OptimizerKernelParams& p, const int64_t* step, float grad_scale,
                       const float* grad, float* var, float* slot0, float* slot1, float* shadow, int64_t n,
                       cudaStream_t stream) {
  return shadow != nullptr
             ? Launch<kKind, true>(p, step, grad_scale, grad, var, slot0, slot1, shadow, n, stream)
             : Launch<kKind, false>(p, step, grad_scale, grad, var, slot0, slot1, shadow, n, stream);
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchOptimizerApply(const OptimizerKernelParams& p, const int64_t* step, float grad_scale,
                                 const float* grad, float* var, float* slot0, float* slot1, float* shadow,
                                 int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (p.kind) {
    case kSgd:
      return LaunchKind<kSgd>(p, step, grad_scale, grad, var, slot0, slot1, shadow, n, stream);
    case kMomentum:
      return LaunchKind<kMomentum>(p, step, grad_scale, grad, var, slot0, slot1, shadow, n, stream);
    case kAdam:
      return LaunchKind<kAdam>(p, step, grad_scale, grad, var, slot0, slot1, shadow, n, stream);
    default:
      return cudaErrorInvalidValue;
  }
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
