// The CUDA backend's device optimizer: one fused kernel per Apply (optimizer.cu), reading the step from the
// device counter when it runs, so it can be captured in a graph and replayed every step.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace dtrain::kernels::cuda {
namespace {

class CudaOptimizer final : public DeviceOptimizer {
 public:
  CudaOptimizer(CudaDevice* dev, const OptimizerParams& p, const DeviceCounter* step)
      : dev_(dev), p_(p), step_(step) {
    k_.kind = static_cast<int>(p.kind);
    k_.learning_rate = p.learning_rate;
    k_.decay_rate = p.decay_rate;
    k_.decay_steps = p.decay_steps;
    k_.staircase = p.staircase ? 1 : 0;
    k_.momentum = p.momentum;
    k_.beta1 = p.beta1;
    k_.one_minus_b1 = 1.0f - p.beta1;  // rounded once, as ApplyAdamLoop does
    k_.beta2 = p.beta2;
    k_.one_minus_b2 = 1.0f - p.beta2;
    k_.epsilon = p.epsilon;
    k_.adam_paper_epsilon = p.adam_paper_epsilon ? 1 : 0;
    k_.moving_average_decay = p.moving_average_decay;
  }

  const OptimizerParams& params() const override { return p_; }

  absl::Status Apply(const OptimizerBuffers& b, float grad_scale) override {
    RETURN_IF_ERROR(ValidateOptimizerBuffers(p_, b, "Optimizer::Apply"));
    RETURN_IF_ERROR(dev_->Activate("Optimizer::Apply"));
    return CudaStatus(LaunchOptimizerApply(k_, step_->device_ptr(), grad_scale, b.grad, b.var, b.slot0,
                                           b.slot1, b.shadow, b.n, dev_->stream()),
                      "Optimizer::Apply");
  }

 private:
  CudaDevice* dev_;
  OptimizerParams p_;
  const DeviceCounter* step_;
  OptimizerKernelParams k_{};
};

static_assert(static_cast<int>(OptimizerParams::Kind::kSgd) == 0 &&
                  static_cast<int>(OptimizerParams::Kind::kMomentum) == 1 &&
                  static_cast<int>(OptimizerParams::Kind::kAdam) == 2,
              "optimizer.cu numbers the kinds in this order");

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeCudaOptimizer(CudaDevice* dev, const OptimizerParams& p,
                                                                   const DeviceCounter* step) {
  RETURN_IF_ERROR(ValidateOptimizerParams(p));
  return std::unique_ptr<DeviceOptimizer>(new CudaOptimizer(dev, p, step));
}

}  // namespace dtrain::kernels::cuda
