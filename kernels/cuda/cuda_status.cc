#include "kernels/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace dtrain::kernels::cuda {

absl::Status CudaStatus(cudaError_t err, absl::string_view op) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(op, ": CUDA error ", static_cast<int>(err), " (", cudaGetErrorName(err), "): ",
                                 cudaGetErrorString(err));
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status CudnnStatus(cudnnStatus_t err, absl::string_view op) {
  if (err == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(op, ": cuDNN error ", static_cast<int>(err), ": ", cudnnGetErrorString(err));
  if (err == CUDNN_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status CublasStatus(cublasStatus_t err, absl::string_view op) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  std::string msg = absl::StrCat(op, ": cuBLAS error ", static_cast<int>(err), " (", cublasGetStatusName(err),
                                 "): ", cublasGetStatusString(err));
  if (err == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace dtrain::kernels::cuda
