// Device-resident optimizer: the update of variables, optimizer slots and moving averages that live in a
// Device's memory, with the arithmetic of kernels/optimizer_math.h (the same as the parameter server's
// ps::Optimizer), made by Device::MakeOptimizer. The step being applied is read from a DeviceCounter in
// device memory *when the update runs*, not when it is enqueued, so a captured CUDA graph that ends with
// `step->Increment()` can be replayed every step without the host:
//
//   ASSIGN_OR_RETURN(auto step, dev->MakeCounter(/*initial=*/0));
//   ASSIGN_OR_RETURN(auto opt, dev->MakeOptimizer(params, step.get()));
//   // per step (eagerly or inside BeginCapture/EndCapture):
//   RETURN_IF_ERROR(opt->Apply({.grad = g, .var = w, .slot0 = m, .slot1 = v, .shadow = ema, .n = n}, 1.0f));
//   RETURN_IF_ERROR(step->Increment());
//
// With the counter holding s, Apply performs ps::Optimizer::Apply(s, ...) and, when `shadow` is given, the
// moving average update with num_updates = s + 1 (the parameter server's convention), fused in one pass on
// the GPU.
//
// Thread-safety: like every op, a DeviceOptimizer belongs to its Device's owning thread. Errors:
// InvalidArgument for bad buffers (null where the kind needs a slot, negative n, a shadow without
// moving_average_decay); device errors as the Device reports them (naming "Optimizer::Apply").
#ifndef DTRAIN_KERNELS_OPTIMIZER_OPS_H_
#define DTRAIN_KERNELS_OPTIMIZER_OPS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain::kernels {

// Hyperparameters, with the meaning (and defaults) of ps::OptimizerConfig and ps::TrainConfig.
struct OptimizerParams {
  enum class Kind { kSgd, kMomentum, kAdam };
  Kind kind = Kind::kSgd;
  float learning_rate = 0.01f;
  // Exponential decay: learning_rate * decay_rate ^ (step / decay_steps), floor()ed when staircase; 0 = off.
  int64_t decay_steps = 0;
  float decay_rate = 1.0f;
  bool staircase = false;
  float momentum = 0.9f;                                // kMomentum
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;  // kAdam (TensorFlow's defaults)
  // kAdam: epsilon in the paper's place (torch.optim.Adam's; optimizer name "pytorch_adam") instead of
  // TensorFlow's (kernels/optimizer_math.h).
  bool adam_paper_epsilon = false;
  float moving_average_decay = 0.0f;  // > 0: Apply may update moving averages (shadow); 0 = none

  // Slots per variable element: 0 (sgd), 1 (momentum: accum), 2 (adam: m, v).
  int num_slots() const { return kind == Kind::kSgd ? 0 : kind == Kind::kMomentum ? 1 : 2; }
};

// "sgd", "momentum", "adam", "pytorch_adam" -> p->kind (both Adams are kAdam) and p->adam_paper_epsilon (set for
// "pytorch_adam" only): the name resolved once; InvalidArgument otherwise (p unchanged).
absl::Status SetOptimizerFromName(const std::string& name, OptimizerParams* p);
// InvalidArgument naming the first out-of-range hyperparameter (the same ranges ps::Optimizer::Create
// accepts, plus moving_average_decay in [0, 1)).
absl::Status ValidateOptimizerParams(const OptimizerParams& p);

// The arrays one Apply updates, all n floats of the optimizer's device. Slots and shadows are
// zero-initialized / initialized to the variable by the caller before the first step, as the parameter server
// does.
struct OptimizerBuffers {
  const float* grad = nullptr;  // the gradient (multiplied by grad_scale)
  float* var = nullptr;
  float* slot0 = nullptr;   // kMomentum: accum; kAdam: m; else unused
  float* slot1 = nullptr;   // kAdam: v; else unused
  float* shadow = nullptr;  // moving average of var, or null (requires moving_average_decay > 0)
  int64_t n = 0;
};

// InvalidArgument (naming `op`) unless b has what p's kind needs: non-null grad and var, slot0 for momentum
// and adam, slot1 for adam, n >= 0, and a shadow only with p.moving_average_decay > 0. Used by every backend.
absl::Status ValidateOptimizerBuffers(const OptimizerParams& p, const OptimizerBuffers& b, const char* op);

class DeviceOptimizer {
 public:
  virtual ~DeviceOptimizer() = default;
  virtual const OptimizerParams& params() const = 0;
  // Enqueues one update of b (see the header comment) at the step the counter holds when it runs. No aliasing
  // between the arrays. grad_scale folds a 1/count average into the same pass.
  virtual absl::Status Apply(const OptimizerBuffers& b, float grad_scale) = 0;
};

}  // namespace dtrain::kernels

#endif  // DTRAIN_KERNELS_OPTIMIZER_OPS_H_
