// Device-neutral op interface. A `Device` is one tower's compute context: its memory, its stream (oneDNN
// stream on the CPU, a cudaStream_t on a GPU) and a factory for shape-specialized ops. The CPU backend
// (kernels/cpu, oneDNN) is always built and is the oracle for the CUDA backend (kernels/cuda).
//
// Conventions (every backend):
// - All float tensors are fp32, logical layout NHWC for activations, HWIO ([kh, kw, in_c, out_c]) for conv
//   filters (TensorFlow's layout), [in, out] for dense weights. A backend may keep private layouts inside an op
//   (e.g. oneDNN's blocked weights), but every pointer crossing this interface is in the logical layout.
// - Pointers are device pointers obtained from Device::Alloc (host memory for the CPU backend). Ops never
//   allocate on the hot path: all scratch is allocated when the op is made.
// - Ops are shape-specialized: made once per shape (batch size included) and reused every step.
// - Work is enqueued on the device's stream in call order; Device::Synchronize() waits for it. Results are
//   visible to the host only after CopyToHost (which synchronizes).
// - Errors a device can raise (launch failures, out of memory) come back as absl::Status naming the op.
//
// Thread-safety: a Device and the ops it made belong to one thread (one tower) at a time. Different Devices
// may be used concurrently from different threads.
//
// Example (one dense layer forward):
//   ASSIGN_OR_RETURN(std::unique_ptr<Device> dev, CreateDevice(DeviceSpec::Cpu(/*threads=*/1)));
//   ASSIGN_OR_RETURN(auto dense, dev->MakeDense({.batch = 50, .in = 784, .out = 500}));
//   float* x = dev->Alloc(50 * 784); ...
//   RETURN_IF_ERROR(dense->Forward(x, w, b, y));
#ifndef DTRAIN_KERNELS_DEVICE_H_
#define DTRAIN_KERNELS_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dtrain::kernels {

enum class Padding { kSame, kValid };  // TensorFlow's meaning of SAME / VALID.

// Output spatial size for one dimension, TensorFlow's rule.
//   SAME: ceil(in / stride); VALID: ceil((in - k + 1) / stride).
int OutputSize(int in, int k, int stride, Padding padding);
// Padding before the first element for SAME (TensorFlow puts the extra one after); 0 for VALID.
int PadBefore(int in, int k, int stride, Padding padding);

struct Conv2DParams {
  int batch = 0, in_h = 0, in_w = 0, in_c = 0;
  int out_c = 0, k_h = 0, k_w = 0;
  int stride_h = 1, stride_w = 1;
  Padding padding = Padding::kSame;
  int out_h() const { return OutputSize(in_h, k_h, stride_h, padding); }
  int out_w() const { return OutputSize(in_w, k_w, stride_w, padding); }
};

// 2-D convolution with bias: y = conv(x, w) + b.
//   x: [batch, in_h, in_w, in_c]  w: [k_h, k_w, in_c, out_c]  b: [out_c]  y: [batch, out_h, out_w, out_c]
class Conv2D {
 public:
  virtual ~Conv2D() = default;
  virtual absl::Status Forward(const float* x, const float* w, const float* b, float* y) = 0;
  // dx = conv_transpose(dy, w). `w` must be the filter passed to the last Forward (backends may reuse their
  // reordered copy of it).
  virtual absl::Status BackwardData(const float* dy, const float* w, float* dx) = 0;
  // dw, db are overwritten (not accumulated). `x` is the input of the last Forward.
  virtual absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) = 0;
};

struct PoolParams {
  int batch = 0, in_h = 0, in_w = 0, channels = 0;
  int window = 2, stride = 2;
  Padding padding = Padding::kSame;
  int out_h() const { return OutputSize(in_h, window, stride, padding); }
  int out_w() const { return OutputSize(in_w, window, stride, padding); }
};

// Max pooling, NHWC. Padded positions never win (as in TensorFlow).
class MaxPool {
 public:
  virtual ~MaxPool() = default;
  // Remembers what it needs (e.g. argmax workspace) for the next Backward.
  virtual absl::Status Forward(const float* x, float* y) = 0;
  // dx is overwritten. Must follow the Forward of the same example batch.
  virtual absl::Status Backward(const float* dy, float* dx) = 0;
};

struct LrnParams {
  int batch = 0, h = 0, w = 0, channels = 0;
  int depth_radius = 4;  // TensorFlow's depth_radius: window = 2 * depth_radius + 1 channels.
  float bias = 1.0f;
  float alpha = 0.001f / 9.0f;  // TensorFlow's alpha: multiplies the plain sum of squares (not divided by size).
  float beta = 0.75f;
};

// Local response normalization across channels, TensorFlow's tf.nn.lrn semantics:
//   y = x / (bias + alpha * sum_{c' in window} x[c']^2) ^ beta
class Lrn {
 public:
  virtual ~Lrn() = default;
  virtual absl::Status Forward(const float* x, float* y) = 0;
  // dx overwritten; x, y are the last Forward's input and output.
  virtual absl::Status Backward(const float* x, const float* y, const float* dy, float* dx) = 0;
};

