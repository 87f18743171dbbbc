// BatchNorm for the CUDA backend: own kernels (batch_norm.cu), deterministic fixed-order reductions whose chunking
// is chosen here, once per shape, with the scratch it needs.
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace dtrain::kernels::cuda {
namespace {

class CudaBatchNorm final : public BatchNorm {
 public:
  CudaBatchNorm(CudaDevice* dev, const BatchNormParams& p, const ColumnShape& s, DeviceBuffer partial)
      : dev_(dev), p_(p), s_(s), partial_(std::move(partial)) {}

  absl::Status ForwardTraining(const float* x, const float* scale, const float* bias, float* y, float* batch_mean,
                               float* batch_var) override {
    RETURN_IF_ERROR(dev_->Activate("BatchNorm::ForwardTraining"));
    RETURN_IF_ERROR(CudaStatus(LaunchBatchNormStats(x, s_, Partial(), batch_mean, batch_var, dev_->stream()),
                               "BatchNorm::ForwardTraining: statistics"));
    return CudaStatus(LaunchBatchNormApply(x, scale, bias, batch_mean, batch_var, p_.epsilon, s_.rows, s_.channels,
                                           y, dev_->stream()),
                      "BatchNorm::ForwardTraining: normalize");
  }

  absl::Status ForwardInference(const float* x, const float* scale, const float* bias, const float* mean,
                                const float* var, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("BatchNorm::ForwardInference"));
    return CudaStatus(LaunchBatchNormApply(x, scale, bias, mean, var, p_.epsilon, s_.rows, s_.channels, y,
                                           dev_->stream()),
                      "BatchNorm::ForwardInference");
  }

  absl::Status Backward(const float* x, const float* dy, const float* scale, const float* batch_mean,
                        const float* batch_var, float* dx, float* dscale, float* dbias) override {
    RETURN_IF_ERROR(dev_->Activate("BatchNorm::Backward"));
    return CudaStatus(LaunchBatchNormBackward(x, dy, scale, batch_mean, batch_var, p_.epsilon, s_, Partial(), dx,
                                              dscale, dbias, dev_->stream()),
                      "BatchNorm::Backward");
  }

 private:
  double* Partial() const { return static_cast<double*>(partial_.get()); }

  CudaDevice* dev_;
  BatchNormParams p_;
  ColumnShape s_;
  DeviceBuffer partial_;  // 2 * chunks * channels doubles: the reductions' per-chunk sums
};

}  // namespace

absl::StatusOr<std::unique_ptr<BatchNorm>> MakeCudaBatchNorm(CudaDevice* dev, const BatchNormParams& p) {
  if (p.batch <= 0 || p.spatial <= 0 || p.channels <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeBatchNorm: sizes must be positive, got batch=", p.batch,
                                                   " spatial=", p.spatial, " channels=", p.channels));
  }
  if (!(p.epsilon >= 0.0f) || !std::isfinite(p.epsilon)) {
    return absl::InvalidArgumentError(absl::StrCat("MakeBatchNorm: epsilon must be finite and >= 0, got ", p.epsilon));
  }
  const int64_t rows = int64_t{p.batch} * p.spatial;
  if (rows > INT64_MAX / p.channels) {
    return absl::InvalidArgumentError("MakeBatchNorm: the tensor's size overflows int64");
  }
  const ChunkSplit split = SplitReduction(p.channels, rows);
  const ColumnShape s{rows, p.channels, split.chunks, split.chunk_len};
  ASSIGN_OR_RETURN(DeviceBuffer partial, DeviceBuffer::Allocate(static_cast<size_t>(2 * s.chunks * s.channels) *
                                                                     sizeof(double),
                                                                 "BatchNorm partial sums"));
  return std::unique_ptr<BatchNorm>(new CudaBatchNorm(dev, p, s, std::move(partial)));
}

}  // namespace dtrain::kernels::cuda
