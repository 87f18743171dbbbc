// Placeholder until the CUDA backend lands.
#include "kernels/cuda/cuda_device.h"
#include <cuda_runtime_api.h>
namespace dtrain::kernels::cuda {
int UsableDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}
absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceSpec& spec) {
  return absl::FailedPreconditionError("no CUDA device available: backend not implemented yet");
}
}  // namespace dtrain::kernels::cuda
