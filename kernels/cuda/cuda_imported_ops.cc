// CudaDevice's stateless ops of imported graphs and sparse models (kernels/device.h): activations, strided copies,
// transposes, BatchNorm's running-statistics delta, embedding lookups, DLRM interaction and sigmoid
// cross-entropy. Each validates its arguments and launches own kernels (cuda_kernels.h); none allocates or
// synchronizes, so all are capturable. Device-data errors (bad labels, indices, bags) are recorded by the
// kernels and reported by the next synchronizing call (TakeDeviceError).
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace dtrain::kernels::cuda {
namespace {

// ActivationParams::Kind's order is ActivationKind's (op_math.h).
static_assert(static_cast<int>(ActivationParams::Kind::kTanh) == kActTanh &&
                  static_cast<int>(ActivationParams::Kind::kHardSigmoid) == kActHardSigmoid &&
                  static_cast<int>(ActivationParams::Kind::kSqrt) == kActSqrt &&
                  static_cast<int>(ActivationParams::Kind::kPow) == kActPow,
              "ActivationKind must follow ActivationParams::Kind");

absl::StatusOr<ActivationArgs> ToArgs(const ActivationParams& p, absl::string_view op) {
  const int kind = static_cast<int>(p.kind);
  if (kind < kActLeakyRelu || kind > kActPow) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": unknown activation kind ", kind));
  }
  return ActivationArgs{kind, p.alpha, p.lo, p.hi, p.beta, p.exponent};
}

absl::StatusOr<GatherShape> ToGatherShape(const GatherParams& p, const int32_t* indices, const int32_t* offsets,
                                          absl::string_view op) {
  if (p.rows < 1 || p.dim < 1 || p.count < 0 || p.num_bags < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": bad shape rows=", p.rows, " dim=", p.dim,
                                                   " count=", p.count, " num_bags=", p.num_bags));
  }
  if (p.rows > INT32_MAX || p.count > INT32_MAX || p.num_bags >= INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": rows, count and bags are int32 (rows=", p.rows,
                                                   " count=", p.count, " num_bags=", p.num_bags, ")"));
  }
  const int64_t out_rows = p.num_bags > 0 ? p.num_bags : p.count;
  if (out_rows > INT64_MAX / p.dim || p.rows > INT64_MAX / p.dim) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": sizes overflow int64"));
  }
  if (indices == nullptr && p.count > 0) return absl::InvalidArgumentError(absl::StrCat(op, ": null indices"));
  if (offsets == nullptr && p.num_bags > 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": bags need offsets (num_bags + 1 int32)"));
  }
  return GatherShape{p.rows, p.dim, p.count, p.num_bags, p.mean ? 1 : 0};
}

}  // namespace

absl::Status CudaDevice::Activation(const ActivationParams& p, const float* x, float* y, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Activation: negative element count ", n));
  ASSIGN_OR_RETURN(const ActivationArgs a, ToArgs(p, "Activation"));
  RETURN_IF_ERROR(Activate("Activation"));
  return CudaStatus(LaunchActivation(a, x, y, n, stream_), "Activation");
}

absl::Status CudaDevice::ActivationBackward(const ActivationParams& p, const float* x, const float* y,
                                            const float* dy, float* dx, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("ActivationBackward: negative element count ", n));
  ASSIGN_OR_RETURN(const ActivationArgs a, ToArgs(p, "ActivationBackward"));
  const bool reads_x = !ActivationGradReadsY(a.kind);
  if (n > 0 && (reads_x ? x : y) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ActivationBackward: this activation needs the forward's ", reads_x ? "input x" : "output y"));
  }
  RETURN_IF_ERROR(Activate("ActivationBackward"));
  return CudaStatus(LaunchActivationBackward(a, x, y, dy, dx, n, stream_), "ActivationBackward");
}

absl::Status CudaDevice::CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                                     int64_t rows, int64_t cols, bool accumulate) {
  if (rows < 0 || cols < 0 || src_stride < 0 || (rows > 1 && dst_stride < cols)) {
    return absl::InvalidArgumentError(absl::StrCat("CopyStrided: bad block rows=", rows, " cols=", cols,
                                                   " src_stride=", src_stride, " dst_stride=", dst_stride,
                                                   " (destination rows must not overlap)"));
  }
  RETURN_IF_ERROR(Activate("CopyStrided"));
  return CudaStatus(LaunchCopyStrided(src, src_stride, dst, dst_stride, rows, cols, accumulate, stream_),
                    "CopyStrided");
}

