// Dense (cuBLAS SGEMM/SGEMV + bias kernel), MaxPool and LRN (own NHWC kernels, pool_lrn.cu) for the CUDA backend.
//
// Row-major products through column-major cuBLAS: a row-major [r, c] matrix is the column-major [c, r] matrix
// (its transpose) with leading dimension c, so Y = X W (row-major) is computed as Y^T = W^T X^T (column-major).
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace dtrain::kernels::cuda {
namespace {

// ---- Dense ----

class CudaDense final : public Dense {
 public:
  CudaDense(CudaDevice* dev, const DenseParams& p, DeviceBuffer ones) : dev_(dev), p_(p), ones_(std::move(ones)) {}

  // y[B,O] = x[B,I] w[I,O] + b  <=>  y^T[O,B] = w^T[O,I] x^T[I,B] (column-major).
  absl::Status Forward(const float* x, const float* w, const float* b, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("Dense::Forward"));
    const float one = 1.0f, zero = 0.0f;
    RETURN_IF_ERROR(CublasStatus(cublasSgemm(dev_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, p_.out, p_.batch, p_.in,
                                             &one, w, p_.out, x, p_.in, &zero, y, p_.out),
                                 "Dense::Forward: cublasSgemm"));
    return CudaStatus(LaunchBiasAdd(y, b, p_.batch, p_.out, dev_->stream()), "Dense::Forward: bias add");
  }

  // dx[B,I] = dy[B,O] w^T  <=>  dx^T[I,B] = w[I,O] dy^T[O,B]; w as stored is column-major [O,I], so op T.
  absl::Status BackwardData(const float* dy, const float* w, float* dx) override {
    RETURN_IF_ERROR(dev_->Activate("Dense::BackwardData"));
    const float one = 1.0f, zero = 0.0f;
    return CublasStatus(cublasSgemm(dev_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, p_.in, p_.batch, p_.out, &one, w,
                                    p_.out, dy, p_.out, &zero, dx, p_.in),
                        "Dense::BackwardData: cublasSgemm");
  }

  // dw[I,O] = x^T dy  <=>  dw^T[O,I] = dy^T[O,B] x[B,I]; x as stored is column-major [I,B], so op T.
  // db[O] = dy^T[O,B] * ones[B].
  absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) override {
    RETURN_IF_ERROR(dev_->Activate("Dense::BackwardWeights"));
    const float one = 1.0f, zero = 0.0f;
    RETURN_IF_ERROR(CublasStatus(cublasSgemm(dev_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, p_.out, p_.in, p_.batch,
                                             &one, dy, p_.out, x, p_.in, &zero, dw, p_.out),
                                 "Dense::BackwardWeights: cublasSgemm"));
    return CublasStatus(cublasSgemv(dev_->cublas(), CUBLAS_OP_N, p_.out, p_.batch, &one, dy, p_.out,
                                    ones_.floats(), 1, &zero, db, 1),
                        "Dense::BackwardWeights: bias gradient (cublasSgemv)");
  }

 private:
  CudaDevice* dev_;
  DenseParams p_;
  DeviceBuffer ones_;  // batch ones for the bias gradient
};

// ---- MaxPool ----

class CudaMaxPool final : public MaxPool {
 public:
  CudaMaxPool(CudaDevice* dev, const PoolShape& s, DeviceBuffer argmax)
      : dev_(dev), s_(s), argmax_(std::move(argmax)) {}

  absl::Status Forward(const float* x, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("MaxPool::Forward"));
    return CudaStatus(LaunchMaxPoolForward(x, y, static_cast<int32_t*>(argmax_.get()), s_, dev_->stream()),
                      "MaxPool::Forward");
  }

  absl::Status Backward(const float* dy, float* dx) override {
    RETURN_IF_ERROR(dev_->Activate("MaxPool::Backward"));
    return CudaStatus(LaunchMaxPoolBackward(dy, static_cast<const int32_t*>(argmax_.get()), dx, s_, dev_->stream()),
                      "MaxPool::Backward");
  }

 private:
  CudaDevice* dev_;
  PoolShape s_;
  DeviceBuffer argmax_;  // int32 per output: flat input index of the winner of the last Forward
};

