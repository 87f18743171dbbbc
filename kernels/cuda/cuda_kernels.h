// Launchers for dtrain's own CUDA kernels (elementwise.cu, loss.cu, layout.cu, pool_lrn.cu, broadcast.cu,
// batch_norm.cu, embedding.cu, interaction.cu, tensor_ops.cu). Each enqueues its kernel(s) on `stream` and returns
// cudaGetLastError(); callers turn that into an absl::Status naming the op (cuda_status.h). No launcher
// allocates, synchronizes or reads memory on the host, so all of them can be captured into a CUDA graph. The
// caller has made the stream's device current. Pointers are device pointers; n/sizes are element counts. The
// per-element math lives in op_math.h.
//
// Kept free of Abseil so that the .cu files compile with nvcc alone.
// Thread-safety: launchers are stateless; concurrent calls on different streams are fine.
#ifndef DTRAIN_KERNELS_CUDA_CUDA_KERNELS_H_
#define DTRAIN_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/op_math.h"
#include "kernels/optimizer_math.h"

namespace dtrain::kernels::cuda {

// ---- elementwise.cu ----
cudaError_t LaunchRelu(const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchReluBackward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream);
// mask[i] = DropoutUniform(DropoutKey(seed, counter), i) < keep_prob ? 1.0f / keep_prob : 0; y = x * mask,
// with the RNG of kernels/dropout_rng.h (shared with the CPU backend). 0 < keep_prob <= 1.
cudaError_t LaunchDropout(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                          uint64_t counter, cudaStream_t stream);
// LaunchDropout with counter = DropoutCounterFrom(*device_counter, counter_stride, counter_offset), the
// counter read by the kernel (each block computes the key), so a replayed graph sees the counter's current
// value.
cudaError_t LaunchDropoutDeviceCounter(const float* x, float* y, float* mask, int64_t n, float keep_prob,
                                       uint64_t seed, const int64_t* device_counter, uint64_t counter_stride,
                                       uint64_t counter_offset, cudaStream_t stream);
// out[i] = a[i] * b[i] (DropoutBackward).
cudaError_t LaunchMultiply(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
// y[r, c] += bias[c] for a row-major [rows, channels] tensor.
cudaError_t LaunchBiasAdd(float* y, const float* bias, int64_t rows, int channels, cudaStream_t stream);
// y[r, c] += scale * bias[c] (Dense's beta).
cudaError_t LaunchScaledBiasAdd(float* y, const float* bias, float scale, int64_t rows, int channels,
                                cudaStream_t stream);
// y = f(x) and dx = dy * f'(x) (op_math.h's ActivationValue / ActivationGrad); in place allowed.
cudaError_t LaunchActivation(const ActivationArgs& a, const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchActivationBackward(const ActivationArgs& a, const float* x, const float* y, const float* dy,
                                     float* dx, int64_t n, cudaStream_t stream);
// dst[r * dst_stride + c] = (or +=) src[r * src_stride + c] for a rows x cols block.
cudaError_t LaunchCopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                              int64_t cols, bool accumulate, cudaStream_t stream);
// d_mean = momentum (running_mean - batch_mean), d_var = momentum (running_var - batch_var * var_factor).
cudaError_t LaunchBatchNormRunningDelta(const float* running_mean, const float* running_var,
                                        const float* batch_mean, const float* batch_var, int channels,
                                        float momentum, float var_factor, float* d_mean, float* d_var,
                                        cudaStream_t stream);
cudaError_t LaunchAxpy(float a, const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchScale(float a, const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchFill(float value, float* x, int64_t n, cudaStream_t stream);
// slots[*counter mod num_slots] = *src, as a one-thread kernel (the counter read when it runs; capturable).
cudaError_t LaunchCopyToCounterSlot(const float* src, float* slots, int64_t num_slots, const int64_t* counter,
                                    cudaStream_t stream);

// ---- loss.cu ----
// Errors found in device data by a kernel, written to host-mapped pinned memory (so the host reads them after
// a synchronization without a copy). Only the first error is kept: a kernel writes only while code == kNone.
// The host clears `code` after reporting.
struct DeviceErrorInfo {
  enum Code : int32_t {
    kNone = 0,
    kBadLabel = 1,          // SoftmaxCrossEntropy: a label that is not a class index
    kBadBinaryLabel = 2,    // SigmoidCrossEntropy: a label other than 0 or 1
    kBadGatherIndex = 3,    // Gather / GatherBackward: an index outside the table
    kBadGatherOffsets = 4,  // Gather / GatherBackward: a bag whose offsets are not an ascending range
  };
  int32_t code;
  int32_t row;      // kBadLabel, kBadBinaryLabel: first bad row
  float label;      // kBadLabel, kBadBinaryLabel: its label
  int32_t classes;  // kBadLabel: the class count
  int32_t backward;  // kBadGather*: 1 when GatherBackward found it, 0 for Gather
  int32_t unused;
  int64_t position;  // kBadGatherIndex: the first bad lookup; kBadGatherOffsets: the first bad bag
  int64_t value;     // kBadGatherIndex: its index; kBadGatherOffsets: offsets[bag]
  int64_t value2;    // kBadGatherOffsets: offsets[bag + 1]
  int64_t bound;     // kBadGatherIndex: the table's rows; kBadGatherOffsets: the lookup count
};
// One block computes the whole batch (rows are small in this project: batch <= a few hundred, classes <= a
// few thousand). labels hold class indices as floats; an out-of-range label makes the loss and that row's
// dlogits NaN and records kBadLabel (first bad row) in *error (the device view of a DeviceErrorInfo in mapped
// memory).
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes,
                                      float* dlogits, float* loss, DeviceErrorInfo* error,
                                      cudaStream_t stream);
// Mean sigmoid cross-entropy of `batch` logits (one block, fixed-order reduction): dlogits = (sigmoid(z) - t) /
// batch. A label other than 0 or 1 makes the loss and that row's dlogit NaN and records kBadBinaryLabel (first
// bad row) in *error.
cudaError_t LaunchSigmoidCrossEntropy(const float* logits, const float* labels, int batch, float* dlogits,
                                      float* loss, DeviceErrorInfo* error, cudaStream_t stream);
// Number of partial sums L2Loss needs as scratch.
constexpr int kL2LossPartials = 256;
// *out = sum(x^2) / 2, in two deterministic passes through `partials` (kL2LossPartials floats).
cudaError_t LaunchL2Loss(const float* x, int64_t n, float* partials, float* out, cudaStream_t stream);

// ---- optimizer.cu ----
// One update of n elements with p's optimizer (kernels/optimizer_math.h: UpdateElement, the CPU's arithmetic) at
// step *step (read by every block when the kernel runs, with the per-step scalars), with the moving average
// (num_updates = *step + 1) fused when shadow != nullptr. slot0..slot2 as p.num_slots() says (else unused).
// With p.clip_norm > 0 the gradient is also scaled by ClipFactor(p.clip_norm, sqrt(*norm_sq)), read when the
// kernel runs (norm_sq: the step's sum of squares, LaunchNormAdd).
cudaError_t LaunchOptimizerApply(const OptimizerParams& p, const int64_t* step, const double* norm_sq,
                                 float grad_scale, const float* grad, float* var, float* slot0, float* slot1,
                                 float* slot2, float* shadow, int64_t n, cudaStream_t stream);
// Partial sums (doubles) LaunchNormAdd uses as scratch.
constexpr int kNormPartials = 256;
// *norm_sq = 0.
cudaError_t LaunchNormClear(double* norm_sq, cudaStream_t stream);
// *norm_sq += sum(x[i]^2) * grad_scale^2, in double, in two fixed-order passes through `partials`
// (kNormPartials doubles): the same bits on every run.
cudaError_t LaunchNormAdd(const float* x, int64_t n, float grad_scale, double* partials, double* norm_sq,
                          cudaStream_t stream);
// *counter = value / *counter += 1, as one-thread kernels (ordered with the stream's work, capturable).
cudaError_t LaunchCounterSet(int64_t* counter, int64_t value, cudaStream_t stream);
cudaError_t LaunchCounterIncrement(int64_t* counter, cudaStream_t stream);

// ---- layout.cu ----
// out[c, r] = in[r, c] for a row-major [rows, cols] matrix (HWIO <-> OHWI filters are such a transpose).
cudaError_t LaunchTranspose2D(const float* in, float* out, int rows, int cols, cudaStream_t stream);
// The same for each of `batch` consecutive matrices: out[b][c][r] = in[b][r][c] (OIHW <-> KRSC filters,
// Device::Transpose).
cudaError_t LaunchBatchedTranspose(const float* in, float* out, int64_t batch, int rows, int cols,
                                   cudaStream_t stream);
// Zero-pads NHWC x [n, h, w, c] into [n, h + pad_top + pad_bottom, w + pad_left + pad_right, c].
cudaError_t LaunchPadNhwc(const float* x, float* padded, int n, int h, int w, int c, int pad_top, int pad_left,
                          int padded_h, int padded_w, cudaStream_t stream);
// The inverse window: x[n, h, w, c] = padded[n, h + pad_top, w + pad_left, c].
cudaError_t LaunchCropNhwc(const float* padded, float* x, int n, int h, int w, int c, int pad_top, int pad_left,
                           int padded_h, int padded_w, cudaStream_t stream);

// ---- pool_lrn.cu (PoolShape: op_math.h) ----
// NHWC max pooling over the in-bounds part of each window (padding never wins, as in TensorFlow); the first
// maximum wins ties. argmax[o] = flat index into x of the winner.
cudaError_t LaunchMaxPoolForward(const float* x, float* y, int32_t* argmax, const PoolShape& s,
                                 cudaStream_t stream);
// dx[i] = sum of dy[o] over outputs o whose argmax is i (a gather: deterministic, no atomics).
cudaError_t LaunchMaxPoolBackward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& s,
                                  cudaStream_t stream);
// NHWC average pooling (op_math.h's AvgPoolOutput) and its gradient (a gather over the covering windows:
// deterministic, no atomics).
cudaError_t LaunchAvgPoolForward(const float* x, float* y, const PoolShape& s, cudaStream_t stream);
cudaError_t LaunchAvgPoolBackward(const float* dy, float* dx, const PoolShape& s, cudaStream_t stream);
struct LrnShape {
  int64_t pixels;  // batch * h * w
  int channels, depth_radius;
  float bias, alpha, beta;
};
// TensorFlow LRN across the contiguous channel dimension of NHWC data.
cudaError_t LaunchLrnForward(const float* x, float* y, const LrnShape& s, cudaStream_t stream);
// dx = dy * s^-beta - 2 alpha beta x * sum_{j in window} dy_j y_j / s_j, s = bias + alpha * window sum of x^2.
// `scratch` holds 2 * pixels * channels floats.
cudaError_t LaunchLrnBackward(const float* x, const float* y, const float* dy, float* dx, float* scratch,
                              const LrnShape& s, cudaStream_t stream);

// ---- broadcast.cu ----
// y[o] = a[a_off(o)] op b[b_off(o)] over the output (y dense; may alias an input of the same layout).
cudaError_t LaunchBinaryForward(int op, const BroadcastShape& s, const float* a, const float* b, float* y,
                                cudaStream_t stream);
// The gradient of input r.which, overwriting each of its elements the output reaches (the caller zeroes the
// rest): one fixed-order partial sum per (element, chunk) into `partial` (r.chunks * r.kept_count doubles,
// unused when r.chunks == 1), then the chunks in order. Deterministic.
cudaError_t LaunchBinaryBackward(int op, const ReduceShape& r, const float* a, const float* b, const float* dy,
                                 double* partial, float* dx, cudaStream_t stream);

// ---- batch_norm.cu (fixed-order reductions: deterministic) ----
// Per-channel batch mean and biased variance of x [rows, channels]. `partial`: 2 * chunks * channels doubles.
cudaError_t LaunchBatchNormStats(const float* x, const ColumnShape& s, double* partial, float* mean, float* var,
                                 cudaStream_t stream);
// y = (x - mean) / sqrt(var + epsilon) * scale + bias.
cudaError_t LaunchBatchNormApply(const float* x, const float* scale, const float* bias, const float* mean,
                                 const float* var, float epsilon, int64_t rows, int channels, float* y,
                                 cudaStream_t stream);
// dbias = sum dy, dscale = sum dy xhat (per channel), then dx. `partial` as for the stats.
cudaError_t LaunchBatchNormBackward(const float* x, const float* dy, const float* scale, const float* mean,
                                    const float* var, float epsilon, const ColumnShape& s, double* partial,
                                    float* dx, float* dscale, float* dbias, cudaStream_t stream);

// ---- embedding.cu, interaction.cu ----
// Gather (GatherShape: op_math.h). An index outside the table or a bad bag makes the affected rows of y NaN;
// the first bad lookup / bag is recorded in *error (Gather's code, backward = 0) by a one-thread kernel that
// runs after the gather and reads `first_bad` (2 unsigned 64-bit words of device memory holding all ones
// between calls: lookup, bag), which it resets.
cudaError_t LaunchGather(const GatherShape& s, const float* table, const int32_t* indices, const int32_t* offsets,
                         float* y, unsigned long long* first_bad, DeviceErrorInfo* error, cudaStream_t stream);
// dtable[index, :] += dy rows (bags: the bag's dy row, divided by its size for mean) with atomicAdd: rows
// looked up several times sum in a nondeterministic order. Bad indices / bags are skipped and recorded (backward
// = 1) as in LaunchGather.
cudaError_t LaunchGatherBackward(const GatherShape& s, const float* dy, const int32_t* indices,
                                 const int32_t* offsets, float* dtable, unsigned long long* first_bad,
                                 DeviceErrorInfo* error, cudaStream_t stream);
// DLRM interaction of x [batch, features, dim] into y [batch, features (features - 1) / 2], and its gradient
// (dx overwritten). One block per example; the example's features (and dy row) are staged in shared memory
// when they fit. Fixed-order sums: deterministic.
cudaError_t LaunchInteraction(const float* x, float* y, int batch, int features, int dim, cudaStream_t stream);
cudaError_t LaunchInteractionBackward(const float* x, const float* dy, float* dx, int batch, int features, int dim,
                                      cudaStream_t stream);

// ---- tensor_ops.cu (the tensor ops of imported graphs, kernels/tensor_ops.h; shapes in op_math.h) ----
// The strided copy `s` describes (count = product of its dims): dst = (or +=) src, one thread per destination
// element (src strides may be 0: a broadcast; destination elements distinct).
cudaError_t LaunchStridedCopy(const CopyShape& s, const float* src, float* dst, int64_t count, bool accumulate,
                              cudaStream_t stream);
// y [outer, inner] = sum / mean / max of x [outer, reduce, inner] over its middle axis; kReduceMax writes the
// first maximum's r to argmax (outer * inner int32; unused otherwise). Fixed-order sums: deterministic.
cudaError_t LaunchReduceForward(const ReduceDims& s, const float* x, float* y, int32_t* argmax, cudaStream_t stream);
// dx (overwritten, every element) from dy and, for kReduceMax, the argmax of the last forward.
cudaError_t LaunchReduceBackward(const ReduceDims& s, const float* dy, const int32_t* argmax, float* dx,
                                 cudaStream_t stream);
// Softmax (log: log-softmax) of x [outer, n, inner] along its middle axis, and its backward from the forward's
// output y (dx may alias dy). One warp per row when inner == 1, else one thread per column.
cudaError_t LaunchSoftmaxForward(const float* x, float* y, int64_t outer, int64_t n, int64_t inner, bool log,
                                 cudaStream_t stream);
cudaError_t LaunchSoftmaxBackward(const float* y, const float* dy, float* dx, int64_t outer, int64_t n,
                                  int64_t inner, bool log, cudaStream_t stream);
// Layer normalization of x [rows, cols] (one warp per row): y = xhat * scale + bias (bias may be null: none);
// each row's mean and biased variance to mean / var (either may be null: not written).
cudaError_t LaunchLayerNormForward(const float* x, const float* scale, const float* bias, float epsilon,
                                   int64_t rows, int64_t cols, float* y, float* mean, float* var,
                                   cudaStream_t stream);
// Its gradients from the forward's mean and var: dscale and dbias (may be null: no bias) as fixed-order column
// reductions over `s` (channels = cols, chunks from SplitReduction(cols, rows)) through `partial` (2 * chunks *
// cols doubles of scratch), then dx (may alias dy) one warp per row.
cudaError_t LaunchLayerNormBackward(const float* x, const float* dy, const float* scale, const float* mean,
                                    const float* var, float epsilon, const ColumnShape& s, double* partial,
                                    float* dx, float* dscale, float* dbias, cudaStream_t stream);

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_CUDA_KERNELS_H_
