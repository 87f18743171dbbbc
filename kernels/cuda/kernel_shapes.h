// Host code that turns the interface's params (kernels/device.h) into the shapes the CUDA backend's kernels take
// (op_math.h), once, when an op is made: validation, pooling windows and pads, the simplified shape of a
// broadcasting Binary op and its gradients' reduction plans, and whether a convolution needs explicit padding.
// Used by the op factories (cuda_conv.cc, cuda_layers.cc, cuda_binary.cc); cuda_op_math_test checks it without a
// GPU. Stateless functions, thread-safe.
#ifndef DTRAIN_KERNELS_CUDA_KERNEL_SHAPES_H_
#define DTRAIN_KERNELS_CUDA_KERNEL_SHAPES_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/op_math.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {

// Pooling (MaxPool and AvgPool): InvalidArgument naming `op` for non-positive sizes, negative explicit pads, a
// window that does not fit, or tensors over 2^31 elements.
absl::StatusOr<PoolShape> MakePoolShape(const PoolParams& p, absl::string_view op);

// Convolution: whether cuDNN's symmetric padding (pads_h().before / pads_w().before on both sides) gives the op's
// output size. When it does, cuDNN computes exactly the op's windows (every position they read is data or zero
// padding in both views); otherwise the input must be padded explicitly. `p` is valid (MakeConv2D checked it).
bool NeedsExplicitPadding(const Conv2DParams& p);

// ---- broadcasting Binary ops: the shape is simplified (size-1 dimensions dropped, neighbours that are contiguous
// in the output and both inputs merged), and each input's gradient is planned as a fixed-order reduction over the
// dimensions it is broadcast along (op_math.h, ReduceShape).

// InvalidArgument for a rank outside [1, kMaxBroadcastRank], a dimension below 1 or a negative stride.
absl::StatusOr<BroadcastShape> MakeBroadcastShape(const BroadcastParams& p);

// The reduction giving the gradient of input `which` (0: a, 1: b) of `s`, split with SplitReduction.
ReduceShape MakeReduceShape(const BroadcastShape& s, int which);
// The kernel's shape of a strided copy: SimplifyStridedCopy(p) (p checked by CheckStridedCopyParams).
CopyShape MakeCopyShape(const StridedCopyParams& p);

// Whether distinct elements of input `which`'s own (non-broadcast) index space land on distinct offsets, so
// that each gradient element is written by exactly one thread. False for overlapping strides.
bool ReduceTargetsAreDistinct(const ReduceShape& r);

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_KERNEL_SHAPES_H_
