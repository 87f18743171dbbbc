// CudaDevice's tensor ops of imported graphs (kernels/tensor_ops.h): StridedCopy, and the shape-specialized
// Reduce, Softmax, LayerNorm (own kernels, tensor_ops.cu) and MatMul (cuBLAS strided-batched SGEMM in the
// device's full-fp32 math mode, no TF32, as Dense). Make* validates the params (InvalidArgument naming the
// op) and allocates whatever scratch the op needs; afterwards the ops only launch work on the device's
// compute stream (no allocation, no host synchronization), so they are capturable into CUDA graphs.
//
// Thread-safety: as every CudaDevice op (cuda_device_internal.h), one thread at a time; an op must not be
// used after its device is destroyed.
#include <climits>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kernel_shapes.h"
#include "kernels/tensor_ops.h"

namespace dtrain::kernels::cuda {
namespace {

static_assert(kMaxCopyDims == kMaxCopyRank, "op_math.h's CopyShape must hold every StridedCopyParams");
static_assert(static_cast<int>(ReduceKind::kSum) == kReduceSum &&
                  static_cast<int>(ReduceKind::kMean) == kReduceMean &&
                  static_cast<int>(ReduceKind::kMax) == kReduceMax,
              "ReduceOpKind must follow ReduceKind");

// InvalidArgument naming `op` when the product of `sizes` (all positive) exceeds INT64_MAX.
absl::Status CheckProduct(std::initializer_list<int64_t> sizes, absl::string_view op,
                          absl::string_view what) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s > 0 && n > INT64_MAX / s)
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " overflows int64"));
    n *= s;
  }
  return absl::OkStatus();
}

// ---- Reduce ----

class CudaReduce final : public Reduce {
 public:
  CudaReduce(CudaDevice* dev, const ReduceDims& s, DeviceBuffer argmax)
      : dev_(dev), s_(s), argmax_(std::move(argmax)) {}

  absl::Status Forward(const float* x, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("Reduce::Forward"));
    return CudaStatus(LaunchReduceForward(s_, x, y, Argmax(), dev_->stream()), "Reduce::Forward");
  }

  absl::Status Backward(const float* dy, float* dx) override {
    RETURN_IF_ERROR(dev_->Activate("Reduce::Backward"));
    return CudaStatus(LaunchReduceBackward(s_, dy, Argmax(), dx, dev_->stream()), "Reduce::Backward");
  }

 private:
  int32_t* Argmax() const { return static_cast<int32_t*>(argmax_.get()); }

  CudaDevice* dev_;
  ReduceDims s_;
  DeviceBuffer argmax_;  // kMax: outer * inner int32, the last Forward's first maxima (empty otherwise)
};

// ---- Softmax ----

class CudaSoftmax final : public Softmax {
 public:
  CudaSoftmax(CudaDevice* dev, const SoftmaxParams& p) : dev_(dev), p_(p) {}

  absl::Status Forward(const float* x, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("Softmax::Forward"));
    return CudaStatus(LaunchSoftmaxForward(x, y, p_.outer, p_.n, p_.inner, p_.log, dev_->stream()),
                      "Softmax::Forward");
  }

  absl::Status Backward(const float* y, const float* dy, float* dx) override {
    RETURN_IF_ERROR(dev_->Activate("Softmax::Backward"));
    return CudaStatus(LaunchSoftmaxBackward(y, dy, dx, p_.outer, p_.n, p_.inner, p_.log, dev_->stream()),
                      "Softmax::Backward");
  }

 private:
  CudaDevice* dev_;
  SoftmaxParams p_;
};

// ---- LayerNorm ----

class CudaLayerNorm final : public LayerNorm {
 public:
  CudaLayerNorm(CudaDevice* dev, const LayerNormParams& p, const ColumnShape& s, DeviceBuffer partial)
      : dev_(dev), p_(p), s_(s), partial_(std::move(partial)) {}

  absl::Status Forward(const float* x, const float* scale, const float* bias, float* y, float* mean,
                       float* var) override {
    RETURN_IF_ERROR(dev_->Activate("LayerNorm::Forward"));
    if (p_.has_bias && bias == nullptr) {
      return absl::InvalidArgumentError("LayerNorm::Forward: bias is null but the op was made with has_bias");
    }
    return CudaStatus(LaunchLayerNormForward(x, scale, p_.has_bias ? bias : nullptr, p_.epsilon, p_.rows,
                                             p_.cols, y, mean, var, dev_->stream()),
                      "LayerNorm::Forward");
  }

