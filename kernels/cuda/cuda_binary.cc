// Broadcasting Binary ops for the CUDA backend: the shape is simplified and each input's gradient planned as a
// fixed-order reduction when the op is made (kernel_shapes.h), with the scratch the reductions need; Forward and
// Backward only launch broadcast.cu's kernels (and a fill for gradient elements no output reaches).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kernel_shapes.h"

namespace dtrain::kernels::cuda {
namespace {

class CudaBinary final : public Binary {
 public:
  CudaBinary(CudaDevice* dev, const BroadcastParams& p, const BroadcastShape& s, DeviceBuffer partial)
      : dev_(dev),
        op_(static_cast<int>(p.op)),
        a_size_(p.a_size()),
        b_size_(p.b_size()),
        s_(s),
        grad_{MakeReduceShape(s, 0), MakeReduceShape(s, 1)},
        distinct_{ReduceTargetsAreDistinct(grad_[0]), ReduceTargetsAreDistinct(grad_[1])},
        partial_(std::move(partial)) {}

  absl::Status Forward(const float* a, const float* b, float* y) override {
    RETURN_IF_ERROR(dev_->Activate("Binary::Forward"));
    return CudaStatus(LaunchBinaryForward(op_, s_, a, b, y, dev_->stream()), "Binary::Forward");
  }

  absl::Status Backward(const float* a, const float* b, const float* dy, float* da, float* db) override {
    RETURN_IF_ERROR(dev_->Activate("Binary::Backward"));
    if ((op_ == kBinMul || op_ == kBinDiv) && (a == nullptr || b == nullptr)) {
      return absl::InvalidArgumentError("Binary::Backward: Mul and Div need the forward's inputs a and b");
    }
    if (da != nullptr) RETURN_IF_ERROR(Gradient(0, a, b, dy, da, a_size_));
    if (db != nullptr) RETURN_IF_ERROR(Gradient(1, a, b, dy, db, b_size_));
    return absl::OkStatus();
  }

 private:
  absl::Status Gradient(int which, const float* a, const float* b, const float* dy, float* dx, int64_t size) {
    const ReduceShape& r = grad_[which];
    const char* what = which == 0 ? "Binary::Backward: da" : "Binary::Backward: db";
    if (!distinct_[which]) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the input's strides overlap, so its gradient is not defined element by element"));
    }
    if (r.kept_count < size) {  // elements no output reaches (strides with gaps) get 0
      RETURN_IF_ERROR(CudaStatus(LaunchFill(0.0f, dx, size, dev_->stream()), what));
    }
    return CudaStatus(LaunchBinaryBackward(op_, r, a, b, dy, static_cast<double*>(partial_.get()), dx,
                                           dev_->stream()),
                      what);
  }

  CudaDevice* dev_;
  int op_;
  int64_t a_size_, b_size_;
  BroadcastShape s_;
  ReduceShape grad_[2];   // a's and b's gradient
  bool distinct_[2];      // ReduceTargetsAreDistinct(grad_[i])
  DeviceBuffer partial_;  // the larger of the two reductions' chunks * kept_count doubles
};

}  // namespace

absl::StatusOr<std::unique_ptr<Binary>> MakeCudaBinary(CudaDevice* dev, const BroadcastParams& p) {
  if (p.op != BinaryOp::kAdd && p.op != BinaryOp::kSub && p.op != BinaryOp::kMul && p.op != BinaryOp::kDiv) {
    return absl::InvalidArgumentError(absl::StrCat("MakeBinary: unknown op ", static_cast<int>(p.op)));
  }
  ASSIGN_OR_RETURN(const BroadcastShape s, MakeBroadcastShape(p));
  int64_t partial = 1;
  for (int which = 0; which < 2; ++which) {
    const ReduceShape r = MakeReduceShape(s, which);
    if (r.chunks > 1) partial = std::max(partial, r.chunks * r.kept_count);
  }
  ASSIGN_OR_RETURN(DeviceBuffer scratch,
                   DeviceBuffer::Allocate(static_cast<size_t>(partial) * sizeof(double), "Binary partial sums"));
  return std::unique_ptr<Binary>(new CudaBinary(dev, p, s, std::move(scratch)));
}

}  // namespace dtrain::kernels::cuda
