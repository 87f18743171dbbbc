// Naive reference implementations of every op in kernels/device.h, with the semantics the header documents
// (TensorFlow's for the built-in models' ops, ONNX's / PyTorch's for the params of imported graphs). They are
// the oracle in the tests of both backends: plain loops over host memory in the logical layouts (NHWC, HWIO or
// OIHW, [in, out] or [out, in]), accumulating in double, written for obviousness rather than speed. Do not use
// them in training.
//
// All functions are pure (they read their inputs and overwrite their outputs), so they are thread-safe.
// Shapes come from the same *Params structs the devices take; pointers must hold at least the sizes the
// shapes imply.
#ifndef DTRAIN_KERNELS_REFERENCE_OPS_H_
#define DTRAIN_KERNELS_REFERENCE_OPS_H_

#include <cstdint>

#include "kernels/device.h"

namespace dtrain::kernels::reference {

// y = conv(x, w) + b: every Conv2DParams field (TensorFlow SAME/VALID or explicit pads, strides, dilations,
// groups, HWIO or OIHW filters; b and db may be null without has_bias).
void Conv2DForward(const Conv2DParams& p, const float* x, const float* w, const float* b, float* y);
// dx = dL/dx given dy = dL/dy.
void Conv2DBackwardData(const Conv2DParams& p, const float* dy, const float* w, float* dx);
// dw = dL/dw (in p.weight_layout), db = dL/db.
void Conv2DBackwardWeights(const Conv2DParams& p, const float* x, const float* dy, float* dw, float* db);

// Max pooling (every PoolParams field); padded positions never win. The backward routes each dy to the first
// maximal input of its window (row-major window order), as TensorFlow does.
void MaxPoolForward(const PoolParams& p, const float* x, float* y);
void MaxPoolBackward(const PoolParams& p, const float* x, const float* dy, float* dx);

// Average pooling: each output is the sum of its window's inputs divided by the count of real inputs in it
// (count_include_pad = false), or by the window's size clipped to the explicit padding (count_include_pad =
// true: positions of the ceil_mode overhang never count, PyTorch's rule).
void AvgPoolForward(const PoolParams& p, const float* x, float* y);
void AvgPoolBackward(const PoolParams& p, const float* dy, float* dx);

// tf.nn.lrn and its gradient.
void LrnForward(const LrnParams& p, const float* x, float* y);
void LrnBackward(const LrnParams& p, const float* x, const float* dy, float* dx);

// y = alpha x w + beta b; dx = alpha dy w^T; dw = alpha x^T dy (in w's layout: [in, out], or [out, in] when
// weights_transposed); db = beta * column sums of dy. b and db may be null without has_bias.
void DenseForward(const DenseParams& p, const float* x, const float* w, const float* b, float* y);
void DenseBackwardData(const DenseParams& p, const float* dy, const float* w, float* dx);
void DenseBackwardWeights(const DenseParams& p, const float* x, const float* dy, float* dw, float* db);

void Relu(const float* x, float* y, int64_t n);
void ReluBackward(const float* y, const float* dy, float* dx, int64_t n);

// Mean softmax cross-entropy; labels are class indices stored as floats. Returns the mean loss and writes
// dlogits = (softmax - onehot) / batch.
double SoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes, float* dlogits);

// sum(x^2) / 2.
double L2Loss(const float* x, int64_t n);

// The dropout mask of kernels/dropout_rng.h, computed one element at a time.
void DropoutMask(int64_t n, float keep_prob, uint64_t seed, uint64_t counter, float* mask);

// ---- ops of imported graphs and sparse models (reference_graph_ops.cc) ----

// BatchNorm over [count = batch * spatial, channels]. Training: writes the batch mean and biased variance.
void BatchNormForwardTraining(const BatchNormParams& p, const float* x, const float* scale, const float* bias,
                              float* y, float* batch_mean, float* batch_var);
void BatchNormForwardInference(const BatchNormParams& p, const float* x, const float* scale, const float* bias,
                               const float* mean, const float* var, float* y);
// Gradients of BatchNormForwardTraining (the batch statistics depend on x).
void BatchNormBackward(const BatchNormParams& p, const float* x, const float* dy, const float* scale,
                       const float* batch_mean, const float* batch_var, float* dx, float* dscale, float* dbias);

// y = a op b with BroadcastParams addressing; y is dense [dims].
void BinaryForward(const BroadcastParams& p, const float* a, const float* b, float* y);
// da (a_size() floats) and db (b_size()), either may be null: every element overwritten, the sum over the
// output elements that read it of dy * d(a op b)/d(that input); zero for an element no output reads.
void BinaryBackward(const BroadcastParams& p, const float* a, const float* b, const float* dy, float* da,
                    float* db);

void Activation(const ActivationParams& p, const float* x, float* y, int64_t n);
// dx = dy * f'(x) (x and y the forward's input and output).
void ActivationBackward(const ActivationParams& p, const float* x, const float* y, const float* dy, float* dx,
                        int64_t n);

void CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows, int64_t cols,
                 bool accumulate);
// y[b][c][r] = x[b][r][c].
void Transpose(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols);
void BatchNormRunningDelta(const float* running_mean, const float* running_var, const float* batch_mean,
                           const float* batch_var, int channels, int64_t count, float momentum, bool unbiased,
                           float* d_mean, float* d_var);

// Embedding lookups (GatherParams; indices and offsets as int32 arrays, assumed valid) and the backward,
// which adds into dtable.
void Gather(const GatherParams& p, const float* table, const int32_t* indices, const int32_t* offsets, float* y);
void GatherBackward(const GatherParams& p, const float* dy, const int32_t* indices, const int32_t* offsets,
                    float* dtable);

// DLRM interaction: y[b] = z_i . z_j for i > j in row-major lower-triangle order; dx overwritten.
void Interaction(const InteractionParams& p, const float* x, float* y);
void InteractionBackward(const InteractionParams& p, const float* x, const float* dy, float* dx);

// Mean sigmoid cross-entropy of `batch` logits against 0/1 labels; writes dlogits = (sigmoid(z) - t) / batch
// and returns the mean loss.
double SigmoidCrossEntropy(const float* logits, const float* labels, int batch, float* dlogits);

// ---- tensor ops of imported graphs (kernels/tensor_ops.h; reference_tensor_ops.cc) ----
void StridedCopy(const StridedCopyParams& p, const float* src, float* dst, bool accumulate);
void ReduceForward(const ReduceParams& p, const float* x, float* y);
// Max routes dy to the first maximum of each group of x (the forward's input).
void ReduceBackward(const ReduceParams& p, const float* x, const float* dy, float* dx);
void SoftmaxForward(const SoftmaxParams& p, const float* x, float* y);
void SoftmaxBackward(const SoftmaxParams& p, const float* y, const float* dy, float* dx);
// mean and var (biased) may be null.
void LayerNormForward(const LayerNormParams& p, const float* x, const float* scale, const float* bias, float* y,
                      float* mean, float* var);
// dbias ignored without has_bias.
void LayerNormBackward(const LayerNormParams& p, const float* x, const float* dy, const float* scale, float* dx,
                       float* dscale, float* dbias);
void MatMulForward(const MatMulParams& p, const float* a, const float* b, float* y);
void MatMulBackwardA(const MatMulParams& p, const float* dy, const float* b, float* da);
void MatMulBackwardB(const MatMulParams& p, const float* a, const float* dy, float* db);

}  // namespace dtrain::kernels::reference

#endif  // DTRAIN_KERNELS_REFERENCE_OPS_H_
