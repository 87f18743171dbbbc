// Dense (cuBLAS SGEMM/SGEMV + bias kernel), MaxPool, AvgPool and LRN (own NHWC kernels, pool_lrn.cu) for the CUDA
// backend.
//
// Row-major products through column-major cuBLAS: a row-major [r, c] matrix is the column-major [c, r] matrix
// (its transpose) with leading dimension c, so Y = X W (row-major) is computed as Y^T = W^T X^T (column-major).
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kernel_shapes.h"

namespace dtrain::kernels::cuda {
namespace {

// ---- Dense ----

// alpha scales the GEMMs (cuBLAS's alpha), beta the bias (the bias-add kernel, and the bias gradient's GEMV).
// weights_transposed (w stored [out, in]) only changes the GEMMs' operations and leading dimensions.
class CudaDense final : public Dense {
 public:
  CudaDense(CudaDevice* dev, const DenseParams& p, DeviceBuffer ones) : dev_(dev), p_(p), ones_(std::move(ones)) {}

  // y[B,O] = x[B,I] w[I,O] + b  <=>  y^T[O,B] = w^T[O,I] x^T[I,B] (column-major). w stored [I,O] is column-major
  // [O,I] (op N, ld out); stored [O,I] it is column-major [I,O] (op T, ld in).
  absl::Status Forward(const float* x, const float* w, const float* b, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("Dense::Forward"));
    if (p_.has_bias && b == nullptr) {
      return absl::InvalidArgumentError("Dense::Forward: b is null but the op was made with has_bias");
    }
    const float alpha = p_.alpha, zero = 0.0f;
    const bool t = p_.weights_transposed;
    RETURN_IF_ERROR(CublasStatus(cublasSgemm(dev_->cublas(), t ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, p_.out,
                                             p_.batch, p_.in, &alpha, w, t ? p_.in : p_.out, x, p_.in, &zero, y,
                                             p_.out),
                                 "Dense::Forward: cublasSgemm"));
    if (!p_.has_bias) return absl::OkStatus();
    if (p_.beta == 1.0f) {
      return CudaStatus(LaunchBiasAdd(y, b, p_.batch, p_.out, dev_->stream()), "Dense::Forward: bias add");
    }
    return CudaStatus(LaunchScaledBiasAdd(y, b, p_.beta, p_.batch, p_.out, dev_->stream()),
                      "Dense::Forward: bias add");
  }

  // dx[B,I] = alpha dy[B,O] w^T  <=>  dx^T[I,B] = alpha w[I,O] dy^T[O,B]. w stored [I,O] is column-major [O,I]
  // (op T, ld out); stored [O,I] it is column-major [I,O] = w itself (op N, ld in).
  absl::Status BackwardData(const float* dy, const float* w, float* dx) override {
    RETURN_IF_ERROR(dev_->Activate("Dense::BackwardData"));
    const float alpha = p_.alpha, zero = 0.0f;
    const bool t = p_.weights_transposed;
    return CublasStatus(cublasSgemm(dev_->cublas(), t ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, p_.in, p_.batch,
                                    p_.out, &alpha, w, t ? p_.in : p_.out, dy, p_.out, &zero, dx, p_.in),
                        "Dense::BackwardData: cublasSgemm");
  }

  // dw = alpha x^T dy in w's layout. Stored [I,O]: dw^T[O,I] = dy^T[O,B] x[B,I], x stored being column-major
  // [I,B] (op T). Stored [O,I]: the column-major [I,O] matrix x^T[I,B] dy[B,O], dy stored being column-major
  // [O,B] (op T). db[O] = beta dy^T[O,B] * ones[B].
  absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) override {
    RETURN_IF_ERROR(dev_->Activate("Dense::BackwardWeights"));
    const float alpha = p_.alpha, beta = p_.beta, zero = 0.0f;
    if (p_.weights_transposed) {
      RETURN_IF_ERROR(CublasStatus(cublasSgemm(dev_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, p_.in, p_.out, p_.batch,
                                               &alpha, x, p_.in, dy, p_.out, &zero, dw, p_.in),
                                   "Dense::BackwardWeights: cublasSgemm"));
    } else {
      RETURN_IF_ERROR(CublasStatus(cublasSgemm(dev_->cublas(), CUBLAS_OP_N, CUBLAS_OP_T, p_.out, p_.in, p_.batch,
                                               &alpha, dy, p_.out, x, p_.in, &zero, dw, p_.out),
                                   "Dense::BackwardWeights: cublasSgemm"));
    }
    if (!p_.has_bias || db == nullptr) return absl::OkStatus();
    return CublasStatus(cublasSgemv(dev_->cublas(), CUBLAS_OP_N, p_.out, p_.batch, &beta, dy, p_.out,
                                    ones_.floats(), 1, &zero, db, 1),
                        "Dense::BackwardWeights: bias gradient (cublasSgemv)");
  }

 private:
  CudaDevice* dev_;
  DenseParams p_;
  DeviceBuffer ones_;  // batch ones for the bias gradient (empty without bias)
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

// ---- AvgPool ----

class CudaAvgPool final : public AvgPool {
 public:
  CudaAvgPool(CudaDevice* dev, const PoolShape& s) : dev_(dev), s_(s) {}

  absl::Status Forward(const float* x, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("AvgPool::Forward"));
    return CudaStatus(LaunchAvgPoolForward(x, y, s_, dev_->stream()), "AvgPool::Forward");
  }

  absl::Status Backward(const float* dy, float* dx) override {
    RETURN_IF_ERROR(dev_->Activate("AvgPool::Backward"));
    return CudaStatus(LaunchAvgPoolBackward(dy, dx, s_, dev_->stream()), "AvgPool::Backward");
  }

 private:
  CudaDevice* dev_;
  PoolShape s_;
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
  if (!p.has_bias) return std::unique_ptr<Dense>(new CudaDense(dev, p, DeviceBuffer()));
  ASSIGN_OR_RETURN(DeviceBuffer ones, DeviceBuffer::AllocateFloats(p.batch, "Dense bias-gradient ones"));
  RETURN_IF_ERROR(CudaStatus(LaunchFill(1.0f, ones.floats(), p.batch, dev->stream()), "MakeDense: fill ones"));
  return std::unique_ptr<Dense>(new CudaDense(dev, p, std::move(ones)));
}

absl::StatusOr<std::unique_ptr<MaxPool>> MakeCudaMaxPool(CudaDevice* dev, const PoolParams& p) {
  ASSIGN_OR_RETURN(const PoolShape s, MakePoolShape(p, "MakeMaxPool"));
  const int64_t out_elems = int64_t{s.batch} * s.out_h * s.out_w * s.channels;
  ASSIGN_OR_RETURN(DeviceBuffer argmax,
                   DeviceBuffer::Allocate(static_cast<size_t>(out_elems) * sizeof(int32_t), "MaxPool argmax"));
  return std::unique_ptr<MaxPool>(new CudaMaxPool(dev, s, std::move(argmax)));
}

absl::StatusOr<std::unique_ptr<AvgPool>> MakeCudaAvgPool(CudaDevice* dev, const PoolParams& p) {
  ASSIGN_OR_RETURN(const PoolShape s, MakePoolShape(p, "MakeAvgPool"));
  return std::unique_ptr<AvgPool>(new CudaAvgPool(dev, s));
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
