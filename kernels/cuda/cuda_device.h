// CUDA backend entry points (used only by kernels/create_device.cc). No other header outside kernels/cuda
// includes this one or any CUDA header.
#ifndef DTRAIN_KERNELS_CUDA_CUDA_DEVICE_H_
#define DTRAIN_KERNELS_CUDA_CUDA_DEVICE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {

// Number of usable devices: 0 on any CUDA error (no driver: cudaErrorInsufficientDriver) or no GPU.
int UsableDeviceCount();
// FailedPrecondition "no CUDA device available: ..." when spec.gpu_index is not a usable device.
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceSpec& spec);
// kernels::BeginCaptureGroup / EndCaptureGroup (device.h) for CUDA Devices (the caller has checked the list).
absl::Status BeginCaptureGroup(const std::vector<Device*>& devices);
absl::StatusOr<std::unique_ptr<Graph>> EndCaptureGroup(const std::vector<Device*>& devices);

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_CUDA_DEVICE_H_
