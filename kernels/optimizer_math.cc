#include "kernels/optimizer_math.h"

namespace dtrain::kernels {

// The loops are written for the vectorizer: restrict pointers, inline per-element functions, no branches.
// kernels/CMakeLists.txt compiles this file with -fopenmp-simd -DDTRAIN_OMP_SIMD (so the pragma vectorizes
// even at -O2, whose cost model skips loops of unknown length), -fno-math-errno (sqrtf is an instruction, not
// an errno call) and -ffp-contract=off (no fused multiply-add: the CUDA kernels compute the same bits, see
// the header).
#if defined(DTRAIN_OMP_SIMD)
#define DTRAIN_SIMD_LOOP _Pragma("omp simd")
#else
#define DTRAIN_SIMD_LOOP
#endif

void ApplySgdLoop(float lr, float grad_scale, const float* __restrict grad, float* __restrict var,
                  int64_t n) {
  const float step = lr * grad_scale;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) SgdElement(step, grad[i], var[i]);
}

void ApplyMomentumLoop(float lr, float momentum, float grad_scale, const float* __restrict grad,
                       float* __restrict var, float* __restrict accum, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) MomentumElement(lr, momentum, grad_scale, grad[i], var[i], accum[i]);
}

void ApplyAdamLoop(float lr_t, float beta1, float beta2, float epsilon, float grad_scale,
                   const float* __restrict grad, float* __restrict var, float* __restrict m,
                   float* __restrict v, int64_t n) {
  const float one_minus_b1 = 1.0f - beta1;
  const float one_minus_b2 = 1.0f - beta2;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) {
    AdamElement(lr_t, beta1, one_minus_b1, beta2, one_minus_b2, epsilon, grad_scale, grad[i], var[i], m[i],
                v[i]);
  }
}

void ApplyPaperAdamLoop(float step_size, float bc2_sqrt, float beta1, float beta2, float epsilon, float grad_scale,
                        const float* __restrict grad, float* __restrict var, float* __restrict m,
                        float* __restrict v, int64_t n) {
  const float one_minus_b1 = 1.0f - beta1;
  const float one_minus_b2 = 1.0f - beta2;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) {
    PaperAdamElement(step_size, bc2_sqrt, beta1, one_minus_b1, beta2, one_minus_b2, epsilon, grad_scale, grad[i],
                     var[i], m[i], v[i]);
  }
}

void UpdateMovingAverageLoop(float decay, const float* __restrict var, float* __restrict shadow, int64_t n) {
  const float rate = 1.0f - decay;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) MovingAverageElement(rate, var[i], shadow[i]);
}

void AddIntoLoop(const float* __restrict src, float* __restrict dst, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

void ScaleInPlaceLoop(float a, float* __restrict x, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

}  // namespace dtrain::kernels
