#include "ps/core/optimizer.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "kernels/optimizer_ops.h"

namespace dtrain::ps {

absl::StatusOr<OptimizerConfig> DefaultOptimizerConfig(const std::string& name) {
  kernels::OptimizerParams p;
  RETURN_IF_ERROR(kernels::SetOptimizerFromName(name, &p));
  OptimizerConfig c;
  c.name = name;
  c.momentum = 0.9f;
  c.beta1 = 0.9f;
  c.beta2 = 0.999f;
  c.epsilon = 1e-8f;
  if (name == "adamw") c.weight_decay = 0.01f;
  if (name == "adagrad") {
    c.initial_accumulator = 0.1f;
    c.epsilon = 0.0f;
  } else if (name == "pytorch_adagrad") {
    c.initial_accumulator = 0.0f;
    c.epsilon = 1e-10f;
  } else if (name == "rmsprop") {
    c.rho = 0.9f;
    c.epsilon = 1e-10f;
    c.momentum = 0.0f;
  } else if (name == "pytorch_rmsprop") {
    c.rho = 0.99f;
    c.epsilon = 1e-8f;
    c.momentum = 0.0f;
  }
  return c;
}

FrameworkLearningRate FrameworkDefaultLearningRate(const std::string& name) {
  if (name == "adam") return {0.001f, "tf.train.AdamOptimizer"};
  if (name == "pytorch_adam") return {0.001f, "torch.optim.Adam"};
  if (name == "adamw") return {0.001f, "torch.optim.AdamW"};
  if (name == "rmsprop") return {0.001f, "Keras' RMSprop"};
  if (name == "adagrad") return {0.001f, "Keras' Adagrad"};
  if (name == "pytorch_rmsprop") return {0.01f, "torch.optim.RMSprop"};
  if (name == "pytorch_adagrad") return {0.01f, "torch.optim.Adagrad"};
  return {};
}

absl::StatusOr<kernels::OptimizerParams> ToOptimizerParams(const OptimizerConfig& config,
                                                           float moving_average_decay) {
  kernels::OptimizerParams p;
  RETURN_IF_ERROR(kernels::SetOptimizerFromName(config.name, &p));
  p.learning_rate = config.learning_rate;
  if (config.lr_schedule == "exponential") {
    p.schedule = kernels::LrSchedule::kExponential;
  } else if (config.lr_schedule == "cosine") {
    p.schedule = kernels::LrSchedule::kCosine;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown learning-rate schedule '", config.lr_schedule,
                                                   "' (expected exponential or cosine)"));
  }
  p.decay_steps = config.decay_steps;
  p.decay_rate = config.decay_rate;
  p.staircase = config.staircase;
  p.min_learning_rate = config.min_learning_rate;
  p.warmup_steps = config.warmup_steps;
  p.warmup_start_factor = config.warmup_start_factor;
  p.momentum = config.momentum;
  p.nesterov = config.nesterov;
  p.beta1 = config.beta1;
  p.beta2 = config.beta2;
  p.epsilon = config.epsilon;
  p.weight_decay = config.weight_decay;
  p.rho = config.rho;
  p.centered = config.centered;
  p.initial_accumulator = config.initial_accumulator;
  p.clip_norm = config.clip_norm;
  p.moving_average_decay = moving_average_decay;
  RETURN_IF_ERROR(kernels::ValidateOptimizerParams(p));
  return p;
}

float ScheduledLearningRate(const OptimizerConfig& config, float base, int64_t step) {
  kernels::OptimizerParams p;
  p.schedule = config.lr_schedule == "cosine" ? kernels::LrSchedule::kCosine : kernels::LrSchedule::kExponential;
  p.decay_steps = config.decay_steps;
  p.decay_rate = config.decay_rate;
  p.staircase = config.staircase;
  p.min_learning_rate = config.min_learning_rate;
  p.warmup_steps = config.warmup_steps;
  p.warmup_start_factor = config.warmup_start_factor;
  return kernels::ScheduledLearningRate(p, base, step);
}

absl::StatusOr<Optimizer> Optimizer::Create(const OptimizerConfig& config) {
  ASSIGN_OR_RETURN(kernels::OptimizerParams p, ToOptimizerParams(config));
  return Optimizer(p, config);
}

std::string Optimizer::DescribeSlots() const {
  std::vector<std::string> names;
  switch (params_.kind) {
    case Kind::kSgd:
      break;
    case Kind::kMomentum:
      names = {"accum"};
      break;
    case Kind::kAdam:
      names = {"m", "v"};
      break;
    case Kind::kAdagrad:
      names = {"accumulator"};
      break;
    case Kind::kRmsProp:
      names = {"ms"};
      if (params_.momentum > 0.0f) names.push_back("momentum");
      if (params_.centered) names.push_back("mg");
      break;
  }
  if (names.empty()) return "no slots";
  return absl::StrJoin(names, ", ");
}

float Optimizer::LearningRate(int64_t step) const {
  return kernels::ScheduledLearningRate(params_, params_.learning_rate, step);
}

void Optimizer::Apply(int64_t step, float grad_scale, const float* grad, float* var, float* const* slots,
                      int64_t n) const {
  kernels::ApplyOptimizerLoop(params_, kernels::StepScalarsFor(params_, step), grad_scale, grad, var, slots, n);
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

void AxpyInto(float a, const float* src, float* dst, int64_t n) { kernels::AxpyIntoLoop(a, src, dst, n); }

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
