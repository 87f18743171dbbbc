#include "ps/optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dtrain::ps {
namespace {

bool Finite(float x) { return std::isfinite(x); }

absl::Status CheckOpen01(const char* field, float value) {
  if (!(value > 0.0f && value < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", field, " must be in (0, 1), got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Optimizer> Optimizer::Create(const OptimizerConfig& config) {
  Kind kind;
  if (config.name == "sgd") {
    kind = Kind::kSgd;
  } else if (config.name == "momentum") {
    kind = Kind::kMomentum;
  } else if (config.name == "adam") {
    kind = Kind::kAdam;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer '", config.name, "' (expected sgd, momentum or adam)"));
  }
  if (!Finite(config.learning_rate) || config.learning_rate < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer learning_rate must be finite and >= 0, got ", config.learning_rate));
  }
  if (config.decay_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer decay_steps must be >= 0, got ", config.decay_steps));
  }
  if (config.decay_steps > 0 && !(Finite(config.decay_rate) && config.decay_rate > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer decay_rate must be finite and > 0, got ", config.decay_rate));
  }
  if (kind == Kind::kMomentum && !(Finite(config.momentum) && config.momentum >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer momentum must be finite and >= 0, got ", config.momentum));
  }
  if (kind == Kind::kAdam) {
    if (absl::Status s = CheckOpen01("beta1", config.beta1); !s.ok()) return s;
    if (absl::Status s = CheckOpen01("beta2", config.beta2); !s.ok()) return s;
    if (!(Finite(config.epsilon) && config.epsilon > 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer epsilon must be finite and > 0, got ", config.epsilon));
    }
  }
  return Optimizer(kind, config);
}

int Optimizer::num_slots() const {
  switch (kind_) {
    case Kind::kSgd:
      return 0;
    case Kind::kMomentum:
      return 1;
    case Kind::kAdam:
      return 2;
  }
  return 0;
}

float Optimizer::LearningRate(int64_t step) const {
  if (config_.decay_steps <= 0) return config_.learning_rate;
  double exponent = static_cast<double>(step) / static_cast<double>(config_.decay_steps);
  if (config_.staircase) exponent = std::floor(exponent);
  return static_cast<float>(config_.learning_rate * std::pow(static_cast<double>(config_.decay_rate), exponent));
}

void Optimizer::Apply(int64_t step, float grad_scale, const float* grad, float* var, float* slot0, float* slot1,
                      int64_t n) const {
  const float lr = LearningRate(step);
  switch (kind_) {
    case Kind::kSgd:
      ApplySgd(lr, grad_scale, grad, var, n);
      break;
    case Kind::kMomentum:
      ApplyMomentum(lr, config_.momentum, grad_scale, grad, var, slot0, n);
      break;
    case Kind::kAdam:
      ApplyAdam(AdamLearningRate(lr, config_.beta1, config_.beta2, step), config_.beta1, config_.beta2,
                config_.epsilon, grad_scale, grad, var, slot0, slot1, n);
      break;
  }
}

// The loops below are written for the vectorizer: restrict pointers, no calls, no branches. CMakeLists.txt
// compiles this file with -fopenmp-simd -DDTRAIN_OMP_SIMD (so the pragma vectorizes even at -O2, whose cost
// model skips loops of unknown length) and -fno-math-errno (so sqrt is an instruction, not an errno call).
#if defined(DTRAIN_OMP_SIMD)
#define DTRAIN_SIMD_LOOP _Pragma("omp simd")
#else
#define DTRAIN_SIMD_LOOP
#endif

void ApplySgd(float lr, float grad_scale, const float* __restrict grad, float* __restrict var, int64_t n) {
  const float step = lr * grad_scale;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) var[i] -= step * grad[i];
}

void ApplyMomentum(float lr, float momentum, float grad_scale, const float* __restrict grad,
                   float* __restrict var, float* __restrict accum, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) {
    const float a = momentum * accum[i] + grad_scale * grad[i];
    accum[i] = a;
    var[i] -= lr * a;
  }
}

void ApplyAdam(float lr_t, float beta1, float beta2, float epsilon, float grad_scale, const float* __restrict grad,
               float* __restrict var, float* __restrict m, float* __restrict v, int64_t n) {
  const float one_minus_b1 = 1.0f - beta1;
  const float one_minus_b2 = 1.0f - beta2;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad_scale * grad[i];
    const float mi = beta1 * m[i] + one_minus_b1 * g;
    const float vi = beta2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    var[i] -= lr_t * mi / (std::sqrt(vi) + epsilon);
  }
}

void AddInto(const float* __restrict src, float* __restrict dst, int64_t n) {
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

float AdamLearningRate(float lr, float beta1, float beta2, int64_t step) {
  const double t = static_cast<double>(step) + 1.0;
  const double b1t = std::pow(static_cast<double>(beta1), t);
  const double b2t = std::pow(static_cast<double>(beta2), t);
  return static_cast<float>(lr * std::sqrt(1.0 - b2t) / (1.0 - b1t));
}

float MovingAverageDecay(float decay, int64_t num_updates) {
  const double warmup = (1.0 + static_cast<double>(num_updates)) / (10.0 + static_cast<double>(num_updates));
  return static_cast<float>(std::min(static_cast<double>(decay), warmup));
}

void UpdateMovingAverage(float decay, const float* __restrict var, float* __restrict shadow, int64_t n) {
  const float rate = 1.0f - decay;
  DTRAIN_SIMD_LOOP
  for (int64_t i = 0; i < n; ++i) shadow[i] -= rate * (shadow[i] - var[i]);
}

}  // namespace dtrain::ps