// ---- LRN ----

class CudaLrn final : public Lrn {
 public:
  CudaLrn(CudaDevice* dev, const LrnShape& s, DeviceBuffer scratch) : dev_(dev), s_(s), scratch_(std::move(scratch)) {}

  absl::Status Forward(const float* x, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("Lrn::Forward"));
    return CudaStatus(LaunchLrnForward(x, y, s_, dev_->stream()), "Lrn::Forward");
  }

  absl::Status Backward(const float* x, const float* y, const float* dy, float* dx) override {
    RETURN_IF_ERROR(dev_->Activate("Lrn::Backward"));
    return CudaStatus(LaunchLrnBackward(x, y, dy, dx, scratch_.floats(), s_, dev_->stream()), "Lrn::Backward");
  }

 private:
  CudaDevice* dev_;
  LrnShape s_;
  DeviceBuffer scratch_;  // 2 * elements floats for the backward pass
};

}  // namespace

absl::StatusOr<std::unique_ptr<Dense>> MakeCudaDense(CudaDevice* dev, const DenseParams& p) {
  if (p.batch <= 0 || p.in <= 0 || p.out <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeDense: sizes must be positive, got batch=", p.batch, " in=", p.in, " out=", p.out));
  }
  ASSIGN_OR_RETURN(DeviceBuffer ones, DeviceBuffer::AllocateFloats(p.batch, "Dense bias-gradient ones"));
  RETURN_IF_ERROR(CudaStatus(LaunchFill(1.0f, ones.floats(), p.batch, dev->stream()), "MakeDense: fill ones"));
  return std::unique_ptr<Dense>(new CudaDense(dev, p, std::move(ones)));
}

absl::StatusOr<std::unique_ptr<MaxPool>> MakeCudaMaxPool(CudaDevice* dev, const PoolParams& p) {
  if (p.batch <= 0 || p.in_h <= 0 || p.in_w <= 0 || p.channels <= 0 || p.window <= 0 || p.stride <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeMaxPool: sizes must be positive, got batch=", p.batch,
                                                   " in=", p.in_h, "x", p.in_w, "x", p.channels,
                                                   " window=", p.window, " stride=", p.stride));
  }
  if (p.out_h() <= 0 || p.out_w() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeMaxPool: VALID window ", p.window, " does not fit a ", p.in_h, "x", p.in_w, " input"));
  }
  const int64_t in_elems = int64_t{p.batch} * p.in_h * p.in_w * p.channels;
  if (in_elems > INT_MAX) return absl::InvalidArgumentError("MakeMaxPool: inputs over 2^31 elements are not supported");
  PoolShape s{p.batch,  p.in_h,   p.in_w,
              p.channels, p.out_h(), p.out_w(),
              p.window, p.stride, PadBefore(p.in_h, p.window, p.stride, p.padding),
              PadBefore(p.in_w, p.window, p.stride, p.padding)};
  const int64_t out_elems = int64_t{p.batch} * s.out_h * s.out_w * p.channels;
  ASSIGN_OR_RETURN(DeviceBuffer argmax,
                   DeviceBuffer::Allocate(static_cast<size_t>(out_elems) * sizeof(int32_t), "MaxPool argmax"));
  return std::unique_ptr<MaxPool>(new CudaMaxPool(dev, s, std::move(argmax)));
}

absl::StatusOr<std::unique_ptr<Lrn>> MakeCudaLrn(CudaDevice* dev, const LrnParams& p) {
  if (p.batch <= 0 || p.h <= 0 || p.w <= 0 || p.channels <= 0 || p.depth_radius < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeLrn: bad shape batch=", p.batch, " ", p.h, "x", p.w, "x",
                                                   p.channels, " depth_radius=", p.depth_radius));
  }
  LrnShape s{int64_t{p.batch} * p.h * p.w, p.channels, p.depth_radius, p.bias, p.alpha, p.beta};
  ASSIGN_OR_RETURN(DeviceBuffer scratch, DeviceBuffer::AllocateFloats(2 * s.pixels * s.channels, "Lrn scratch"));
  return std::unique_ptr<Lrn>(new CudaLrn(dev, s, std::move(scratch)));
}

}  // namespace dtrain::kernels::cuda
