// The dense optimizers over the float slices a ps task holds: every name of OptimizerConfig (ps/api/ps_types.h)
// with its learning-rate schedule, weight decay and slots. The arithmetic, with each framework's formula and
// order of operations, is kernels/optimizer_math.h's (shared with the device optimizers of local GPU training);
// this class resolves a config into it once and applies it to host arrays.
//
// `step` is the step being applied (0 for the first): it drives the schedule and Adam's t = step + 1. Gradient
// clipping is not done here: the caller folds each gradient's clip factor into grad_scale (ClipFactor of
// kernels/optimizer_math.h; SliceStore::Apply takes per-gradient weights).
//
// Moving averages follow tf.train.ExponentialMovingAverage with num_updates:
//   decay = min(d, (1 + num_updates) / (10 + num_updates));  shadow -= (1 - decay) * (shadow - var)
//
// Usage:
//   ASSIGN_OR_RETURN(Optimizer opt, Optimizer::Create(config));
//   std::vector<std::vector<float>> slots(opt.num_slots());
//   for (int k = 0; k < opt.num_slots(); ++k) slots[k].assign(n, opt.SlotInitialValue(k));
//   float* s[3] = {...slots[k].data()...};
//   opt.Apply(step, /*grad_scale=*/1.0f / count, grad_sum, var, s, n);
//
// Thread-safety: an Optimizer is immutable after Create; Apply may run concurrently on disjoint arrays.
#ifndef DTRAIN_PS_CORE_OPTIMIZER_H_
#define DTRAIN_PS_CORE_OPTIMIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer_math.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

// The most slots an optimizer keeps per variable element (rmsprop with momentum, centered).
inline constexpr int kMaxOptimizerSlots = 3;

// `name`'s framework defaults (learning_rate and the schedule left at OptimizerConfig's): momentum 0.9 for
// "momentum" (dtrain's long-standing default; PyTorch has none); betas 0.9/0.999 and epsilon 1e-8 for the adams,
// weight_decay 0.01 for "adamw" (torch.optim.AdamW's); initial_accumulator 0.1 and epsilon 0 for "adagrad"
// (tf.train.AdagradOptimizer), 0 and 1e-10 for "pytorch_adagrad"; rho 0.9, epsilon 1e-10, momentum 0 for
// "rmsprop" (tf.train.RMSPropOptimizer), rho (alpha) 0.99, epsilon 1e-8, momentum 0 for "pytorch_rmsprop".
// InvalidArgument for an unknown name.
absl::StatusOr<OptimizerConfig> DefaultOptimizerConfig(const std::string& name);

// The learning rate an adaptive optimizer's framework gives it when none is set, and whose default it is:
// 0.001 for adam (tf.train.AdamOptimizer, Keras' Adam), pytorch_adam (torch.optim.Adam), adamw
// (torch.optim.AdamW), rmsprop and adagrad (Keras' RMSprop and Adagrad: TensorFlow 1's optimizers have no default
// rate); 0.01 for pytorch_rmsprop (torch.optim.RMSprop) and pytorch_adagrad (torch.optim.Adagrad). sgd and
// momentum have none that fits every model (rate 0, empty source): a model's own rate applies.
struct FrameworkLearningRate {
  float rate = 0;
  std::string source;  // "torch.optim.RMSprop"
};
FrameworkLearningRate FrameworkDefaultLearningRate(const std::string& name);

// The device optimizers' hyperparameters for `config` (kernels/optimizer_ops.h), validated: InvalidArgument for
// an unknown name, an unknown lr_schedule or an out-of-range value (the message names it).
absl::StatusOr<kernels::OptimizerParams> ToOptimizerParams(const OptimizerConfig& config,
                                                           float moving_average_decay = 0.0f);

// The learning rate for applying `step` under config's schedule, starting from `base` (the sparse tables' rate
// follows the dense schedule: ps/core/sparse_optimizer.h). Precondition: config is valid (ToOptimizerParams).
float ScheduledLearningRate(const OptimizerConfig& config, float base, int64_t step);

class Optimizer {
 public:
  using Kind = kernels::OptimizerKind;

  // InvalidArgument for an unknown name or an out-of-range hyperparameter (the message names it).
  static absl::StatusOr<Optimizer> Create(const OptimizerConfig& config);

  Kind kind() const { return params_.kind; }
  const OptimizerConfig& config() const { return config_; }
  const kernels::OptimizerParams& params() const { return params_; }
  // Slots per variable element (OptimizerConfig::num_slots()), and what slot k holds before the first update.
  int num_slots() const { return params_.num_slots(); }
  float SlotInitialValue(int k) const { return params_.SlotInitialValue(k); }
  // "rms, momentum, mg"-style names of the slots, for messages.
  std::string DescribeSlots() const;

  // The scheduled learning rate for applying `step`.
  float LearningRate(int64_t step) const;

  // One update of n elements with gradient grad_scale * grad[i] (grad_scale folds the 1/count of an average and
  // a clip factor into the same pass). slots[k] for k < num_slots(), each n floats. No aliasing between the
  // arrays.
  void Apply(int64_t step, float grad_scale, const float* grad, float* var, float* const* slots, int64_t n) const;

 private:
  Optimizer(const kernels::OptimizerParams& params, const OptimizerConfig& config)
      : params_(params), config_(config) {}

  kernels::OptimizerParams params_;
  OptimizerConfig config_;
};

// The elementwise kernels behind Optimizer::Apply, exposed for tests and benchmarks. They forward to the
// shared arithmetic of kernels/optimizer_math.h (also used by the CPU and CUDA device optimizers).
void ApplySgd(float lr, float grad_scale, const float* grad, float* var, int64_t n);
void ApplyMomentum(float lr, float momentum, float grad_scale, const float* grad, float* var, float* accum,
                   int64_t n);
// lr_t is the bias-corrected rate (AdamLearningRate).
void ApplyAdam(float lr_t, float beta1, float beta2, float epsilon, float grad_scale, const float* grad,
               float* var, float* m, float* v, int64_t n);
// lr * sqrt(1 - beta2^(step+1)) / (1 - beta1^(step+1)).
float AdamLearningRate(float lr, float beta1, float beta2, int64_t step);

// dst += src (summing workers' gradients before an average).
void AddInto(const float* src, float* dst, int64_t n);
// dst += a * src (summing workers' clipped gradients).
void AxpyInto(float a, const float* src, float* dst, int64_t n);

// min(decay, (1 + num_updates) / (10 + num_updates)).
float MovingAverageDecay(float decay, int64_t num_updates);
// shadow -= (1 - decay) * (shadow - var).
void UpdateMovingAverage(float decay, const float* var, float* shadow, int64_t n);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_OPTIMIZER_H_
