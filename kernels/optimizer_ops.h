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
// the GPU. Gradient clipping (params.clip_norm > 0) gathers the step's global norm on the device first
// (ClearNorm, AddToNorm per gradient array), so the whole step stays capturable.
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
#include "kernels/optimizer_math.h"

namespace dtrain::kernels {

// The optimizer names (ps::OptimizerConfig::name) and what they set: "sgd", "momentum", "adam" (TensorFlow's),
// "pytorch_adam" (adam_paper_epsilon), "adamw" (+ decoupled_weight_decay), "adagrad" and "pytorch_adagrad" (the
// same update; only their defaults differ), "rmsprop" (TensorFlow's) and "pytorch_rmsprop" (torch_rmsprop). The
// name is resolved once into p->kind and those flags; InvalidArgument listing the names otherwise (p unchanged).
absl::Status SetOptimizerFromName(const std::string& name, OptimizerParams* p);
// The names SetOptimizerFromName takes, for messages and help: "sgd | momentum | ...".
const char* OptimizerNames();
// InvalidArgument naming the first out-of-range hyperparameter (the ranges ps::Optimizer::Create accepts, plus
// moving_average_decay in [0, 1)): learning_rate, weight_decay, clip_norm, min_learning_rate and
// initial_accumulator finite and >= 0; decay_steps, warmup_steps >= 0; decay_rate > 0 when decaying
// exponentially; cosine needs decay_steps > 0; warmup_start_factor in [0, 1]; momentum finite >= 0 (nesterov:
// > 0, and only for momentum); adam's betas in (0, 1) and epsilon > 0; adagrad's epsilon >= 0, and > 0 unless
// initial_accumulator > 0; rmsprop's rho in [0, 1) and epsilon > 0; decoupled weight decay only with adam.
absl::Status ValidateOptimizerParams(const OptimizerParams& p);

// The arrays one Apply updates, all n floats of the optimizer's device. Slots start at
// OptimizerParams::SlotInitialValue and shadows at the variable (set by the caller before the first step, as the
// parameter server does).
struct OptimizerBuffers {
  const float* grad = nullptr;  // the gradient (multiplied by grad_scale)
  float* var = nullptr;
  float* slot0 = nullptr;   // slot 0 (OptimizerParams::num_slots() says which exist; optimizer_math.h their order)
  float* slot1 = nullptr;   // slot 1
  float* shadow = nullptr;  // moving average of var, or null (requires moving_average_decay > 0)
  int64_t n = 0;
  float* slot2 = nullptr;   // slot 2 (rmsprop with momentum and centered; last, so that {...} lists stay valid)
};

// InvalidArgument (naming `op`) unless b has what p's kind needs: non-null grad and var, a non-null slot k for
// every k < p.num_slots(), n >= 0, and a shadow only with p.moving_average_decay > 0. Used by every backend.
absl::Status ValidateOptimizerBuffers(const OptimizerParams& p, const OptimizerBuffers& b, const char* op);

class DeviceOptimizer {
 public:
  virtual ~DeviceOptimizer() = default;
  virtual const OptimizerParams& params() const = 0;
  // Enqueues one update of b (see the header comment) at the step the counter holds when it runs. No aliasing
  // between the arrays. grad_scale folds a 1/count average into the same pass; with params().clip_norm > 0 the
  // gradient is also scaled by ClipFactor(clip_norm, sqrt(the sum ClearNorm/AddToNorm gathered)).
  virtual absl::Status Apply(const OptimizerBuffers& b, float grad_scale) = 0;

  // Gradient clipping by global norm (params().clip_norm > 0): before a step's Apply calls, the sum of the
  // squares of every trainable gradient of the step is gathered in device memory:
  //   RETURN_IF_ERROR(opt->ClearNorm());
  //   for each trainable gradient array: RETURN_IF_ERROR(opt->AddToNorm(grad, n, grad_scale));
  //   for each: RETURN_IF_ERROR(opt->Apply(buffers, grad_scale));   // scaled by the step's clip factor
  // Enqueued like Apply (capturable, nothing read back); the sum is the same bits whatever the thread count or
  // launch shape (fixed-order reductions in double). AddToNorm adds sum((grad_scale * grad[i])^2);
  // InvalidArgument for a null grad or negative n.
  virtual absl::Status ClearNorm() = 0;
  virtual absl::Status AddToNorm(const float* grad, int64_t n, float grad_scale) = 0;
};

}  // namespace dtrain::kernels

#endif  // DTRAIN_KERNELS_OPTIMIZER_OPS_H_
