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

namespace {

// The gradient of element i: grad_scale * grad, + l2 * var when kL2 (EffectiveGradient with l2 known != 0).
template <bool kL2>
inline float G(float grad_scale, float grad, float l2, float var) {
  return kL2 ? L2Gradient(grad_scale, grad, l2, var) : grad_scale * grad;
}

template <bool kL2>
void SgdL2Loop(float lr, float grad_scale, float l2, const float* __restrict grad, float* __restrict var,
               int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) var[i] -= lr * G<kL2>(grad_scale, grad[i], l2, var[i]);
}

template <bool kNesterov, bool kL2>
void MomentumLoop(float lr, float momentum, float grad_scale, float l2, const float* __restrict grad,
                  float* __restrict var, float* __restrict accum, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) {
    const float g = G<kL2>(grad_scale, grad[i], l2, var[i]);
    if (kNesterov) {
      NesterovElement(lr, momentum, g, var[i], accum[i]);
    } else {
      MomentumElement(lr, momentum, 1.0f, g, var[i], accum[i]);
    }
  }
}

template <bool kPaper, bool kL2, bool kDecoupled>
void AdamLoop(const OptimizerParams& p, const OptimizerStepScalars& s, float grad_scale,
              const float* __restrict grad, float* __restrict var, float* __restrict m, float* __restrict v,
              int64_t n) {
  const float lr_t = s.lr_t, bc2 = s.bc2_sqrt, decay = s.decay, l2 = s.l2, b1 = p.beta1, b2 = p.beta2,
              omb1 = s.one_minus_a, omb2 = s.one_minus_b, eps = p.epsilon;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) {
    const float g = G<kL2>(grad_scale, grad[i], l2, var[i]);
    float w = var[i];
    if (kDecoupled) w = w * decay;
    if (kPaper) {
      PaperAdamElement(lr_t, bc2, b1, omb1, b2, omb2, eps, 1.0f, g, w, m[i], v[i]);
    } else {
      AdamElement(lr_t, b1, omb1, b2, omb2, eps, 1.0f, g, w, m[i], v[i]);
    }
    var[i] = w;
  }
}

template <bool kL2>
void AdagradLoop(float lr, float epsilon, float grad_scale, float l2, const float* __restrict grad,
                 float* __restrict var, float* __restrict acc, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) AdagradElement(lr, epsilon, G<kL2>(grad_scale, grad[i], l2, var[i]), var[i], acc[i]);
}

// mom and mg may be null when the variant does not use them (the loop never touches them then).
template <bool kTorch, bool kMomentum, bool kCentered, bool kL2>
void RmsPropLoop(const OptimizerParams& p, const OptimizerStepScalars& s, float grad_scale,
                 const float* __restrict grad, float* __restrict var, float* __restrict ms, float* __restrict mom,
                 float* __restrict mg, int64_t n) {
  const float lr = s.lr, rho = p.rho, oma = s.one_minus_a, mu = p.momentum, eps = p.epsilon, l2 = s.l2;
  float unused_mom = 0.0f, unused_mg = 0.0f;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) {
    const float g = G<kL2>(grad_scale, grad[i], l2, var[i]);
    float& b = kMomentum ? mom[i] : unused_mom;
    float& c = kCentered ? mg[i] : unused_mg;
    if (kTorch) {
      TorchRmsPropElement<kMomentum, kCentered>(lr, rho, oma, mu, eps, g, var[i], ms[i], b, c);
    } else {
      TfRmsPropElement<kMomentum, kCentered>(lr, oma, mu, eps, g, var[i], ms[i], b, c);
    }
  }
}

template <bool kTorch, bool kMomentum, bool kCentered>
void RmsPropDispatchL2(const OptimizerParams& p, const OptimizerStepScalars& s, float grad_scale,
                       const float* grad, float* var, float* const* slots, int64_t n) {
  float* mom = kMomentum ? slots[p.rmsprop_momentum_slot()] : nullptr;
  float* mg = kCentered ? slots[p.rmsprop_mean_slot()] : nullptr;
  if (s.l2 != 0.0f) {
    RmsPropLoop<kTorch, kMomentum, kCentered, true>(p, s, grad_scale, grad, var, slots[0], mom, mg, n);
  } else {
    RmsPropLoop<kTorch, kMomentum, kCentered, false>(p, s, grad_scale, grad, var, slots[0], mom, mg, n);
  }
}

