// Elementwise optimizers over the float slices a ps task holds, with TensorFlow 1.x semantics:
//
//   sgd       var -= lr * g
//   momentum  accum = momentum * accum + g;  var -= lr * accum            (tf.train.MomentumOptimizer)
//   adam      t = step + 1;  lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//             m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//             var -= lr_t * m / (sqrt(v) + epsilon)                       (tf.train.AdamOptimizer)
//   pytorch_adam  torch.optim.Adam (the paper's form): var -= lr / (1 - beta1^t) m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// The learning rate follows tf.train.exponential_decay: lr * decay_rate ^ (step / decay_steps), the exponent
// floor()ed when staircase, off when decay_steps == 0. `step` is the step being applied (0 for the first).
//
// Moving averages follow tf.train.ExponentialMovingAverage with num_updates:
//   decay = min(d, (1 + num_updates) / (10 + num_updates));  shadow -= (1 - decay) * (shadow - var)
//
// Usage:
//   ASSIGN_OR_RETURN(Optimizer opt, Optimizer::Create(config));
//   std::vector<float> m(n), v(n);  // opt.num_slots() slots, zero-initialized
//   opt.Apply(step, /*grad_scale=*/1.0f / count, grad_sum, var, m.data(), v.data(), n);
//
// Thread-safety: an Optimizer is immutable after Create; Apply may run concurrently on disjoint arrays.
#ifndef DTRAIN_PS_CORE_OPTIMIZER_H_
#define DTRAIN_PS_CORE_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

class Optimizer {
 public:
  enum class Kind { kSgd, kMomentum, kAdam };

  // InvalidArgument for an unknown name or an out-of-range hyperparameter (the message names it).
  static absl::StatusOr<Optimizer> Create(const OptimizerConfig& config);

  Kind kind() const { return kind_; }
  const OptimizerConfig& config() const { return config_; }
  // Slots per variable element: 0 (sgd), 1 (momentum: accum), 2 (adam: m, v).
  int num_slots() const;

  // The decayed learning rate for applying `step`.
  float LearningRate(int64_t step) const;

  // One update of n elements with gradient grad_scale * grad[i] (grad_scale folds the 1/count of an average
  // into the same pass). slot0/slot1 are the slots (nullptr where num_slots() says unused). No aliasing
  // between the arrays.
  void Apply(int64_t step, float grad_scale, const float* grad, float* var, float* slot0, float* slot1,
             int64_t n) const;

 private:
  Optimizer(Kind kind, const OptimizerConfig& config)
      : kind_(kind), paper_adam_(config.name == "pytorch_adam"), config_(config) {}

  Kind kind_;
  bool paper_adam_;  // kAdam as torch.optim.Adam ("pytorch_adam"), resolved from the name once
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

// min(decay, (1 + num_updates) / (10 + num_updates)).
float MovingAverageDecay(float decay, int64_t num_updates);
// shadow -= (1 - decay) * (shadow - var).
void UpdateMovingAverage(float decay, const float* var, float* shadow, int64_t n);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_OPTIMIZER_H_
