// The optimizer and moving-average arithmetic of dtrain, in one place for every user:
//   - the parameter server (ps/core/optimizer.cc) applies it to the host slices it holds;
//   - the CPU backend's device optimizer (kernels/cpu/cpu_optimizer.cc) runs the same loops;
//   - the CUDA backend (kernels/cuda/optimizer.cu) includes this header and calls the same inline per-element
//     and per-step functions from its kernels (they are __host__ __device__ under nvcc).
//
// The update of one element, with g = grad_scale * grad (grad_scale folds the 1/R of an average and the clip
// factor in), then + weight_decay * var (L2, PyTorch's `weight_decay` of SGD/Adam/Adagrad/RMSprop) unless the
// decay is decoupled (adamw). `lr` is the scheduled learning rate (below); t = step + 1.
//
//   sgd       var -= lr * g          (without weight decay: var -= (lr * grad_scale) * grad)
//   momentum  accum = momentum * accum + g;  var -= lr * accum                    (tf.train.MomentumOptimizer,
//             nesterov: var -= lr * (g + momentum * accum)        torch.optim.SGD(momentum, nesterov), dampening 0)
//   adam      lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)   (double, rounded to float once)
//             m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
//             var -= lr_t * m / (sqrt(v) + epsilon)                 (tf.train.AdamOptimizer: epsilon outside sqrt)
//   pytorch_  torch.optim.Adam in its order of operations:  step_size = lr / (1 - beta1^t), bc2 = sqrt(1 - beta2^t)
//   adam      m, v as adam;  var += (-step_size * m) / (sqrt(v) / bc2 + epsilon)
//             (TensorFlow's form adds epsilon to the uncorrected sqrt(v): the two differ where sqrt(v) ~ epsilon)
//   adamw     torch.optim.AdamW: var *= (1 - lr * weight_decay) (the factor in double, rounded once), then
//             pytorch_adam without L2
//   adagrad   acc += g * g;  var += (-lr * g) / (sqrt(acc) + epsilon)   acc starts at initial_accumulator
//             (tf.train.AdagradOptimizer: initial 0.1, epsilon 0; torch.optim.Adagrad: initial 0, eps 1e-10)
//   rmsprop   TensorFlow's ApplyRMSProp / ApplyCenteredRMSProp, ms starting at 1:
//             ms += (g * g - ms) * (1 - rho);  centered: mg += (g - mg) * (1 - rho), d = ms - mg * mg, else d = ms
//             step = (g * lr) / sqrt(d + epsilon);  momentum > 0: mom = mom * momentum + step, var -= mom;
//             else var -= step                                              (epsilon inside the sqrt)
//   pytorch_  torch.optim.RMSprop, square_avg starting at 0 (rho is its alpha):
//   rmsprop   sq = sq * rho + (1 - rho) * g * g;  centered: ga = ga * rho + (1 - rho) * g,
//             avg = sqrt(sq - ga * ga) + epsilon, else avg = sqrt(sq) + epsilon;
//             momentum > 0: buf = buf * momentum + g / avg, var += -lr * buf; else var += (-lr * g) / avg
//             (epsilon outside the sqrt, the learning rate outside the momentum buffer)
//
// Slots, in this order (num_slots()): momentum [accum]; adam [m, v]; adagrad [acc]; rmsprop [ms, mom when
// momentum > 0, mg when centered]. SlotInitialValue says what a fresh slot holds.
//
// Learning-rate schedules (ScheduledLearningRate; computed in double, rounded to float once), for applying
// `step` (0 for the first):
//   warmup    step < warmup_steps: lr * (f + (1 - f) * step / warmup_steps), f = warmup_start_factor
//             (torch.optim.lr_scheduler.LinearLR(start_factor=f, total_iters=warmup_steps)); the decay below
//             then starts at step - warmup_steps (SequentialLR([LinearLR, decay], milestones=[warmup_steps]))
//   exponential  lr * decay_rate ^ (t / decay_steps), the exponent floor()ed when staircase; no decay when
//             decay_steps <= 0 (tf.train.exponential_decay; ExponentialLR(gamma) is decay_steps 1, StepLR
//             (step_size, gamma) is staircase with decay_steps = step_size)
//   cosine    min_lr + (lr - min_lr) * (1 + cos(pi * min(t, decay_steps) / decay_steps)) / 2
//             (CosineAnnealingLR(T_max=decay_steps, eta_min=min_lr) up to T_max; it stays at min_lr after,
//             as tf.train.cosine_decay does, where PyTorch's would rise again)
//
// Gradient clipping by global norm (clip_norm > 0): the gradient is scaled by ClipFactor(clip_norm, norm) =
// min(1, clip_norm / (norm + 1e-6)), torch.nn.utils.clip_grad_norm_'s factor, where norm is the L2 norm of the
// whole gradient (every trainable variable). Who computes the norm: see ps/api/ps_types.h (OptimizerConfig) and
// kernels/optimizer_ops.h (device optimizers).
//
// Moving averages (tf.train.ExponentialMovingAverage with num_updates):
//   decay = min(d, (1 + num_updates) / (10 + num_updates));  shadow -= (1 - decay) * (shadow - var)
// the parameter server's moving averages use num_updates = step + 1 (the global step after the update).
//
// Bit-exactness across backends: every expression below is a fixed sequence of IEEE fp32 operations (no fused
// multiply-add: optimizer_math.cc is compiled with -ffp-contract=off and optimizer.cu with --fmad=false; sqrt
// and division are correctly rounded on both), so given the same per-step scalars the CPU and the GPU produce
// the same bits. The per-step scalars use double pow() and cos(), which may differ in the last bit between glibc
// and CUDA; after the rounding to float they almost always agree, and the tests allow 1e-6 relative.
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

