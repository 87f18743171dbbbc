// The CPU backend's GradientAverager (kernels/gradient_averager.h); internal to kernels/ (use
// CreateGradientAverager, which dispatches here for CPU towers).
#ifndef DTRAIN_KERNELS_CPU_CPU_GRADIENT_AVERAGER_H_
#define DTRAIN_KERNELS_CPU_CPU_GRADIENT_AVERAGER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gradient_averager.h"

namespace dtrain::kernels::cpu {

// devices: CPU Devices, checked by the caller (non-empty, distinct, n > 0). Uses the sum of their threads.
// Thread-safety and errors: as GradientAverager; the averages run synchronously on the calling thread.
absl::StatusOr<std::unique_ptr<GradientAverager>> CreateCpuGradientAverager(std::vector<Device*> devices,
                                                                            int64_t n, AverageTarget target);

}  // namespace dtrain::kernels::cpu

#endif  // DTRAIN_KERNELS_CPU_CPU_GRADIENT_AVERAGER_H_
