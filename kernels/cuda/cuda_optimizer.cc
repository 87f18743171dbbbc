// The CUDA backend's device optimizer: one fused kernel per Apply (optimizer.cu), reading the step (and the
// clipping norm) from device memory when it runs, so it can be captured in a graph and replayed every step.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace dtrain::kernels::cuda {
namespace {

// Floats of device memory for the norm: the sum (one double) and kNormPartials partial sums (doubles).
constexpr int64_t kNormFloats = 2 * (1 + kNormPartials);

class CudaOptimizer final : public DeviceOptimizer {
 public:
  CudaOptimizer(CudaDevice* dev, const OptimizerParams& p, const DeviceCounter* step, float* norm_memory)
      : dev_(dev), p_(p), step_(step), norm_memory_(norm_memory) {}
  ~CudaOptimizer() override {
    if (norm_memory_ != nullptr) dev_->Free(norm_memory_);
  }

  const OptimizerParams& params() const override { return p_; }

  absl::Status Apply(const OptimizerBuffers& b, float grad_scale) override {
    RETURN_IF_ERROR(ValidateOptimizerBuffers(p_, b, "Optimizer::Apply"));
    RETURN_IF_ERROR(dev_->Activate("Optimizer::Apply"));
    return CudaStatus(LaunchOptimizerApply(p_, step_->device_ptr(), norm_sq(), grad_scale, b.grad, b.var, b.slot0,
                                           b.slot1, b.slot2, b.shadow, b.n, dev_->stream()),
                      "Optimizer::Apply");
  }

  absl::Status ClearNorm() override {
    if (norm_memory_ == nullptr) return absl::OkStatus();  // clip_norm 0: nothing reads it
    RETURN_IF_ERROR(dev_->Activate("Optimizer::ClearNorm"));
    return CudaStatus(LaunchNormClear(norm_sq(), dev_->stream()), "Optimizer::ClearNorm");
  }

  absl::Status AddToNorm(const float* grad, int64_t n, float grad_scale) override {
    if (grad == nullptr || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Optimizer::AddToNorm: no gradient or negative count ", n));
    }
    if (norm_memory_ == nullptr) return absl::OkStatus();
    RETURN_IF_ERROR(dev_->Activate("Optimizer::AddToNorm"));
    return CudaStatus(LaunchNormAdd(grad, n, grad_scale, norm_sq() + 1, norm_sq(), dev_->stream()),
                      "Optimizer::AddToNorm");
  }

 private:
  // cudaMalloc'd memory is 256-byte aligned: doubles fit.
  double* norm_sq() const { return reinterpret_cast<double*>(norm_memory_); }

  CudaDevice* dev_;
  OptimizerParams p_;
  const DeviceCounter* step_;
  float* norm_memory_;  // kNormFloats floats when clip_norm > 0, else null
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeCudaOptimizer(CudaDevice* dev, const OptimizerParams& p,
                                                                   const DeviceCounter* step) {
  RETURN_IF_ERROR(ValidateOptimizerParams(p));
  float* norm_memory = nullptr;
  if (p.clip_norm > 0.0f) {
    ASSIGN_OR_RETURN(norm_memory, dev->Alloc(kNormFloats));
    // A clip before any AddToNorm sees a zero norm (no clipping), not garbage.
    if (absl::Status s = CudaStatus(LaunchNormClear(reinterpret_cast<double*>(norm_memory), dev->stream()),
                                    "MakeOptimizer");
        !s.ok()) {
      dev->Free(norm_memory);
      return s;
    }
  }
  return std::unique_ptr<DeviceOptimizer>(new CudaOptimizer(dev, p, step, norm_memory));
}

}  // namespace dtrain::kernels::cuda
