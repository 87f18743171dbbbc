// The base class's answers for the ops a backend may lack (kernels/device.h): Unimplemented, naming the op and
// the backend, so that a model needing one fails when its network is made.
#include "absl/strings/str_cat.h"
#include "kernels/device.h"

namespace dtrain::kernels {
namespace {

absl::Status Missing(const Device& d, const char* op) {
  return absl::UnimplementedError(absl::StrCat(op, " is not implemented on the ", d.name(), " backend"));
}

}  // namespace

const char* ActivationName(ActivationParams::Kind kind) {
  using Kind = ActivationParams::Kind;
  switch (kind) {
    case Kind::kLeakyRelu: return "LeakyRelu";
    case Kind::kClip: return "Clip";
    case Kind::kSigmoid: return "Sigmoid";
    case Kind::kTanh: return "Tanh";
    case Kind::kHardSigmoid: return "HardSigmoid";
    case Kind::kHardSwish: return "HardSwish";
    case Kind::kGelu: return "Gelu";
    case Kind::kSilu: return "Silu";
    case Kind::kErf: return "Erf";
    case Kind::kSqrt: return "Sqrt";
    case Kind::kPow: return "Pow";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<AvgPool>> Device::MakeAvgPool(const PoolParams&) { return Missing(*this, "AvgPool"); }
absl::StatusOr<std::unique_ptr<BatchNorm>> Device::MakeBatchNorm(const BatchNormParams&) {
  return Missing(*this, "BatchNorm");
}
absl::StatusOr<std::unique_ptr<Binary>> Device::MakeBinary(const BroadcastParams&) {
  return Missing(*this, "Binary (broadcasting Add/Mul)");
}
absl::Status Device::Activation(const ActivationParams&, const float*, float*, int64_t) {
  return Missing(*this, "Activation");
}
absl::Status Device::ActivationBackward(const ActivationParams&, const float*, const float*, const float*, float*,
                                        int64_t) {
  return Missing(*this, "ActivationBackward");
}
absl::Status Device::CopyStrided(const float*, int64_t, float*, int64_t, int64_t, int64_t, bool) {
  return Missing(*this, "CopyStrided");
}
absl::Status Device::Transpose(const float*, float*, int64_t, int64_t, int64_t) {
  return Missing(*this, "Transpose");
}
absl::Status Device::BatchNormRunningDelta(const float*, const float*, const float*, const float*, int, int64_t,
                                           float, bool, float*, float*) {
  return Missing(*this, "BatchNormRunningDelta");
}
absl::Status Device::Gather(const GatherParams&, const float*, const int32_t*, const int32_t*, float*) {
  return Missing(*this, "Gather");
}
absl::Status Device::GatherBackward(const GatherParams&, const float*, const int32_t*, const int32_t*, float*) {
  return Missing(*this, "GatherBackward");
}
absl::Status Device::Interaction(const InteractionParams&, const float*, float*) {
  return Missing(*this, "Interaction");
}
absl::Status Device::InteractionBackward(const InteractionParams&, const float*, const float*, float*) {
  return Missing(*this, "InteractionBackward");
}
absl::Status Device::StridedCopy(const StridedCopyParams&, const float*, float*, bool) {
  return Missing(*this, "StridedCopy");
}
absl::StatusOr<std::unique_ptr<Reduce>> Device::MakeReduce(const ReduceParams&) { return Missing(*this, "Reduce"); }
absl::StatusOr<std::unique_ptr<Softmax>> Device::MakeSoftmax(const SoftmaxParams&) {
  return Missing(*this, "Softmax");
}
absl::StatusOr<std::unique_ptr<LayerNorm>> Device::MakeLayerNorm(const LayerNormParams&) {
  return Missing(*this, "LayerNorm");
}
absl::StatusOr<std::unique_ptr<MatMul>> Device::MakeMatMul(const MatMulParams&) {
  return Missing(*this, "MatMul (of two tensors)");
}
absl::Status Device::SigmoidCrossEntropy(const float*, const float*, int, float*, float*) {
  return Missing(*this, "SigmoidCrossEntropy");
}

}  // namespace dtrain::kernels