  absl::Status Backward(const float* x, const float* dy, const float* scale, const float* mean,
                        const float* var, float* dx, float* dscale, float* dbias) override {
    RETURN_IF_ERROR(dev_->Activate("LayerNorm::Backward"));
    if (mean == nullptr || var == nullptr) {
      return absl::InvalidArgumentError("LayerNorm::Backward: needs the forward's mean and var");
    }
    return CudaStatus(
        LaunchLayerNormBackward(x, dy, scale, mean, var, p_.epsilon, s_, static_cast<double*>(partial_.get()),
                                dx, dscale, p_.has_bias ? dbias : nullptr, dev_->stream()),
        "LayerNorm::Backward");
  }

 private:
  CudaDevice* dev_;
  LayerNormParams p_;
  ColumnShape s_;         // channels = cols; the parameter gradients' chunking
  DeviceBuffer partial_;  // 2 * chunks * cols doubles: their per-chunk sums
};

// ---- MatMul ----

// Row-major products through column-major cuBLAS (op_math.h's PlanMatMul / PlanRowMajorGemm): each pass is
// one cublasSgemmStridedBatched, planned when the op is made. The handle's math mode is the device's
// (CUBLAS_DEFAULT_MATH: full fp32, as Dense), its stream the device's compute stream and its workspace
// preset, so the calls never allocate.
class CudaMatMul final : public MatMul {
 public:
  CudaMatMul(CudaDevice* dev, const MatMulParams& p) : dev_(dev), p_(p) {
    for (int pass = 0; pass < 3; ++pass) plans_[pass] = PlanMatMul(pass, p.m, p.n, p.k, p.trans_a, p.trans_b);
  }

  absl::Status Forward(const float* a, const float* b, float* y) override {
    return Run(kMatMulForward, a, b, nullptr, y, "MatMul::Forward");
  }
  absl::Status BackwardA(const float* dy, const float* b, float* da) override {
    return Run(kMatMulBackwardA, nullptr, b, dy, da, "MatMul::BackwardA");
  }
  absl::Status BackwardB(const float* a, const float* dy, float* db) override {
    return Run(kMatMulBackwardB, a, nullptr, dy, db, "MatMul::BackwardB");
  }

 private:
  absl::Status Run(int pass, const float* a, const float* b, const float* dy, float* c, const char* op) {
    RETURN_IF_ERROR(dev_->Activate(op));
    const MatMulGemm& g = plans_[pass];
    const float* operands[3] = {a, b, dy};  // MatMulOperand's order
    const GemmPlan& q = g.plan;
    const float one = 1.0f, zero = 0.0f;
    return CublasStatus(
        cublasSgemmStridedBatched(dev_->cublas(), q.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  q.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(q.m),
                                  static_cast<int>(q.n), static_cast<int>(q.k), &one, operands[g.first],
                                  static_cast<int>(q.ld_first), q.stride_first, operands[g.second],
                                  static_cast<int>(q.ld_second), q.stride_second, &zero, c,
                                  static_cast<int>(q.ldc), q.stride_c, static_cast<int>(p_.batch)),
        absl::StrCat(op, ": cublasSgemmStridedBatched"));
  }

  CudaDevice* dev_;
  MatMulParams p_;
  MatMulGemm plans_[3];  // indexed by MatMulPass
};

}  // namespace

absl::StatusOr<std::unique_ptr<Reduce>> MakeCudaReduce(CudaDevice* dev, const ReduceParams& p) {
  RETURN_IF_ERROR(CheckReduceParams("MakeReduce", p));
  RETURN_IF_ERROR(CheckProduct({p.outer, p.reduce, p.inner}, "MakeReduce", Describe(p)));
  if (p.kind == ReduceKind::kMax && p.reduce > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeReduce: ", Describe(p), " reduces more than 2^31 elements"));
  }
  const ReduceDims s{static_cast<int>(p.kind), p.outer, p.reduce, p.inner};
  DeviceBuffer argmax;
  if (p.kind == ReduceKind::kMax) {
    ASSIGN_OR_RETURN(argmax, DeviceBuffer::Allocate(static_cast<size_t>(p.outer * p.inner) * sizeof(int32_t),
                                                    "Reduce argmax"));
  }
  return std::unique_ptr<Reduce>(new CudaReduce(dev, s, std::move(argmax)));
}

