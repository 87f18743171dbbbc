// Launchers for dtrain's own CUDA kernels (elementwise.cu, loss.cu, layout.cu, pool_lrn.cu). Each enqueues its
// kernel(s) on `stream` and returns cudaGetLastError(); callers turn that into an absl::Status naming the op
// (cuda_status.h). No launcher allocates, synchronizes or reads memory on the host. The caller has made the
// stream's device current. Pointers are device pointers; n/sizes are element counts.
//
// Kept free of Abseil so that the .cu files compile with nvcc alone.
// Thread-safety: launchers are stateless; concurrent calls on different streams are fine.
#ifndef DTRAIN_KERNELS_CUDA_CUDA_KERNELS_H_
#define DTRAIN_KERNELS_CUDA_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dtrain::kernels::cuda {

// ---- elementwise.cu ----
cudaError_t LaunchRelu(const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchReluBackward(const float* y, const float* dy, float* dx, int64_t n, cudaStream_t stream);
// mask[i] = DropoutUniform(DropoutKey(seed, counter), i) < keep_prob ? 1.0f / keep_prob : 0; y = x * mask, with
// the RNG of kernels/cpu/dropout_rng.h (shared with the CPU backend). 0 < keep_prob <= 1.
cudaError_t LaunchDropout(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                          uint64_t counter, cudaStream_t stream);
// out[i] = a[i] * b[i] (DropoutBackward).
cudaError_t LaunchMultiply(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
// y[r, c] += bias[c] for a row-major [rows, channels] tensor.
cudaError_t LaunchBiasAdd(float* y, const float* bias, int64_t rows, int channels, cudaStream_t stream);
cudaError_t LaunchAxpy(float a, const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchScale(float a, const float* x, float* y, int64_t n, cudaStream_t stream);
cudaError_t LaunchFill(float value, float* x, int64_t n, cudaStream_t stream);

// ---- loss.cu ----
// One block computes the whole batch (rows are small in this project: batch <= a few hundred, classes <= a few
// thousand). labels hold class indices as floats; an out-of-range label makes that row's loss NaN.
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes,
                                      float* dlogits, float* loss, cudaStream_t stream);
// Number of partial sums L2Loss needs as scratch.
constexpr int kL2LossPartials = 256;
// *out = sum(x^2) / 2, in two deterministic passes through `partials` (kL2LossPartials floats).
cudaError_t LaunchL2Loss(const float* x, int64_t n, float* partials, float* out, cudaStream_t stream);

// ---- layout.cu ----
// out[c, r] = in[r, c] for a row-major [rows, cols] matrix (HWIO <-> OHWI filters are such a transpose).
cudaError_t LaunchTranspose2D(const float* in, float* out, int rows, int cols, cudaStream_t stream);
// Zero-pads NHWC x [n, h, w, c] into [n, h + pad_top + pad_bottom, w + pad_left + pad_right, c].
cudaError_t LaunchPadNhwc(const float* x, float* padded, int n, int h, int w, int c, int pad_top, int pad_left,
                          int padded_h, int padded_w, cudaStream_t stream);
// The inverse window: x[n, h, w, c] = padded[n, h + pad_top, w + pad_left, c].
cudaError_t LaunchCropNhwc(const float* padded, float* x, int n, int h, int w, int c, int pad_top, int pad_left,
                           int padded_h, int padded_w, cudaStream_t stream);

// ---- pool_lrn.cu ----
struct PoolShape {
  int batch, in_h, in_w, channels, out_h, out_w, window, stride, pad_top, pad_left;
};
// NHWC max pooling over the in-bounds part of each window (padding never wins, as in TensorFlow); the first
// maximum wins ties. argmax[o] = flat index into x of the winner.
cudaError_t LaunchMaxPoolForward(const float* x, float* y, int32_t* argmax, const PoolShape& s,
                                 cudaStream_t stream);
// dx[i] = sum of dy[o] over outputs o whose argmax is i (a gather: deterministic, no atomics).
cudaError_t LaunchMaxPoolBackward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& s,
                                  cudaStream_t stream);
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

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_CUDA_KERNELS_H_
