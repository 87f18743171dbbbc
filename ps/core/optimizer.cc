#include "ps/core/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/optimizer_math.h"

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
  } else if (config.name == "adam" || config.name == "pytorch_adam") {
    kind = Kind::kAdam;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer '", config.name, "' (expected sgd, momentum, adam or pytorch_adam)"));
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
  return kernels::DecayedLearningRate(config_.learning_rate, config_.decay_rate, config_.decay_steps,
                                      config_.staircase, step);
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
      if (paper_adam_) {
        float step_size, bc2_sqrt;
        kernels::PaperAdamScalars(lr, config_.beta1, config_.beta2, step, &step_size, &bc2_sqrt);
        kernels::ApplyPaperAdamLoop(step_size, bc2_sqrt, config_.beta1, config_.beta2, config_.epsilon, grad_scale,
                                    grad, var, slot0, slot1, n);
      } else {
        ApplyAdam(AdamLearningRate(lr, config_.beta1, config_.beta2, step), config_.beta1, config_.beta2,
                  config_.epsilon, grad_scale, grad, var, slot0, slot1, n);
      }
      break;
  }
}

// The arithmetic lives in kernels/optimizer_math.h, shared with the device optimizers (CPU and CUDA
// backends), so that a device-resident optimizer computes what the parameter server computes.

void ApplySgd(float lr, float grad_scale, const float* grad, float* var, int64_t n) {
  kernels::ApplySgdLoop(lr, grad_scale, grad, var, n);
}

void ApplyMomentum(float lr, float momentum, float grad_scale, const float* grad, float* var, float* accum,
                   int64_t n) {
  kernels::ApplyMomentumLoop(lr, momentum, grad_scale, grad, var, accum, n);
}

void ApplyAdam(float lr_t, float beta1, float beta2, float epsilon, float grad_scale, const float* grad,
               float* var, float* m, float* v, int64_t n) {
  kernels::ApplyAdamLoop(lr_t, beta1, beta2, epsilon, grad_scale, grad, var, m, v, n);
}

void AddInto(const float* src, float* dst, int64_t n) { kernels::AddIntoLoop(src, dst, n); }

float AdamLearningRate(float lr, float beta1, float beta2, int64_t step) {
  return kernels::AdamLearningRate(lr, beta1, beta2, step);
}

float MovingAverageDecay(float decay, int64_t num_updates) {
  return kernels::MovingAverageDecay(decay, num_updates);
}

void UpdateMovingAverage(float decay, const float* var, float* shadow, int64_t n) {
  kernels::UpdateMovingAverageLoop(decay, var, shadow, n);
}

}  // namespace dtrain::ps