enum class OptimizerKind : int { kSgd = 0, kMomentum = 1, kAdam = 2, kAdagrad = 3, kRmsProp = 4 };
enum class LrSchedule : int { kExponential = 0, kCosine = 1 };

// Every hyperparameter of an update (plain data: the CUDA kernels take it by value). The meaning and the
// framework defaults per optimizer name are ps::OptimizerConfig's (ps/api/ps_types.h); kernels/optimizer_ops.h
// resolves names (SetOptimizerFromName) and checks ranges (ValidateOptimizerParams).
struct OptimizerParams {
  using Kind = OptimizerKind;
  Kind kind = Kind::kSgd;
  float learning_rate = 0.01f;
  // The schedule (see the header comment).
  LrSchedule schedule = LrSchedule::kExponential;
  int64_t decay_steps = 0;  // exponential: decay period (0: no decay); cosine: steps to reach min_learning_rate
  float decay_rate = 1.0f;
  bool staircase = false;
  float min_learning_rate = 0.0f;  // cosine
  int64_t warmup_steps = 0;
  float warmup_start_factor = 0.0f;
  float momentum = 0.9f;  // kMomentum; kRmsProp (0: no momentum slot)
  bool nesterov = false;  // kMomentum
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;  // kAdam; epsilon also kAdagrad and kRmsProp
  // kAdam: epsilon in the paper's place (torch.optim.Adam's; "pytorch_adam", "adamw") instead of TensorFlow's.
  bool adam_paper_epsilon = false;
  float weight_decay = 0.0f;          // L2 added to the gradient, or decoupled (below)
  bool decoupled_weight_decay = false;  // kAdam ("adamw"): var *= 1 - lr * weight_decay before the update
  float rho = 0.9f;                   // kRmsProp: the squares' decay (TensorFlow's decay, PyTorch's alpha)
  bool centered = false;              // kRmsProp
  bool torch_rmsprop = false;         // kRmsProp: torch.optim.RMSprop's form ("pytorch_rmsprop")
  float initial_accumulator = 0.1f;   // kAdagrad: what the accumulator starts at
  float clip_norm = 0.0f;             // > 0: gradients clipped to this global norm
  float moving_average_decay = 0.0f;  // > 0: moving averages may be updated with the variables

