// The CPU backend's device optimizer: the loops of kernels/optimizer_math.h (the parameter server's own),
// applied chunk by chunk like ps::SliceStore::Apply (optimizer update, then the moving average, per chunk), the
// chunks spread over the device's threads. Elementwise, so the result is the same bits for any thread count.
// The clipping norm is summed per chunk (SumOfSquaresLoop) and the chunks' sums added in chunk order: the same
// bits for any thread count too.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

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

  absl::Status ClearNorm() override {
    norm_sq_ = 0.0;
    return absl::OkStatus();
  }

  absl::Status AddToNorm(const float* grad, int64_t n, float grad_scale) override {
    if (grad == nullptr || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Optimizer::AddToNorm: no gradient or negative count ", n));
    }
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    std::vector<double> partial(chunks, 0.0);
    auto sum = [&](int64_t c) {
      const int64_t begin = c * kChunk;
      partial[c] = SumOfSquaresLoop(grad + begin, std::min(n, begin + kChunk) - begin);
    };
    if (threads_ <= 1 || chunks < 2) {
      for (int64_t c = 0; c < chunks; ++c) sum(c);
    } else {
#pragma omp parallel for num_threads(threads_) schedule(static)
      for (int64_t c = 0; c < chunks; ++c) sum(c);
    }
    double total = 0.0;
    for (double s : partial) total += s;
    const double scale = static_cast<double>(grad_scale);
    norm_sq_ += total * scale * scale;
    return absl::OkStatus();
  }

  absl::Status Apply(const OptimizerBuffers& b, float grad_scale) override {
    RETURN_IF_ERROR(ValidateOptimizerBuffers(p_, b, "Optimizer::Apply"));
    const int64_t step = *step_->device_ptr();
    const OptimizerStepScalars s = StepScalarsFor(p_, step);
    if (p_.clip_norm > 0.0f) grad_scale *= ClipFactor(p_.clip_norm, std::sqrt(norm_sq_));
    const float ma_decay = b.shadow != nullptr ? MovingAverageDecay(p_.moving_average_decay, step + 1) : 0;
    auto apply = [&](int64_t begin, int64_t end) {
      const int64_t len = end - begin;
      float* slots[3] = {b.slot0 ? b.slot0 + begin : nullptr, b.slot1 ? b.slot1 + begin : nullptr,
                         b.slot2 ? b.slot2 + begin : nullptr};
      ApplyOptimizerLoop(p_, s, grad_scale, b.grad + begin, b.var + begin, slots, len);
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
  double norm_sq_ = 0.0;  // the step's sum of squares (ClearNorm, AddToNorm)
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeCpuOptimizer(const OptimizerParams& p,
                                                                  const DeviceCounter* step, int threads) {
  RETURN_IF_ERROR(ValidateOptimizerParams(p));
  if (step == nullptr) return absl::InvalidArgumentError("MakeOptimizer: no step counter");
  return std::unique_ptr<DeviceOptimizer>(new CpuOptimizer(p, step, threads));
}

}  // namespace dtrain::kernels::cpu