absl::Status CudaDevice::Transpose(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) {
  if (batch < 0 || rows < 0 || cols < 0 || rows > INT_MAX || cols > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("Transpose: bad shape batch=", batch, " rows=", rows, " cols=", cols));
  }
  if (x == y && rows > 1 && cols > 1 && batch > 0) {
    return absl::InvalidArgumentError("Transpose: x and y must not be the same buffer");
  }
  RETURN_IF_ERROR(Activate("Transpose"));
  if (rows == 1 || cols == 1) {  // the same floats in the same order
    return CopyOnDevice(x, y, batch * rows * cols);
  }
  return CudaStatus(LaunchBatchedTranspose(x, y, batch, static_cast<int>(rows), static_cast<int>(cols), stream_),
                    "Transpose");
}

absl::Status CudaDevice::BatchNormRunningDelta(const float* running_mean, const float* running_var,
                                               const float* batch_mean, const float* batch_var, int channels,
                                               int64_t count, float momentum, bool unbiased, float* d_mean,
                                               float* d_var) {
  if (channels < 0 || count < 1 || (unbiased && count < 2)) {
    return absl::InvalidArgumentError(absl::StrCat("BatchNormRunningDelta: bad channels=", channels, " count=",
                                                   count, unbiased ? " (the unbiased variance needs count >= 2)"
                                                                   : ""));
  }
  const float var_factor =
      unbiased ? static_cast<float>(static_cast<double>(count) / static_cast<double>(count - 1)) : 1.0f;
  RETURN_IF_ERROR(Activate("BatchNormRunningDelta"));
  return CudaStatus(LaunchBatchNormRunningDelta(running_mean, running_var, batch_mean, batch_var, channels,
                                                momentum, var_factor, d_mean, d_var, stream_),
                    "BatchNormRunningDelta");
}

absl::Status CudaDevice::Gather(const GatherParams& p, const float* table, const int32_t* indices,
                                const int32_t* offsets, float* y) {
  ASSIGN_OR_RETURN(const GatherShape s, ToGatherShape(p, indices, offsets, "Gather"));
  RETURN_IF_ERROR(Activate("Gather"));
  return CudaStatus(LaunchGather(s, table, indices, offsets, y,
                                 static_cast<unsigned long long*>(gather_first_bad_.get()), error_dev_, stream_),
                    "Gather");
}

absl::Status CudaDevice::GatherBackward(const GatherParams& p, const float* dy, const int32_t* indices,
                                        const int32_t* offsets, float* dtable) {
  ASSIGN_OR_RETURN(const GatherShape s, ToGatherShape(p, indices, offsets, "GatherBackward"));
  RETURN_IF_ERROR(Activate("GatherBackward"));
  return CudaStatus(LaunchGatherBackward(s, dy, indices, offsets, dtable,
                                         static_cast<unsigned long long*>(gather_first_bad_.get()), error_dev_,
                                         stream_),
                    "GatherBackward");
}

absl::Status CudaDevice::Interaction(const InteractionParams& p, const float* x, float* y) {
  RETURN_IF_ERROR(CheckInteractionParams("Interaction", p));
  RETURN_IF_ERROR(Activate("Interaction"));
  return CudaStatus(LaunchInteraction(x, y, p.batch, p.features, p.dim, stream_), "Interaction");
}

absl::Status CudaDevice::InteractionBackward(const InteractionParams& p, const float* x, const float* dy,
                                             float* dx) {
  RETURN_IF_ERROR(CheckInteractionParams("InteractionBackward", p));
  RETURN_IF_ERROR(Activate("InteractionBackward"));
  return CudaStatus(LaunchInteractionBackward(x, dy, dx, p.batch, p.features, p.dim, stream_),
                    "InteractionBackward");
}

absl::Status CudaDevice::SigmoidCrossEntropy(const float* logits, const float* labels, int batch, float* dlogits,
                                             float* loss) {
  if (batch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("SigmoidCrossEntropy: batch must be positive, got ", batch));
  }
  RETURN_IF_ERROR(Activate("SigmoidCrossEntropy"));
  return CudaStatus(LaunchSigmoidCrossEntropy(logits, labels, batch, dlogits, loss, error_dev_, stream_),
                    "SigmoidCrossEntropy");
}

}  // namespace dtrain::kernels::cuda