  // Slots per variable element (see the header comment for their order).
  DTRAIN_OPT_HD int num_slots() const {
    switch (kind) {
      case Kind::kSgd:
        return 0;
      case Kind::kMomentum:
      case Kind::kAdagrad:
        return 1;
      case Kind::kAdam:
        return 2;
      case Kind::kRmsProp:
        return 1 + (momentum > 0.0f ? 1 : 0) + (centered ? 1 : 0);
    }
    return 0;
  }
  // What slot k holds before the first update: adagrad's accumulator initial_accumulator, TensorFlow's
  // rmsprop's ms 1, everything else 0.
  DTRAIN_OPT_HD float SlotInitialValue(int k) const {
    if (kind == Kind::kAdagrad && k == 0) return initial_accumulator;
    if (kind == Kind::kRmsProp && !torch_rmsprop && k == 0) return 1.0f;
    return 0.0f;
  }
  // kRmsProp: the index of the momentum slot and of the mean-gradient slot (-1: none).
  DTRAIN_OPT_HD int rmsprop_momentum_slot() const { return momentum > 0.0f ? 1 : -1; }
  DTRAIN_OPT_HD int rmsprop_mean_slot() const { return centered ? (momentum > 0.0f ? 2 : 1) : -1; }
};

// ---- per-step scalars ----

// tf.train.exponential_decay for applying `step`.
DTRAIN_OPT_HD inline float DecayedLearningRate(float learning_rate, float decay_rate, int64_t decay_steps,
                                               bool staircase, int64_t step) {
  if (decay_steps <= 0) return learning_rate;
  double exponent = static_cast<double>(step) / static_cast<double>(decay_steps);
  if (staircase) exponent = ::floor(exponent);
  return static_cast<float>(learning_rate * ::pow(static_cast<double>(decay_rate), exponent));
}

