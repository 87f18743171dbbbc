// The optimizer and moving-average arithmetic of dtrain, in one place for every user:
//   - the parameter server (ps/core/optimizer.cc) applies it to the host slices it holds;
//   - the CPU backend's device optimizer (kernels/cpu/cpu_optimizer.cc) runs the same loops;
//   - the CUDA backend (kernels/cuda/optimizer.cu) includes this header and calls the same inline per-element
//     and per-step functions from its kernels (they are __host__ __device__ under nvcc).
// TensorFlow 1.x semantics (tf.train.*Optimizer, exponential_decay, ExponentialMovingAverage):
//
//   lr(step)  = learning_rate * decay_rate ^ (step / decay_steps), the exponent floor()ed when staircase, no
//               decay when decay_steps <= 0; computed in double, rounded to float once
//   sgd       var -= (lr * grad_scale) * grad
//   momentum  accum = momentum * accum + grad_scale * grad;  var -= lr * accum
//   adam      lr_t = lr * sqrt(1 - beta2^(step+1)) / (1 - beta1^(step+1))   (double, rounded to float once)
//             g = grad_scale * grad;  m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
//             var -= lr_t * m / (sqrt(v) + epsilon)                          (epsilon outside the sqrt)
//   pytorch_  Kingma & Ba's Algorithm 1 as torch.optim.Adam computes it, in its order of operations:
//   adam      step_size = lr / (1 - beta1^t), bc2 = sqrt(1 - beta2^t)   (double, rounded to float once)
//             m, v as adam;  var += (-step_size * m) / (sqrt(v) / bc2 + epsilon)
//             (TensorFlow's form adds epsilon to the uncorrected sqrt(v): the two differ where sqrt(v) is near
//             epsilon)
//   moving    decay = min(d, (1 + num_updates) / (10 + num_updates))
//   average   shadow -= (1 - decay) * (shadow - var)
// `step` is the step being applied (0 for the first); the parameter server's moving averages use
// num_updates = step + 1 (the global step after the update).
//
// Bit-exactness across backends: every expression below is a fixed sequence of IEEE fp32 operations (no fused
// multiply-add: optimizer_math.cc is compiled with -ffp-contract=off and optimizer.cu with --fmad=false; sqrt
// and division are correctly rounded on both), so given the same per-step scalars the CPU and the GPU produce
// the same bits. The per-step scalars use double pow(), which may differ in the last bit between glibc and
// CUDA; after the rounding to float they almost always agree, and the tests allow 1e-6 relative.
//
// Thread-safety: pure functions of their arguments. The loops may run concurrently on disjoint arrays.
#ifndef DTRAIN_KERNELS_OPTIMIZER_MATH_H_
#define DTRAIN_KERNELS_OPTIMIZER_MATH_H_

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define DTRAIN_OPT_HD __host__ __device__
#else
#define DTRAIN_OPT_HD
#endif

