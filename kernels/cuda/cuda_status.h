// Turns CUDA, cuDNN and cuBLAS error codes into absl::Status values that name the failing op, so that a device
// error travels up the stack like any other error instead of aborting the process.
//
//   RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(...), "CopyToHost"));
//   RETURN_IF_ERROR(CudaStatus(LaunchRelu(x, y, n, stream), "Relu"));  // launchers return cudaGetLastError()
//
// Codes: out of memory -> ResourceExhausted; a missing/insufficient driver or no device -> FailedPrecondition;
// anything else -> Internal. Thread-safety: stateless functions, safe from any thread.
#ifndef DTRAIN_KERNELS_CUDA_CUDA_STATUS_H_
#define DTRAIN_KERNELS_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dtrain::kernels::cuda {

absl::Status CudaStatus(cudaError_t err, absl::string_view op);
absl::Status CudnnStatus(cudnnStatus_t err, absl::string_view op);
absl::Status CublasStatus(cublasStatus_t err, absl::string_view op);
// Checks the last kernel launch on this thread (cudaGetLastError, which also clears it).
inline absl::Status LaunchStatus(absl::string_view op) { return CudaStatus(cudaGetLastError(), op); }

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_CUDA_STATUS_H_