// The learning rate for applying `step` under p's schedule, starting from `base` (p.learning_rate for the
// variables; the sparse tables' own rate follows the same schedule).
DTRAIN_OPT_HD inline float ScheduledLearningRate(const OptimizerParams& p, float base, int64_t step) {
  if (p.warmup_steps > 0) {
    if (step < p.warmup_steps) {
      const double f = static_cast<double>(p.warmup_start_factor);
      return static_cast<float>(static_cast<double>(base) *
                                (f + (1.0 - f) * static_cast<double>(step) / static_cast<double>(p.warmup_steps)));
    }
    step -= p.warmup_steps;
  }
  if (p.schedule == LrSchedule::kCosine) {
    if (p.decay_steps <= 0) return base;
    const double t = static_cast<double>(step < p.decay_steps ? step : p.decay_steps);
    const double lo = static_cast<double>(p.min_learning_rate);
    const double kPi = 3.14159265358979323846;
    return static_cast<float>(lo + (static_cast<double>(base) - lo) *
                                       (1.0 + ::cos(kPi * t / static_cast<double>(p.decay_steps))) / 2.0);
  }
  return DecayedLearningRate(base, p.decay_rate, p.decay_steps, p.staircase, step);
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

// min(1, clip_norm / (norm + 1e-6)) (torch.nn.utils.clip_grad_norm_), in double, rounded once. 1 when
// clip_norm <= 0 (no clipping) or the norm is NaN (the gradient's NaN is left to the non-finite policy).
DTRAIN_OPT_HD inline float ClipFactor(float clip_norm, double norm) {
  if (!(clip_norm > 0.0f)) return 1.0f;
  const double c = static_cast<double>(clip_norm) / (norm + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.0f;
}

// Everything an update needs that depends on the step only, computed once per step (or per Apply).
// (Trivial, without member initializers, so that a CUDA kernel can keep one in shared memory; StepScalarsFor
// sets every field.)
struct OptimizerStepScalars {
  float lr;        // the scheduled learning rate
  float lr_t;      // adam: the bias-corrected rate; pytorch_adam/adamw: step_size
  float bc2_sqrt;  // pytorch_adam/adamw: sqrt(1 - beta2^t)
  float decay;     // adamw: 1 - lr * weight_decay (else 1)
  float one_minus_a, one_minus_b;  // adam: 1 - beta1, 1 - beta2; rmsprop: 1 - rho (a)
  float l2;        // the weight decay added to the gradient (0 when decoupled or off)
};

DTRAIN_OPT_HD inline OptimizerStepScalars StepScalarsFor(const OptimizerParams& p, int64_t step) {
  OptimizerStepScalars s{};
  s.decay = 1.0f;
  s.lr = ScheduledLearningRate(p, p.learning_rate, step);
  s.l2 = p.decoupled_weight_decay ? 0.0f : p.weight_decay;
  if (p.kind == OptimizerKind::kAdam) {
    if (p.adam_paper_epsilon) {
      PaperAdamScalars(s.lr, p.beta1, p.beta2, step, &s.lr_t, &s.bc2_sqrt);
    } else {
      s.lr_t = AdamLearningRate(s.lr, p.beta1, p.beta2, step);
    }
    if (p.decoupled_weight_decay) {
      s.decay = static_cast<float>(1.0 - static_cast<double>(s.lr) * static_cast<double>(p.weight_decay));
    }
    s.one_minus_a = 1.0f - p.beta1;  // rounded once, as ApplyAdamLoop always did
    s.one_minus_b = 1.0f - p.beta2;
  } else if (p.kind == OptimizerKind::kRmsProp) {
    s.one_minus_a = static_cast<float>(1.0 - static_cast<double>(p.rho));
  }
  return s;
}

// ---- per-element updates (the loops below and the CUDA kernels call exactly these) ----

// sgd_step = lr * grad_scale (computed once per call).
DTRAIN_OPT_HD inline void SgdElement(float sgd_step, float grad, float& var) { var -= sgd_step * grad; }

// The gradient with L2 weight decay: grad_scale * grad + l2 * var.
DTRAIN_OPT_HD inline float L2Gradient(float grad_scale, float grad, float l2, float var) {
  return grad_scale * grad + l2 * var;
}

DTRAIN_OPT_HD inline void MomentumElement(float lr, float momentum, float grad_scale, float grad, float& var,
                                          float& accum) {
  const float a = momentum * accum + grad_scale * grad;
  accum = a;
  var -= lr * a;
}

// Nesterov momentum on the gradient g (scaled and decayed already).
DTRAIN_OPT_HD inline void NesterovElement(float lr, float momentum, float g, float& var, float& accum) {
  const float a = momentum * accum + g;
  accum = a;
  var -= lr * (g + momentum * a);
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

DTRAIN_OPT_HD inline void AdagradElement(float lr, float epsilon, float g, float& var, float& acc) {
  const float a = acc + g * g;
  acc = a;
  var += (-lr * g) / (::sqrtf(a) + epsilon);
}

// TensorFlow's RMSProp (one_minus_rho = 1 - rho); mom and mg are only touched when kMomentum / kCentered.
template <bool kMomentum, bool kCentered>
DTRAIN_OPT_HD inline void TfRmsPropElement(float lr, float one_minus_rho, float momentum, float epsilon, float g,
                                           float& var, float& ms, float& mom, float& mg) {
  const float msi = ms + (g * g - ms) * one_minus_rho;
  ms = msi;
  float d = msi;
  if (kCentered) {
    const float mgi = mg + (g - mg) * one_minus_rho;
    mg = mgi;
    d = msi - mgi * mgi;
  }
  const float step = (g * lr) / ::sqrtf(d + epsilon);
  if (kMomentum) {
    const float mi = mom * momentum + step;
    mom = mi;
    var -= mi;
  } else {
    var -= step;
  }
}

// torch.optim.RMSprop (alpha = rho, one_minus_alpha = 1 - rho); buf and ga only when kMomentum / kCentered.
template <bool kMomentum, bool kCentered>
DTRAIN_OPT_HD inline void TorchRmsPropElement(float lr, float alpha, float one_minus_alpha, float momentum,
                                              float epsilon, float g, float& var, float& sq, float& buf,
                                              float& ga) {
  const float s = sq * alpha + one_minus_alpha * g * g;
  sq = s;
  float avg;
  if (kCentered) {
    const float a = ga * alpha + one_minus_alpha * g;
    ga = a;
    avg = ::sqrtf(s - a * a) + epsilon;
  } else {
    avg = ::sqrtf(s) + epsilon;
  }
  if (kMomentum) {
    const float b = buf * momentum + g / avg;
    buf = b;
    var += -lr * b;
  } else {
    var += (-lr * g) / avg;
  }
}

// The gradient an update uses: grad_scale * grad, plus l2 * var when l2 != 0 (L2 weight decay).
DTRAIN_OPT_HD inline float EffectiveGradient(float grad_scale, float grad, float l2, float var) {
  return l2 != 0.0f ? L2Gradient(grad_scale, grad, l2, var) : grad_scale * grad;
}

// The update of one element for any kind: slot values s0..s2 as p.num_slots() says (the others untouched).
// What the CUDA kernel runs per element; the host loops (optimizer_math.cc) run the same per-kind functions
// from loops specialized per variant, so both give the same bits.
DTRAIN_OPT_HD inline void UpdateElement(const OptimizerParams& p, const OptimizerStepScalars& s, float grad_scale,
                                        float grad, float& var, float& s0, float& s1, float& s2) {
  if (p.kind == OptimizerKind::kSgd && s.l2 == 0.0f) {
    SgdElement(s.lr * grad_scale, grad, var);
    return;
  }
  const float g = EffectiveGradient(grad_scale, grad, s.l2, var);
  switch (p.kind) {
    case OptimizerKind::kSgd:
      var -= s.lr * g;
      return;
    case OptimizerKind::kMomentum:
      if (p.nesterov) {
        NesterovElement(s.lr, p.momentum, g, var, s0);
      } else {
        MomentumElement(s.lr, p.momentum, 1.0f, g, var, s0);
      }
      return;
    case OptimizerKind::kAdam:
      if (p.decoupled_weight_decay) var = var * s.decay;
      if (p.adam_paper_epsilon) {
        PaperAdamElement(s.lr_t, s.bc2_sqrt, p.beta1, s.one_minus_a, p.beta2, s.one_minus_b, p.epsilon, 1.0f, g,
                         var, s0, s1);
      } else {
        AdamElement(s.lr_t, p.beta1, s.one_minus_a, p.beta2, s.one_minus_b, p.epsilon, 1.0f, g, var, s0, s1);
      }
      return;
    case OptimizerKind::kAdagrad:
      AdagradElement(s.lr, p.epsilon, g, var, s0);
      return;
    case OptimizerKind::kRmsProp: {
      const bool mom = p.momentum > 0.0f;
      // Slot 1 is the momentum's when there is one, else the mean gradient's.
      float& m = s1;
      float& mg = mom ? s2 : s1;
      const float lr = s.lr, a = p.rho, oma = s.one_minus_a, mu = p.momentum, eps = p.epsilon;
      if (p.torch_rmsprop) {
        if (mom && p.centered) {
          TorchRmsPropElement<true, true>(lr, a, oma, mu, eps, g, var, s0, m, mg);
        } else if (mom) {
          TorchRmsPropElement<true, false>(lr, a, oma, mu, eps, g, var, s0, m, mg);
        } else if (p.centered) {
          TorchRmsPropElement<false, true>(lr, a, oma, mu, eps, g, var, s0, m, mg);
        } else {
          TorchRmsPropElement<false, false>(lr, a, oma, mu, eps, g, var, s0, m, mg);
        }
      } else {
        if (mom && p.centered) {
          TfRmsPropElement<true, true>(lr, oma, mu, eps, g, var, s0, m, mg);
        } else if (mom) {
          TfRmsPropElement<true, false>(lr, oma, mu, eps, g, var, s0, m, mg);
        } else if (p.centered) {
          TfRmsPropElement<false, true>(lr, oma, mu, eps, g, var, s0, m, mg);
        } else {
          TfRmsPropElement<false, false>(lr, oma, mu, eps, g, var, s0, m, mg);
        }
      }
      return;
    }
  }
}

// rate = 1.0f - decay.
DTRAIN_OPT_HD inline void MovingAverageElement(float rate, float var, float& shadow) {
  shadow -= rate * (shadow - var);
}

// ---- host loops (optimizer_math.cc; vectorized, no fused multiply-add) ----

// One update of n elements of any kind: gradient grad_scale * grad[i], slots[k] for k < p.num_slots() (each n
// floats), s = StepScalarsFor(p, step). The same bits as UpdateElement per element.
void ApplyOptimizerLoop(const OptimizerParams& p, const OptimizerStepScalars& s, float grad_scale,
                        const float* grad, float* var, float* const* slots, int64_t n);

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
// dst += a * src.
void AxpyIntoLoop(float a, const float* src, float* dst, int64_t n);
// x *= a.
void ScaleInPlaceLoop(float a, float* x, int64_t n);
// sum of x[i]^2 in double (the same bits for the same n and x).
double SumOfSquaresLoop(const float* x, int64_t n);

}  // namespace dtrain::kernels

#undef DTRAIN_OPT_HD

#endif  // DTRAIN_KERNELS_OPTIMIZER_MATH_H_