absl::StatusOr<std::unique_ptr<Softmax>> MakeCudaSoftmax(CudaDevice* dev, const SoftmaxParams& p) {
  RETURN_IF_ERROR(CheckSoftmaxParams("MakeSoftmax", p));
  RETURN_IF_ERROR(CheckProduct({p.outer, p.n, p.inner}, "MakeSoftmax", Describe(p)));
  return std::unique_ptr<Softmax>(new CudaSoftmax(dev, p));
}

absl::StatusOr<std::unique_ptr<LayerNorm>> MakeCudaLayerNorm(CudaDevice* dev, const LayerNormParams& p) {
  RETURN_IF_ERROR(CheckLayerNormParams("MakeLayerNorm", p));
  RETURN_IF_ERROR(CheckProduct({p.rows, p.cols}, "MakeLayerNorm", Describe(p)));
  if (p.cols > INT_MAX || !std::isfinite(p.epsilon)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeLayerNorm: cols must fit in an int and epsilon be finite: ", Describe(p)));
  }
  const ChunkSplit split = SplitReduction(p.cols, p.rows);
  const ColumnShape s{p.rows, static_cast<int>(p.cols), split.chunks, split.chunk_len};
  ASSIGN_OR_RETURN(DeviceBuffer partial,
                   DeviceBuffer::Allocate(static_cast<size_t>(2 * s.chunks * s.channels) * sizeof(double),
                                          "LayerNorm partial sums"));
  return std::unique_ptr<LayerNorm>(new CudaLayerNorm(dev, p, s, std::move(partial)));
}

absl::StatusOr<std::unique_ptr<MatMul>> MakeCudaMatMul(CudaDevice* dev, const MatMulParams& p) {
  RETURN_IF_ERROR(CheckMatMulParams("MakeMatMul", p));
  if (p.batch > INT_MAX || p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeMatMul: cuBLAS takes int sizes, and one is over 2^31 - 1: ", Describe(p)));
  }
  for (std::initializer_list<int64_t> sizes :
       {std::initializer_list<int64_t>{p.batch, p.m, p.k}, std::initializer_list<int64_t>{p.batch, p.k, p.n},
        std::initializer_list<int64_t>{p.batch, p.m, p.n}}) {
    RETURN_IF_ERROR(CheckProduct(sizes, "MakeMatMul", Describe(p)));
  }
  return std::unique_ptr<MatMul>(new CudaMatMul(dev, p));
}

// ---- CudaDevice entry points ----

absl::Status CudaDevice::StridedCopy(const StridedCopyParams& p, const float* src, float* dst,
                                     bool accumulate) {
  RETURN_IF_ERROR(CheckStridedCopyParams("StridedCopy", p));
  const int64_t count = p.count();
  if (count == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("StridedCopy: null source or destination for ", Describe(p)));
  }
  const CopyShape s = MakeCopyShape(p);
  RETURN_IF_ERROR(Activate("StridedCopy"));
  return CudaStatus(LaunchStridedCopy(s, src, dst, count, accumulate, stream_), "StridedCopy");
}

absl::StatusOr<std::unique_ptr<Reduce>> CudaDevice::MakeReduce(const ReduceParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeReduce"));
  RETURN_IF_ERROR(Activate("MakeReduce"));
  return MakeCudaReduce(this, p);
}

absl::StatusOr<std::unique_ptr<Softmax>> CudaDevice::MakeSoftmax(const SoftmaxParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeSoftmax"));
  RETURN_IF_ERROR(Activate("MakeSoftmax"));
  return MakeCudaSoftmax(this, p);
}

absl::StatusOr<std::unique_ptr<LayerNorm>> CudaDevice::MakeLayerNorm(const LayerNormParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeLayerNorm"));
  RETURN_IF_ERROR(Activate("MakeLayerNorm"));
  return MakeCudaLayerNorm(this, p);
}

absl::StatusOr<std::unique_ptr<MatMul>> CudaDevice::MakeMatMul(const MatMulParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeMatMul"));
  RETURN_IF_ERROR(Activate("MakeMatMul"));
  return MakeCudaMatMul(this, p);
}

}  // namespace dtrain::kernels::cuda
