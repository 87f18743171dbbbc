#include "ps/core/sparse_optimizer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/optimizer_math.h"
#include "ps/core/optimizer.h"

namespace dtrain::ps {
namespace {

bool Finite(float x) { return std::isfinite(x); }

absl::Status Bad(const char* field, const char* want, float value) {
  return absl::InvalidArgumentError(absl::StrCat("sparse_optimizer ", field, " must be ", want, ", got ", value));
}

}  // namespace

absl::StatusOr<SparseOptimizer> SparseOptimizer::Create(const SparseOptimizerConfig& config,
                                                        const OptimizerConfig& decay) {
  Kind kind;
  if (config.name == "sgd") {
    kind = Kind::kSgd;
  } else if (config.name == "adagrad") {
    kind = Kind::kAdagrad;
  } else if (config.name == "adam") {
    kind = Kind::kAdam;
  } else if (config.name == "ftrl") {
    kind = Kind::kFtrl;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown sparse_optimizer '", config.name, "' (expected sgd, adagrad, adam or ftrl)"));
  }
  if (!Finite(config.learning_rate) || config.learning_rate < 0.0f) {
    return Bad("learning_rate", "finite and >= 0", config.learning_rate);
  }
  if (kind == Kind::kFtrl && !(config.learning_rate > 0.0f)) {
    return Bad("learning_rate", "> 0 for ftrl (it divides by it)", config.learning_rate);
  }
  if (kind == Kind::kAdagrad && !(Finite(config.initial_accumulator) && config.initial_accumulator > 0.0f)) {
    return Bad("initial_accumulator", "finite and > 0 for adagrad", config.initial_accumulator);
  }
  if (kind == Kind::kFtrl && !(Finite(config.initial_accumulator) && config.initial_accumulator >= 0.0f)) {
    return Bad("initial_accumulator", "finite and >= 0 for ftrl", config.initial_accumulator);
  }
  if (kind == Kind::kAdam) {
    if (!(config.beta1 > 0.0f && config.beta1 < 1.0f)) return Bad("beta1", "in (0, 1)", config.beta1);
    if (!(config.beta2 > 0.0f && config.beta2 < 1.0f)) return Bad("beta2", "in (0, 1)", config.beta2);
    if (!(Finite(config.epsilon) && config.epsilon > 0.0f)) return Bad("epsilon", "finite and > 0", config.epsilon);
  }
  if (kind == Kind::kFtrl) {
    if (!(Finite(config.l1) && config.l1 >= 0.0f)) return Bad("l1", "finite and >= 0", config.l1);
    if (!(Finite(config.l2) && config.l2 >= 0.0f)) return Bad("l2", "finite and >= 0", config.l2);
    if (!(Finite(config.lr_power) && config.lr_power <= 0.0f)) return Bad("lr_power", "<= 0", config.lr_power);
  }
  if (decay.decay_steps < 0 || (decay.decay_steps > 0 && !(Finite(decay.decay_rate) && decay.decay_rate > 0.0f))) {
    return absl::InvalidArgumentError("the learning-rate decay (optimizer decay_steps, decay_rate) is invalid");
  }
  return SparseOptimizer(kind, config, decay);
}

int SparseOptimizer::num_slots() const {
  switch (kind_) {
    case Kind::kSgd:
      return 0;
    case Kind::kAdagrad:
      return 1;
    case Kind::kAdam:
    case Kind::kFtrl:
      return 2;
  }
  return 0;
}

void SparseOptimizer::InitSlots(float* slots, int dim) const {
  switch (kind_) {
    case Kind::kSgd:
      break;
    case Kind::kAdagrad:
      std::fill(slots, slots + dim, config_.initial_accumulator);
      break;
    case Kind::kAdam:
      std::fill(slots, slots + 2 * dim, 0.0f);
      break;
    case Kind::kFtrl:
      std::fill(slots, slots + dim, 0.0f);                                 // z
      std::fill(slots + dim, slots + 2 * dim, config_.initial_accumulator);  // n
      break;
  }
}

SparseOptimizer::Step SparseOptimizer::Prepare(int64_t step) const {
  Step s;
  s.lr = ScheduledLearningRate(decay_, config_.learning_rate, step);  // the dense schedule
  if (kind_ == Kind::kAdam) s.lr_t = kernels::AdamLearningRate(s.lr, config_.beta1, config_.beta2, step);
  return s;
}

void SparseOptimizer::ApplyRow(const Step& step, float grad_scale, const float* grad, float* row, int dim) const {
  float* var = row;
  float* s0 = row + dim;
  float* s1 = row + 2 * dim;
  switch (kind_) {
    case Kind::kSgd:
      kernels::ApplySgdLoop(step.lr, grad_scale, grad, var, dim);  // the dense variables' loops
      break;
    case Kind::kAdagrad: {
      for (int i = 0; i < dim; ++i) {
        const float g = grad_scale * grad[i];
        s0[i] += g * g;
        var[i] -= step.lr * g / std::sqrt(s0[i]);
      }
      break;
    }
    case Kind::kAdam:  // lazy: only this row's moments move
      kernels::ApplyAdamLoop(step.lr_t, config_.beta1, config_.beta2, config_.epsilon, grad_scale, grad, var, s0, s1,
                             dim);
      break;
    case Kind::kFtrl: {
      const float lr = step.lr, l1 = config_.l1, l2 = config_.l2, p = config_.lr_power;
      const bool half = p == -0.5f;
      for (int i = 0; i < dim; ++i) {
        const float g = grad_scale * grad[i];
        float& z = s0[i];
        float& n = s1[i];
        const float n_new = n + g * g;
        const float pow_new = half ? std::sqrt(n_new) : std::pow(n_new, -p);
        const float pow_old = half ? std::sqrt(n) : std::pow(n, -p);
        z += g - (pow_new - pow_old) / lr * var[i];
        if (std::fabs(z) > l1) {
          const float sign = z > 0.0f ? 1.0f : (z < 0.0f ? -1.0f : 0.0f);
          var[i] = (sign * l1 - z) / (pow_new / lr + 2.0f * l2);
        } else {
          var[i] = 0.0f;
        }
        n = n_new;
      }
      break;
    }
  }
}

}  // namespace dtrain::ps
