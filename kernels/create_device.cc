#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#ifdef DTRAIN_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#endif

namespace dtrain::kernels {

int CudaDeviceCount() {
#ifdef DTRAIN_HAVE_CUDA
  return cuda::UsableDeviceCount();
#else
  return 0;
#endif
}

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceSpec& spec) {
  if (spec.kind == DeviceSpec::Kind::kCpu) {
    if (spec.threads < 1) return absl::InvalidArgumentError(absl::StrCat("cpu device needs threads >= 1, got ", spec.threads));
    return CreateCpuDevice(spec);
  }
#ifdef DTRAIN_HAVE_CUDA
  return cuda::CreateCudaDevice(spec);
#else
  return absl::FailedPreconditionError(absl::StrCat("no CUDA device available: ", spec.ToString(),
                                                    " was asked for but this build has no CUDA backend "
                                                    "(configure with -DDTRAIN_CUDA=ON where nvcc exists)"));
#endif
}

}  // namespace dtrain::kernels
