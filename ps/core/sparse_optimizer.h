// The update of sparse embedding rows (ps/core/sparse_store.h), with the semantics of TensorFlow 1.x's sparse
// optimizer kernels (the _apply_sparse paths). Only the rows a step touches move, and only their slots: for adam
// this is TensorFlow's LazyAdamOptimizer (the moments of untouched rows do not decay).
//
//   g = grad_scale * grad   (grad_scale folds the 1/R of a sync step into the same pass)
//   sgd       var -= lr * g
//   adagrad   accum += g^2;  var -= lr * g / sqrt(accum)                 (tf.train.AdagradOptimizer; accum starts
//                                                                         at initial_accumulator)
//   adam      lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t), t = step + 1 (the task's step, as for dense adam)
//             m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//             var -= lr_t * m / (sqrt(v) + epsilon)                       (LazyAdamOptimizer; m, v start at 0)
//   ftrl      n' = n + g^2
//             z += g - (n'^(-lr_power) - n^(-lr_power)) / lr * var
//             var = |z| > l1 ? (sign(z) * l1 - z) / (n'^(-lr_power) / lr + 2 * l2) : 0;  n = n'
//                                                                         (tf.train.FtrlOptimizer / ApplyFtrl;
//                                                                         z starts at 0, n at initial_accumulator)
//
// The learning rate follows the dense one's schedule (the dense OptimizerConfig's lr_schedule, decay and warmup:
// ScheduledLearningRate of ps/core/optimizer.h) at the step being applied.
//
// A row is laid out as [values: dim][slot 0: dim][slot 1: dim] (num_slots() slots): adagrad's slot 0 is accum,
// adam's slots are m, v, ftrl's are z (linear), n (accumulator).
//
// Usage:
//   ASSIGN_OR_RETURN(SparseOptimizer opt, SparseOptimizer::Create(config.sparse_optimizer, config.optimizer));
//   opt.InitSlots(row + dim, dim);                        // a new row (its values from SparseInitialRow)
//   const SparseOptimizer::Step s = opt.Prepare(step);
//   opt.ApplyRow(s, 1.0f / num_workers, grad, row, dim);
//
// Thread-safety: immutable after Create; ApplyRow may run concurrently on different rows.
#ifndef DTRAIN_PS_CORE_SPARSE_OPTIMIZER_H_
#define DTRAIN_PS_CORE_SPARSE_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

class SparseOptimizer {
 public:
  enum class Kind { kSgd, kAdagrad, kAdam, kFtrl };

  // InvalidArgument naming the field for an unknown name or an out-of-range hyperparameter. `decay` supplies
  // decay_steps, decay_rate and staircase (its name and learning rate are not used).
  static absl::StatusOr<SparseOptimizer> Create(const SparseOptimizerConfig& config, const OptimizerConfig& decay);

  Kind kind() const { return kind_; }
  const SparseOptimizerConfig& config() const { return config_; }
  int num_slots() const;  // 0, 1 (adagrad), 2 (adam, ftrl)

  // Fills the slots of a new row (num_slots() * dim floats at `slots`): 0, or initial_accumulator for
  // adagrad's accum and ftrl's n.
  void InitSlots(float* slots, int dim) const;

  // The per-step scalars, computed once per applied step.
  struct Step {
    float lr = 0.0f;    // decayed learning rate
    float lr_t = 0.0f;  // adam: the bias-corrected rate
  };
  Step Prepare(int64_t step) const;

  // Updates one row (layout above) with gradient grad_scale * grad[0, dim).
  void ApplyRow(const Step& step, float grad_scale, const float* grad, float* row, int dim) const;

 private:
  SparseOptimizer(Kind kind, const SparseOptimizerConfig& config, const OptimizerConfig& decay)
      : kind_(kind), config_(config), decay_(decay) {}

  Kind kind_;
  SparseOptimizerConfig config_;
  OptimizerConfig decay_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_SPARSE_OPTIMIZER_H_
