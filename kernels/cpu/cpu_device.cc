// Placeholder until the oneDNN backend lands.
#include "kernels/device.h"
namespace dtrain::kernels {
absl::StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const DeviceSpec&) {
  return absl::UnimplementedError("cpu backend not built yet");
}
}  // namespace dtrain::kernels