namespace dtrain::kernels {

// ---- per-step scalars ----

// tf.train.exponential_decay for applying `step`.
DTRAIN_OPT_HD inline float DecayedLearningRate(float learning_rate, float decay_rate, int64_t decay_steps,
                                               bool staircase, int64_t step) {
  if (decay_steps <= 0) return learning_rate;
  double exponent = static_cast<double>(step) / static_cast<double>(decay_steps);
  if (staircase) exponent = ::floor(exponent);
  return static_cast<float>(learning_rate * ::pow(static_cast<double>(decay_rate), exponent));
}

// Adam's bias-corrected rate for applying `step`: lr * sqrt(1 - beta2^(step+1)) / (1 - beta1^(step+1)).
DTRAIN_OPT_HD inline float AdamLearningRate(float lr, float beta1, float beta2, int64_t step) {
  const double t = static_cast<double>(step) + 1.0;
  const double b1t = ::pow(static_cast<double>(beta1), t);
  const double b2t = ::pow(static_cast<double>(beta2), t);
  return static_cast<float>(lr * ::sqrt(1.0 - b2t) / (1.0 - b1t));
}

// pytorch_adam's per-step scalars for applying `step`: lr / (1 - beta1^(step+1)) and sqrt(1 - beta2^(step+1)).
DTRAIN_OPT_HD inline void PaperAdamScalars(float lr, float beta1, float beta2, int64_t step, float* step_size,
                                           float* bc2_sqrt) {
  const double t = static_cast<double>(step) + 1.0;
  *step_size = static_cast<float>(lr / (1.0 - ::pow(static_cast<double>(beta1), t)));
  *bc2_sqrt = static_cast<float>(::sqrt(1.0 - ::pow(static_cast<double>(beta2), t)));
}

// min(decay, (1 + num_updates) / (10 + num_updates)).
DTRAIN_OPT_HD inline float MovingAverageDecay(float decay, int64_t num_updates) {
  const double warmup = (1.0 + static_cast<double>(num_updates)) / (10.0 + static_cast<double>(num_updates));
  const double d = static_cast<double>(decay);
  return static_cast<float>(d < warmup ? d : warmup);
}

// ---- per-element updates (the loops below and the CUDA kernels call exactly these) ----

// sgd_step = lr * grad_scale (computed once per call).
DTRAIN_OPT_HD inline void SgdElement(float sgd_step, float grad, float& var) { var -= sgd_step * grad; }

DTRAIN_OPT_HD inline void MomentumElement(float lr, float momentum, float grad_scale, float grad, float& var,
                                          float& accum) {
  const float a = momentum * accum + grad_scale * grad;
  accum = a;
  var -= lr * a;
}

// one_minus_b1 = 1.0f - beta1 and one_minus_b2 = 1.0f - beta2, rounded to float once per call.
DTRAIN_OPT_HD inline void AdamElement(float lr_t, float beta1, float one_minus_b1, float beta2,
                                      float one_minus_b2, float epsilon, float grad_scale, float grad,
                                      float& var, float& m, float& v) {
  const float g = grad_scale * grad;
  const float mi = beta1 * m + one_minus_b1 * g;
  const float vi = beta2 * v + one_minus_b2 * g * g;
  m = mi;
  v = vi;
  var -= lr_t * mi / (::sqrtf(vi) + epsilon);
}

// torch.optim.Adam's element update (PaperAdamScalars; one_minus_* as for AdamElement).
DTRAIN_OPT_HD inline void PaperAdamElement(float step_size, float bc2_sqrt, float beta1, float one_minus_b1,
                                           float beta2, float one_minus_b2, float epsilon, float grad_scale,
                                           float grad, float& var, float& m, float& v) {
  const float g = grad_scale * grad;
  const float mi = beta1 * m + one_minus_b1 * g;
  const float vi = beta2 * v + one_minus_b2 * g * g;
  m = mi;
  v = vi;
  var += (-step_size * mi) / (::sqrtf(vi) / bc2_sqrt + epsilon);
}

// rate = 1.0f - decay.
DTRAIN_OPT_HD inline void MovingAverageElement(float rate, float var, float& shadow) {
  shadow -= rate * (shadow - var);
}

// ---- host loops (optimizer_math.cc; vectorized, no fused multiply-add) ----

void ApplySgdLoop(float lr, float grad_scale, const float* grad, float* var, int64_t n);
void ApplyMomentumLoop(float lr, float momentum, float grad_scale, const float* grad, float* var,
                       float* accum, int64_t n);
// lr_t is AdamLearningRate(lr, beta1, beta2, step).
void ApplyAdamLoop(float lr_t, float beta1, float beta2, float epsilon, float grad_scale, const float* grad,
                   float* var, float* m, float* v, int64_t n);
// PaperAdamScalars' step_size and bc2_sqrt.
void ApplyPaperAdamLoop(float step_size, float bc2_sqrt, float beta1, float beta2, float epsilon, float grad_scale,
                        const float* grad, float* var, float* m, float* v, int64_t n);
// shadow -= (1 - decay) * (shadow - var).
void UpdateMovingAverageLoop(float decay, const float* var, float* shadow, int64_t n);
// dst += src.
void AddIntoLoop(const float* src, float* dst, int64_t n);
// x *= a.
void ScaleInPlaceLoop(float a, float* x, int64_t n);

}  // namespace dtrain::kernels

#undef DTRAIN_OPT_HD

#endif  // DTRAIN_KERNELS_OPTIMIZER_MATH_H_
