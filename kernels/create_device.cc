// The factories that dispatch to a backend: CreateDevice (device.h) and CreateGradientAverager
// (gradient_averager.h). The only place outside kernels/cuda that knows whether the CUDA backend was built.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_gradient_averager.h"
#include "kernels/device.h"
#include "kernels/gradient_averager.h"
#ifdef DTRAIN_HAVE_CUDA
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/nccl_allreduce.h"
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

namespace {

// InvalidArgument unless `devices` is a non-empty list of distinct Devices of one backend; sets *gpu.
absl::Status CheckCaptureGroup(const std::vector<Device*>& devices, const char* op, bool* gpu) {
  if (devices.empty()) return absl::InvalidArgumentError(absl::StrCat(op, ": no devices"));
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(op, ": device ", i, " is null"));
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat(op, ": device ", devices[i]->name(), " is listed twice"));
      }
    }
    if (devices[i]->spec().kind != devices[0]->spec().kind) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": a mix of CPU and GPU devices"));
    }
  }
  *gpu = devices[0]->spec().kind == DeviceSpec::Kind::kGpu;
  return absl::OkStatus();
}

}  // namespace

absl::Status BeginCaptureGroup(const std::vector<Device*>& devices) {
  bool gpu = false;
  RETURN_IF_ERROR(CheckCaptureGroup(devices, "BeginCaptureGroup", &gpu));
  if (devices.size() == 1 || !gpu)
    return devices[0]->BeginCapture();  // the CPU: Unimplemented, with the reason
#ifdef DTRAIN_HAVE_CUDA
  return cuda::BeginCaptureGroup(devices);
#else
  return absl::FailedPreconditionError("BeginCaptureGroup: this build has no CUDA backend");
#endif
}

absl::StatusOr<std::unique_ptr<Graph>> EndCaptureGroup(const std::vector<Device*>& devices) {
  bool gpu = false;
  RETURN_IF_ERROR(CheckCaptureGroup(devices, "EndCaptureGroup", &gpu));
  if (devices.size() == 1 || !gpu) return devices[0]->EndCapture();
#ifdef DTRAIN_HAVE_CUDA
  return cuda::EndCaptureGroup(devices);
#else
  return absl::FailedPreconditionError("EndCaptureGroup: this build has no CUDA backend");
#endif
}

absl::StatusOr<std::unique_ptr<GradientAverager>> CreateGradientAverager(std::vector<Device*> devices,
                                                                         int64_t n, AverageTarget target) {
  if (devices.empty()) return absl::InvalidArgumentError("CreateGradientAverager: no devices");
  if (n <= 0)
    return absl::InvalidArgumentError(absl::StrCat("CreateGradientAverager: n must be positive, got ", n));
  int gpus = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("CreateGradientAverager: device ", i, " is null"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("CreateGradientAverager: device ", devices[i]->name(), " is listed twice"));
      }
    }
    if (devices[i]->spec().kind == DeviceSpec::Kind::kGpu) ++gpus;
  }
  if (gpus == 0) return cpu::CreateCpuGradientAverager(std::move(devices), n, target);
  if (gpus != static_cast<int>(devices.size())) {
    return absl::InvalidArgumentError(
        "CreateGradientAverager: a mix of CPU and GPU towers cannot be averaged");
  }
#ifdef DTRAIN_HAVE_CUDA
  return cuda::CreateNcclGradientAverager(std::move(devices), n, target);
#else
  return absl::FailedPreconditionError("no CUDA device available: this build has no CUDA backend");
#endif
}

}  // namespace dtrain::kernels
