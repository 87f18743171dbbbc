// The tensor ops of imported graphs beyond the layers (kernels/device.h makes them): general strided copies
// (transposes, slices, concatenations, broadcasts), reductions over one group of axes, softmax along an axis,
// layer normalization and batched products of two matrices. Their semantics hold for every backend; the CPU
// backend (kernels/cpu) is the oracle of the CUDA one (kernels/cuda), and kernels/reference_ops.h has plain
// loops for both.
//
// Shapes are plain row-major views the caller (worker/models/graph_network.cc) derives from a tensor's storage:
// an axis, or a group of adjacent axes, is one (size, stride) pair. All pointers are device pointers; the ops
// made by Make* are shape-specialized (made once, reused every step) and never allocate afterwards.
//
// Thread-safety: as for every Device op, one thread (the Device's owner) at a time.
#ifndef DTRAIN_KERNELS_TENSOR_OPS_H_
#define DTRAIN_KERNELS_TENSOR_OPS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace dtrain::kernels {

// ---- strided copies (Device::StridedCopy) ----
inline constexpr int kMaxCopyRank = 8;
// Copies every element of an index space of `rank` dims: dst[sum_k i_k dst_strides[k]] = (or +=)
// src[sum_k i_k src_strides[k]] for 0 <= i_k < dims[k]. A source stride may be 0 (the element repeats: a
// broadcast); the destination's must address each element once (no 0 stride on a dim > 1, no overlap), and
// source and destination must not overlap. Dims of 0 copy nothing.
//   Transpose [a, b] -> [b, a]: dims {b, a}, src_strides {1, b}, dst_strides {a, 1}.
//   Slice x[:, 2:5] of [n, 8]:  src = x + 2, dims {n, 3}, src_strides {8, 1}, dst_strides {3, 1}.
struct StridedCopyParams {
  int rank = 1;
  int64_t dims[kMaxCopyRank] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t src_strides[kMaxCopyRank] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t dst_strides[kMaxCopyRank] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t count() const;  // product of dims
  // Elements of src (dst) the copy spans: the largest offset a stride reaches + 1 (0 when count() is 0).
  int64_t src_span() const;
  int64_t dst_span() const;
};
// InvalidArgument naming `op` unless 1 <= rank <= kMaxCopyRank, dims >= 0, strides >= 0 and the destination's
// strides address distinct elements (a dim > 1 has a nonzero stride, and the dims sorted by stride nest).
absl::Status CheckStridedCopyParams(const char* op, const StridedCopyParams& p);
// The same copy with size-1 dims dropped and neighbours that are contiguous in both source and destination
// merged (the form backends run; never rank 0: at least {1} with strides {0}/{1}).
StridedCopyParams SimplifyStridedCopy(const StridedCopyParams& p);

// ---- reductions (Device::MakeReduce) ----
enum class ReduceKind { kSum, kMean, kMax };
// x viewed as [outer, reduce, inner] (row-major) reduced over its middle axis into y [outer, inner]. Reductions
// over several axes are either one group of adjacent axes (reduce = their product) or chained ops.
struct ReduceParams {
  ReduceKind kind = ReduceKind::kSum;
  int64_t outer = 1, reduce = 1, inner = 1;
};
class Reduce {
 public:
  virtual ~Reduce() = default;
  // y = sum / mean / max of each group. Max remembers, for Backward, the first position of each maximum.
  virtual absl::Status Forward(const float* x, float* y) = 0;
  // dx (outer * reduce * inner, overwritten) from dy (outer * inner): sum: dy repeated; mean: dy / reduce;
  // max: dy at the last Forward's maximum of each group, 0 elsewhere.
  virtual absl::Status Backward(const float* dy, float* dx) = 0;
};

// ---- softmax (Device::MakeSoftmax) ----
// Softmax (or log-softmax) of x viewed as [outer, n, inner] along its middle axis, as ONNX's Softmax /
// LogSoftmax (opset 13) and PyTorch's softmax(dim).
struct SoftmaxParams {
  int64_t outer = 1, n = 1, inner = 1;
  bool log = false;
};
class Softmax {
 public:
  virtual ~Softmax() = default;
  virtual absl::Status Forward(const float* x, float* y) = 0;
  // dx (overwritten) from the forward's output y: softmax: y (dy - sum(dy y)); log: dy - exp(y) sum(dy).
  // dx may alias dy.
  virtual absl::Status Backward(const float* y, const float* dy, float* dx) = 0;
};

// ---- layer normalization (Device::MakeLayerNorm) ----
// Each row of x [rows, cols] normalized: y = (x - mean) / sqrt(var + epsilon) * scale + bias, the biased
// variance over the row's cols elements; scale and bias are [cols] (bias null without has_bias). ONNX
// LayerNormalization (opset 17) and PyTorch's layer_norm over the trailing axes (the pattern older exports
// emit: ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add).
struct LayerNormParams {
  int64_t rows = 0, cols = 0;
  float epsilon = 1e-5f;
  bool has_bias = true;
};
class LayerNorm {
 public:
  virtual ~LayerNorm() = default;
  // Writes each row's mean and (biased) variance (rows floats each) for Backward.
  virtual absl::Status Forward(const float* x, const float* scale, const float* bias, float* y, float* mean,
                               float* var) = 0;
  // dx, dscale, dbias overwritten (dbias ignored without has_bias); x, mean, var those of the last Forward.
  virtual absl::Status Backward(const float* x, const float* dy, const float* scale, const float* mean,
                                const float* var, float* dx, float* dscale, float* dbias) = 0;
};

// ---- batched matrix products of two tensors (Device::MakeMatMul) ----
// y[b] = op(a[b]) op(b[b]) for b < batch: op(a) is [m, k] (a stored [batch, m, k], or [batch, k, m] when
// trans_a), op(b) is [k, n] (stored [batch, k, n], or [batch, n, k] when trans_b); y is [batch, m, n]. All
// dense row-major. ONNX MatMul of two activations (attention's q k^T and softmax(.) v).
struct MatMulParams {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
};
class MatMul {
 public:
  virtual ~MatMul() = default;
  virtual absl::Status Forward(const float* a, const float* b, float* y) = 0;
  // da (a's layout) = dy op(b)^T; db (b's layout) = op(a)^T dy. Both overwritten. `a` and `b` must be the last
  // Forward's; with bf16 compute (kernels/device.h, ComputeDtype) the op reads its own rounded copies of them, and
  // the two backward calls after a Forward share one rounding of dy (the same values behind it).
  virtual absl::Status BackwardA(const float* dy, const float* b, float* da) = 0;
  virtual absl::Status BackwardB(const float* a, const float* dy, float* db) = 0;
};

// What every backend requires of the params (InvalidArgument naming `op` and the shape otherwise).
absl::Status CheckReduceParams(const char* op, const ReduceParams& p);
absl::Status CheckSoftmaxParams(const char* op, const SoftmaxParams& p);
absl::Status CheckLayerNormParams(const char* op, const LayerNormParams& p);
absl::Status CheckMatMulParams(const char* op, const MatMulParams& p);
// "reduce[sum 4x49x96]"-style descriptions for messages.
std::string Describe(const StridedCopyParams& p);
std::string Describe(const ReduceParams& p);
std::string Describe(const SoftmaxParams& p);
std::string Describe(const LayerNormParams& p);
std::string Describe(const MatMulParams& p);

}  // namespace dtrain::kernels

#endif  // DTRAIN_KERNELS_TENSOR_OPS_H_