template <bool kTorch>
void RmsPropDispatch(const OptimizerParams& p, const OptimizerStepScalars& s, float grad_scale, const float* grad,
                     float* var, float* const* slots, int64_t n) {
  const bool mom = p.momentum > 0.0f;
  if (mom && p.centered) {
    RmsPropDispatchL2<kTorch, true, true>(p, s, grad_scale, grad, var, slots, n);
  } else if (mom) {
    RmsPropDispatchL2<kTorch, true, false>(p, s, grad_scale, grad, var, slots, n);
  } else if (p.centered) {
    RmsPropDispatchL2<kTorch, false, true>(p, s, grad_scale, grad, var, slots, n);
  } else {
    RmsPropDispatchL2<kTorch, false, false>(p, s, grad_scale, grad, var, slots, n);
  }
}

template <bool kPaper>
void AdamDispatch(const OptimizerParams& p, const OptimizerStepScalars& s, float grad_scale, const float* grad,
                  float* var, float* m, float* v, int64_t n) {
  const bool l2 = s.l2 != 0.0f;
  if (p.decoupled_weight_decay) {
    if (l2) {
      AdamLoop<kPaper, true, true>(p, s, grad_scale, grad, var, m, v, n);
    } else {
      AdamLoop<kPaper, false, true>(p, s, grad_scale, grad, var, m, v, n);
    }
  } else if (l2) {
    AdamLoop<kPaper, true, false>(p, s, grad_scale, grad, var, m, v, n);
  } else if (kPaper) {
    ApplyPaperAdamLoop(s.lr_t, s.bc2_sqrt, p.beta1, p.beta2, p.epsilon, grad_scale, grad, var, m, v, n);
  } else {
    ApplyAdamLoop(s.lr_t, p.beta1, p.beta2, p.epsilon, grad_scale, grad, var, m, v, n);
  }
}

}  // namespace

void ApplyOptimizerLoop(const OptimizerParams& p, const OptimizerStepScalars& s, float grad_scale,
                        const float* grad, float* var, float* const* slots, int64_t n) {
  const bool l2 = s.l2 != 0.0f;
  switch (p.kind) {
    case OptimizerKind::kSgd:
      if (l2) {
        SgdL2Loop<true>(s.lr, grad_scale, s.l2, grad, var, n);
      } else {
        ApplySgdLoop(s.lr, grad_scale, grad, var, n);
      }
      return;
    case OptimizerKind::kMomentum:
      if (p.nesterov) {
        if (l2) {
          MomentumLoop<true, true>(s.lr, p.momentum, grad_scale, s.l2, grad, var, slots[0], n);
        } else {
          MomentumLoop<true, false>(s.lr, p.momentum, grad_scale, s.l2, grad, var, slots[0], n);
        }
      } else if (l2) {
        MomentumLoop<false, true>(s.lr, p.momentum, grad_scale, s.l2, grad, var, slots[0], n);
      } else {
        ApplyMomentumLoop(s.lr, p.momentum, grad_scale, grad, var, slots[0], n);
      }
      return;
    case OptimizerKind::kAdam:
      if (p.adam_paper_epsilon) {
        AdamDispatch<true>(p, s, grad_scale, grad, var, slots[0], slots[1], n);
      } else {
        AdamDispatch<false>(p, s, grad_scale, grad, var, slots[0], slots[1], n);
      }
      return;
    case OptimizerKind::kAdagrad:
      if (l2) {
        AdagradLoop<true>(s.lr, p.epsilon, grad_scale, s.l2, grad, var, slots[0], n);
      } else {
        AdagradLoop<false>(s.lr, p.epsilon, grad_scale, s.l2, grad, var, slots[0], n);
      }
      return;
    case OptimizerKind::kRmsProp:
      if (p.torch_rmsprop) {
        RmsPropDispatch<true>(p, s, grad_scale, grad, var, slots, n);
      } else {
        RmsPropDispatch<false>(p, s, grad_scale, grad, var, slots, n);
      }
      return;
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

void AxpyIntoLoop(float a, const float* __restrict src, float* __restrict dst, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) dst[i] += a * src[i];
}

void ScaleInPlaceLoop(float a, float* __restrict x, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

double SumOfSquaresLoop(const float* __restrict x, int64_t n) {
  double sum = 0.0;
#if defined(DTRAIN_OMP_SIMD)
#pragma omp simd reduction(+ : sum)
#endif
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return sum;
}

}  // namespace dtrain::kernels
