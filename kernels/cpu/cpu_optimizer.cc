// The CPU backend's device optimizer: the loops of kernels/optimizer_math.h (the parameter server's own),
// applied chunk by chunk like ps::SliceStore::ApplyGradient (optimizer update, then the moving average, per
// chunk), the chunks spread over the device's threads. Elementwise, so the result is the same bits for any
// thread count.
#include <omp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/optimizer_math.h"

namespace dtrain::kernels::cpu {
namespace {

constexpr int64_t kChunk = int64_t{1} << 16;

class CpuOptimizer final : public DeviceOptimizer {
 public:
  CpuOptimizer(const OptimizerParams& p, const DeviceCounter* step, int threads)
      : p_(p), step_(step), threads_(threads) {}

  const OptimizerParams& params() const override { return p_; }

  absl::Status Apply(const OptimizerBuffers& b, float grad_scale) override {
    RETURN_IF_ERROR(ValidateOptimizerBuffers(p_, b, "Optimizer::Apply"));
    const int64_t step = *step_->device_ptr();
    const float lr = DecayedLearningRate(p_.learning_rate, p_.decay_rate, p_.decay_steps, p_.staircase, step);
    const float lr_t =
        p_.kind == OptimizerParams::Kind::kAdam ? AdamLearningRate(lr, p_.beta1, p_.beta2, step) : 0;
    float step_size = 0, bc2_sqrt = 0;
    if (p_.adam_paper_epsilon) PaperAdamScalars(lr, p_.beta1, p_.beta2, step, &step_size, &bc2_sqrt);
    const float ma_decay = b.shadow != nullptr ? MovingAverageDecay(p_.moving_average_decay, step + 1) : 0;
    auto apply = [&](int64_t begin, int64_t end) {
      const int64_t len = end - begin;
      switch (p_.kind) {
        case OptimizerParams::Kind::kSgd:
          ApplySgdLoop(lr, grad_scale, b.grad + begin, b.var + begin, len);
          break;
        case OptimizerParams::Kind::kMomentum:
          ApplyMomentumLoop(lr, p_.momentum, grad_scale, b.grad + begin, b.var + begin, b.slot0 + begin, len);
          break;
        case OptimizerParams::Kind::kAdam:
          if (p_.adam_paper_epsilon) {
            ApplyPaperAdamLoop(step_size, bc2_sqrt, p_.beta1, p_.beta2, p_.epsilon, grad_scale, b.grad + begin,
                               b.var + begin, b.slot0 + begin, b.slot1 + begin, len);
          } else {
            ApplyAdamLoop(lr_t, p_.beta1, p_.beta2, p_.epsilon, grad_scale, b.grad + begin, b.var + begin,
                          b.slot0 + begin, b.slot1 + begin, len);
          }
          break;
      }
      if (b.shadow != nullptr) UpdateMovingAverageLoop(ma_decay, b.var + begin, b.shadow + begin, len);
    };
    const int64_t chunks = (b.n + kChunk - 1) / kChunk;
    if (threads_ <= 1 || chunks < 2) {
      apply(0, b.n);
      return absl::OkStatus();
    }
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t c = 0; c < chunks; ++c) apply(c * kChunk, std::min(b.n, (c + 1) * kChunk));
    return absl::OkStatus();
  }

 private:
  OptimizerParams p_;
  const DeviceCounter* step_;
  int threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeCpuOptimizer(const OptimizerParams& p,
                                                                  const DeviceCounter* step, int threads) {
  RETURN_IF_ERROR(ValidateOptimizerParams(p));
  if (step == nullptr) return absl::InvalidArgumentError("MakeOptimizer: no step counter");
  return std::unique_ptr<DeviceOptimizer>(new CpuOptimizer(p, step, threads));
}

}  // namespace dtrain::kernels::cpu