struct DenseParams {
  int batch = 0, in = 0, out = 0;
};

// Inner product with bias: y = x w + b.  x: [batch, in]  w: [in, out]  b: [out]  y: [batch, out]
class Dense {
 public:
  virtual ~Dense() = default;
  virtual absl::Status Forward(const float* x, const float* w, const float* b, float* y) = 0;
  // dx = dy w^T (overwritten). May be skipped for the first layer.
  virtual absl::Status BackwardData(const float* dy, const float* w, float* dx) = 0;
  // dw = x^T dy, db = sum_batch dy (both overwritten).
  virtual absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) = 0;
};

// Where a Device runs. `threads` is the number of CPU threads its ops may use (CPU backend).
struct DeviceSpec {
  enum class Kind { kCpu, kGpu };
  Kind kind = Kind::kCpu;
  int gpu_index = 0;
  int threads = 1;
  static DeviceSpec Cpu(int threads) { return {Kind::kCpu, 0, threads}; }
  static DeviceSpec Gpu(int index) { return {Kind::kGpu, index, 1}; }
  std::string ToString() const;  // "cpu" or "gpu:N"
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // e.g. "cpu" or "gpu:0"
  virtual const DeviceSpec& spec() const = 0;

  // ---- memory ----
  // Returns device memory for n floats (64-byte aligned on the CPU), or an error (out of memory).
  // Memory is owned by the device and lives until Free or until the Device is destroyed.
  virtual absl::StatusOr<float*> Alloc(int64_t n) = 0;
  virtual void Free(float* p) = 0;
  // Copies. CopyToHost synchronizes the stream before returning. CopyToDevice may be asynchronous with
  // respect to the host only if `host` is pinned memory from AllocHostPinned.
  virtual absl::Status CopyToDevice(const float* host, float* dev, int64_t n) = 0;
  virtual absl::Status CopyToHost(const float* dev, float* host, int64_t n) = 0;
  virtual absl::Status CopyOnDevice(const float* src, float* dst, int64_t n) = 0;
  // Host memory suitable for fast transfers (pinned on GPUs, plain aligned memory on the CPU).
  virtual absl::StatusOr<float*> AllocHostPinned(int64_t n) = 0;
  virtual void FreeHostPinned(float* p) = 0;
  virtual absl::Status Synchronize() = 0;

  // ---- shape-specialized ops ----
  virtual absl::StatusOr<std::unique_ptr<Conv2D>> MakeConv2D(const Conv2DParams& p) = 0;
  virtual absl::StatusOr<std::unique_ptr<MaxPool>> MakeMaxPool(const PoolParams& p) = 0;
  virtual absl::StatusOr<std::unique_ptr<Lrn>> MakeLrn(const LrnParams& p) = 0;
  virtual absl::StatusOr<std::unique_ptr<Dense>> MakeDense(const DenseParams& p) = 0;

  // ---- stateless elementwise / reduction ops (n = number of floats) ----
  virtual absl::Status Relu(const float* x, float* y, int64_t n) = 0;  // in place allowed (x == y)
  // dx = dy * (y > 0); y is the ReLU output. In place allowed (dy == dx).
  virtual absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n) = 0;
  // Inverted dropout: mask[i] = (u < keep_prob) / keep_prob with u uniform from a counter-based RNG keyed by
  // (seed, counter, i), so the same (seed, counter) gives the same mask on every backend.
  // y = x * mask. keep_prob == 1 copies x and fills mask with 1.
  virtual absl::Status Dropout(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                               uint64_t counter) = 0;
  // dx = dy * mask (in place allowed).
  virtual absl::Status DropoutBackward(const float* dy, const float* mask, float* dx, int64_t n) = 0;
  // Mean softmax cross-entropy over the batch. `labels` holds class indices as floats (exact below 2^24), on
  // the device, so that one buffer type serves every tensor.
  //   dlogits = (softmax(logits) - onehot(labels)) / batch;  *loss (device scalar) = mean loss.
  virtual absl::Status SoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes,
                                           float* dlogits, float* loss) = 0;
  // *out (device scalar) = sum(x^2) / 2, TensorFlow's tf.nn.l2_loss.
  virtual absl::Status L2Loss(const float* x, int64_t n, float* out) = 0;
  // y = a * x + y.
  virtual absl::Status Axpy(float a, const float* x, float* y, int64_t n) = 0;
  // y = a * x (in place allowed).
  virtual absl::Status Scale(float a, const float* x, float* y, int64_t n) = 0;
  virtual absl::Status Fill(float value, float* x, int64_t n) = 0;
};

// Backend factories (kernels/cpu, kernels/cuda). Prefer CreateDevice, which dispatches on spec.kind.
absl::StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const DeviceSpec& spec);

// Makes a Device. Errors: InvalidArgument for a bad spec; FailedPrecondition "no CUDA device available: ..."
// when a GPU is asked for and none is usable (or the CUDA backend was not built).
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceSpec& spec);

// Number of usable CUDA devices; 0 when the CUDA backend is not built or no GPU/driver is present.
int CudaDeviceCount();

}  // namespace dtrain::kernels

#endif  // DTRAIN_KERNELS_DEVICE_H_
