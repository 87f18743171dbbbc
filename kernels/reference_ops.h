// Naive reference implementations of every op in kernels/device.h, with TensorFlow semantics. They are the
// oracle in the tests of both backends: plain loops over host memory in the logical layouts (NHWC, HWIO,
// [in, out]), accumulating in double, written for obviousness rather than speed. Do not use them in training.
//
// All functions are pure (they read their inputs and overwrite their outputs), so they are thread-safe.
// Shapes come from the same *Params structs the devices take; pointers must hold at least the sizes the
// shapes imply.
#ifndef DTRAIN_KERNELS_REFERENCE_OPS_H_
#define DTRAIN_KERNELS_REFERENCE_OPS_H_

#include <cstdint>

#include "kernels/device.h"

namespace dtrain::kernels::reference {

// y = conv(x, w) + b (TensorFlow SAME/VALID, strides).
void Conv2DForward(const Conv2DParams& p, const float* x, const float* w, const float* b, float* y);
// dx = dL/dx given dy = dL/dy.
void Conv2DBackwardData(const Conv2DParams& p, const float* dy, const float* w, float* dx);
// dw = dL/dw, db = dL/db.
void Conv2DBackwardWeights(const Conv2DParams& p, const float* x, const float* dy, float* dw, float* db);

// Max pooling; padded positions never win. The backward routes each dy to the first maximal input of its
// window (row-major window order), as TensorFlow does.
void MaxPoolForward(const PoolParams& p, const float* x, float* y);
void MaxPoolBackward(const PoolParams& p, const float* x, const float* dy, float* dx);

// tf.nn.lrn and its gradient.
void LrnForward(const LrnParams& p, const float* x, float* y);
void LrnBackward(const LrnParams& p, const float* x, const float* dy, float* dx);

// y = x w + b; dx = dy w^T; dw = x^T dy; db = column sums of dy.
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

}  // namespace dtrain::kernels::reference

#endif  // DTRAIN_KERNELS_REFERENCE_OPS_H_
