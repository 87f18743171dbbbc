// The CUDA backend's GradientAverager (kernels/gradient_averager.h): averaging across the CUDA towers of one
// worker process. Internal to kernels/: use kernels::CreateGradientAverager, which dispatches here for GPU
// towers.
//
// How: each distinct GPU has a group of towers; its first tower is the group's leader and the averager owns
// one non-blocking communication stream on that GPU. AverageRange records an event on every tower's compute
// stream and makes the group's communication stream wait for it; there the other towers' ranges are summed
// into the leader's with device Axpy (NCCL refuses two ranks on one GPU: "Duplicate GPU detected"), the
// leaders' sums are all-reduced with NCCL (ncclSum, one communicator per distinct GPU, made with
// ncclCommInitAll) when there is more than one GPU, scaled by 1/towers and, with kEveryTower, copied to the
// other towers of the group. Join records an event on each communication stream and makes every tower's
// compute stream wait for it. The host never waits, and everything is stream work (capturable, given that the
// capture spans the towers' streams; NCCL supports graph capture).
//
// Thread-safety: as for GradientAverager. The devices must be CUDA Devices and outlive the averager.
#ifndef DTRAIN_KERNELS_CUDA_NCCL_ALLREDUCE_H_
#define DTRAIN_KERNELS_CUDA_NCCL_ALLREDUCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "kernels/gradient_averager.h"

namespace dtrain::kernels::cuda {

// devices: distinct CUDA Devices (the caller, CreateGradientAverager, has checked the list is non-empty,
// distinct, all GPUs and n > 0); InvalidArgument for a non-CUDA device; NCCL initialization errors as
// Internal/Unavailable.
absl::StatusOr<std::unique_ptr<GradientAverager>> CreateNcclGradientAverager(std::vector<Device*> devices,
                                                                             int64_t n, AverageTarget target);

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_NCCL_ALLREDUCE_H_
