// Device-neutral op interface. A `Device` is one tower's compute context: its memory, its queues (a oneDNN
// stream on the CPU; a compute and a copy cudaStream_t on a GPU) and a factory for shape-specialized ops. The
// CPU backend (kernels/cpu, oneDNN) is always built and is the oracle for the CUDA backend (kernels/cuda).
//
// Conventions (every backend):
// - All float tensors are fp32, logical layout NHWC for activations, HWIO ([kh, kw, in_c, out_c]) for conv
//   filters (TensorFlow's layout), [in, out] for dense weights. A backend may keep private layouts inside an
//   op (e.g. oneDNN's blocked weights), but every pointer crossing this interface is in the logical layout.
// - Pointers are device pointers obtained from Device::Alloc (host memory for the CPU backend). Ops never
//   allocate, synchronize with the host or choose algorithms on the hot path: all scratch and workspace is
//   allocated, and every algorithm (cuDNN's included) chosen, when the op is made.
// - Ops are shape-specialized: made once per shape (batch size included) and reused every step.
// - Work is enqueued on the device's compute queue in call order; Device::Synchronize() waits for it. Results
//   are visible to the host after CopyToHost (which synchronizes) or after an event recorded behind an
//   asynchronous copy has completed (see "Asynchronous execution" below).
// - Errors a device can raise (launch failures, out of memory) come back as absl::Status naming the op.
// - Errors in *device data* (today: an out-of-range label in SoftmaxCrossEntropy) are InvalidArgument with
//   the same message on every backend. The CPU backend returns it from the op itself; a GPU cannot know it
//   without stalling, so its kernel records it in the device and the first synchronizing call that returns
//   after the kernel ran (CopyToHost, Synchronize, SynchronizeEvent, a true QueryEvent, DeviceCounter::Read)
//   reports it, once. The op's outputs are then undefined (NaN on the GPU).
//
// Asynchronous execution (a step without host stalls; CUDA Graphs):
// - Two queues: Queue::kCompute (every op) and Queue::kCopy (for asynchronous copies that should overlap
//   compute). Events order them on the device without blocking the host: RecordEvent(e, q) marks the work
//   enqueued on q so far; WaitEvent(e, q2) makes later work on q2 wait for it; SynchronizeEvent(e) blocks the
//   host until it is done.
// - CopyToDeviceAsync / CopyToHostAsync need pinned host memory (AllocHostPinned); they return at once. Read
//   or reuse the host buffer only after an event recorded behind the copy has completed.
//   kernels/async_readback.h wraps this for reading the loss at logging steps.
// - WaitEvent also takes an event of another Device of the same backend (towers on several GPUs, or two
//   towers sharing one): work enqueued afterwards waits for that device's work the event marks.
// - DeviceCounter: an int64 in device memory that ops read when they run (the optimizer's step, dropout's
//   counter), so a captured graph replayed after Increment() sees the new value.
// - BeginCapture / EndCapture record everything enqueued on the compute queue (and on the copy queue, once it
//   has waited on an event recorded on the compute queue during the capture; it must be joined back by an
//   event before EndCapture) into a Graph, replayed by Graph::Launch() at the cost of one launch. During a
//   capture, calls that synchronize with the host or allocate (CopyToHost, CopyToDevice, Synchronize,
//   SynchronizeEvent, QueryEvent, Alloc, Free, Make*, DeviceCounter::Read) return FailedPrecondition instead
//   of breaking the capture. An event recorded during a capture only orders work inside the graph: to wait
//   for a replay, record an event after Graph::Launch. Run the step once eagerly before capturing it
//   (libraries load their kernels lazily). The CPU backend runs ops eagerly and cannot capture: BeginCapture
//   returns Unimplemented with the reason, so callers fall back to eager steps.
// - BeginCaptureGroup / EndCaptureGroup (below) capture one step spread over several Devices (towers): the
//   first device's compute queue starts the capture, the others' join it by an event (fork) and are joined
//   back by events (join) before it ends; the graph launches on the first device's compute queue.
//
// Thread-safety: a Device and the ops, events, counters and graphs it made belong to one thread (one tower)
// at a time. Different Devices may be used concurrently from different threads.
//
// Example (one dense layer forward):
//   ASSIGN_OR_RETURN(std::unique_ptr<Device> dev, CreateDevice(DeviceSpec::Cpu(/*threads=*/1)));
//   ASSIGN_OR_RETURN(auto dense, dev->MakeDense({.batch = 50, .in = 784, .out = 500}));
//   float* x = dev->Alloc(50 * 784); ...
//   RETURN_IF_ERROR(dense->Forward(x, w, b, y));
//
// Example (a captured step, replayed with new dropout masks and optimizer steps):
//   ASSIGN_OR_RETURN(auto step, dev->MakeCounter(0));
//   RunStepEagerly();                                 // warm-up: loads kernels, step -> 1
//   if (absl::Status s = dev->BeginCapture(); s.ok()) {
//     RETURN_IF_ERROR(EnqueueStep());                 // forward, backward, optimizer, step->Increment()
//     ASSIGN_OR_RETURN(graph, dev->EndCapture());
//   } else {
//     LOG(INFO) << "no CUDA graph: " << s;           // CPU: Unimplemented, with the reason
//   }
//   for (...) RETURN_IF_ERROR(graph ? graph->Launch() : EnqueueStep());
#ifndef DTRAIN_KERNELS_DEVICE_H_
#define DTRAIN_KERNELS_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer_ops.h"
#include "kernels/tensor_ops.h"

namespace dtrain::kernels {

class Device;

enum class Padding { kSame, kValid };  // TensorFlow's meaning of SAME / VALID.

// Output spatial size for one dimension, TensorFlow's rule.
//   SAME: ceil(in / stride); VALID: ceil((in - k + 1) / stride).
int OutputSize(int in, int k, int stride, Padding padding);
// Padding before the first element for SAME (TensorFlow puts the extra one after); 0 for VALID.
int PadBefore(int in, int k, int stride, Padding padding);

// Layout of a convolution's filter: TensorFlow's [k_h, k_w, in_c / groups, out_c] (the built-in models) or
// ONNX's / PyTorch's [out_c, in_c / groups, k_h, k_w] (imported models keep their own layout, so that the
// variables on the ps are the file's tensors).
enum class WeightLayout { kHWIO, kOIHW };

// Padding of one spatial dimension, resolved: elements added before and after the data.
struct Pads {
  int before = 0, after = 0;
};

struct Conv2DParams {
  int batch = 0, in_h = 0, in_w = 0, in_c = 0;
  int out_c = 0, k_h = 0, k_w = 0;
  int stride_h = 1, stride_w = 1;
  Padding padding = Padding::kSame;  // TensorFlow's rule; ignored when explicit_padding
  // ONNX / PyTorch: explicit (possibly asymmetric) zero padding instead of `padding`.
  bool explicit_padding = false;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int dilation_h = 1, dilation_w = 1;
  // Grouped convolution: in_c and out_c are multiples of groups; group g maps input channels
  // [g * in_c / groups, (g + 1) * in_c / groups) to output channels [g * out_c / groups, ...). groups == in_c
  // == out_c is a depthwise convolution.
  int groups = 1;
  WeightLayout weight_layout = WeightLayout::kHWIO;
  bool has_bias = true;  // false: b (and db) may be null; no bias is added

  int dilated_k_h() const { return (k_h - 1) * dilation_h + 1; }
  int dilated_k_w() const { return (k_w - 1) * dilation_w + 1; }
  Pads pads_h() const;  // explicit pads, or TensorFlow's SAME/VALID for the dilated kernel
  Pads pads_w() const;
  int out_h() const;    // floor((in + before + after - dilated_k) / stride) + 1
  int out_w() const;
  int64_t weights_size() const { return static_cast<int64_t>(k_h) * k_w * (in_c / groups) * out_c; }
};

// 2-D convolution with bias: y = conv(x, w) + b (cross-correlation, as every framework).
//   x: [batch, in_h, in_w, in_c]  w: HWIO [k_h, k_w, in_c/groups, out_c] or OIHW [out_c, in_c/groups, k_h, k_w]
//   b: [out_c] (or null without has_bias)  y: [batch, out_h, out_w, out_c]
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
  int window = 2, stride = 2;  // square window and stride (TensorFlow style); see window_h/w below
  Padding padding = Padding::kSame;  // ignored when explicit_padding
  // ONNX / PyTorch: rectangular windows and strides (0 = `window` / `stride`), explicit asymmetric padding,
  // ceil_mode (the output size rounds up; a window that would start in the right padding is dropped, as in
  // PyTorch) and, for average pooling, whether padded positions count in the divisor. Explicit pads must be
  // in [0, window) on each side, so that every window holds an input element (PyTorch allows at most half the
  // window); MakeMaxPool / MakeAvgPool return InvalidArgument otherwise.
  int window_h = 0, window_w = 0, stride_h = 0, stride_w = 0;
  bool explicit_padding = false;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  bool ceil_mode = false;
  bool count_include_pad = false;  // AvgPool: divide by the whole window (padding included) instead of the
                                   // count of real input elements in it. Positions past the explicit padding
                                   // (ceil_mode overhang) never count.

  int kh() const { return window_h > 0 ? window_h : window; }
  int kw() const { return window_w > 0 ? window_w : window; }
  int sh() const { return stride_h > 0 ? stride_h : stride; }
  int sw() const { return stride_w > 0 ? stride_w : stride; }
  // The padding as given (explicit) or TensorFlow's; `after` does not include the ceil_mode overhang.
  Pads pads_h() const;
  Pads pads_w() const;
  int out_h() const;
  int out_w() const;
  // Padding after the data that windows actually reach: pads_h().after plus the ceil_mode overhang.
  int effective_pad_bottom() const;
  int effective_pad_right() const;
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

// Average pooling, NHWC (ONNX AveragePool / GlobalAveragePool, TensorFlow's avg_pool with VALID/SAME: SAME
// divides by the real elements, i.e. count_include_pad = false).
class AvgPool {
 public:
  virtual ~AvgPool() = default;
  virtual absl::Status Forward(const float* x, float* y) = 0;
  // dx is overwritten.
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
  // ONNX Gemm: w stored [out, in] (transB = 1, PyTorch's Linear) instead of [in, out]; y = alpha x w + beta b.
  bool weights_transposed = false;
  bool has_bias = true;  // false: b and db may be null
  float alpha = 1.0f, beta = 1.0f;
};

// Inner product with bias: y = alpha x w + beta b.  x: [batch, in]  w: [in, out] (or [out, in] when
// weights_transposed)  b: [out]  y: [batch, out]
class Dense {
 public:
  virtual ~Dense() = default;
  virtual absl::Status Forward(const float* x, const float* w, const float* b, float* y) = 0;
  // dx = alpha dy w^T (overwritten). May be skipped for the first layer. `w` must be the last Forward's (with
  // bf16 compute the op reads its own rounded copy of it).
  virtual absl::Status BackwardData(const float* dy, const float* w, float* dx) = 0;
  // dw = alpha x^T dy (in w's layout), db = beta * sum_batch dy (both overwritten; db ignored without bias).
  // `x` must be the last Forward's; with bf16 compute the two backward calls after a Forward share one rounding
  // of dy, so they must see the same values behind it.
  virtual absl::Status BackwardWeights(const float* x, const float* dy, float* dw, float* db) = 0;
};

// Batch normalization over the channels of an NHWC tensor viewed as [batch * spatial, channels] (spatial = h *
// w; 1 for a [batch, channels] tensor), ONNX BatchNormalization / PyTorch BatchNorm1d/2d.
struct BatchNormParams {
  int batch = 0;
  int64_t spatial = 1;
  int channels = 0;
  float epsilon = 1e-5f;
};

class BatchNorm {
 public:
  virtual ~BatchNorm() = default;
  // Training: y = scale * (x - mean) / sqrt(var + epsilon) + bias with the batch's per-channel mean and biased
  // variance (over batch * spatial elements), which are written to batch_mean and batch_var (channels floats
  // each) for Backward and for the running statistics.
  virtual absl::Status ForwardTraining(const float* x, const float* scale, const float* bias, float* y,
                                       float* batch_mean, float* batch_var) = 0;
  // Inference: the same with the given (running) mean and variance.
  virtual absl::Status ForwardInference(const float* x, const float* scale, const float* bias, const float* mean,
                                        const float* var, float* y) = 0;
  // Gradients of ForwardTraining (x, batch_mean, batch_var are its input and outputs); all overwritten.
  virtual absl::Status Backward(const float* x, const float* dy, const float* scale, const float* batch_mean,
                                const float* batch_var, float* dx, float* dscale, float* dbias) = 0;
};

// Elementwise binary ops with numpy (ONNX) broadcasting, on tensors in their stored layout: the output has up to
// kMaxBroadcastRank dimensions (outermost first, the last one contiguous); each input is addressed with a stride
// per output dimension, 0 where it is broadcast. E.g. an NHWC tensor plus a per-channel bias:
//   dims = {batch * h * w, c}, a_strides = {c, 1}, b_strides = {0, 1}.
inline constexpr int kMaxBroadcastRank = 5;
enum class BinaryOp { kAdd, kSub, kMul, kDiv };
struct BroadcastParams {
  BinaryOp op = BinaryOp::kAdd;
  int rank = 1;
  int64_t dims[kMaxBroadcastRank] = {0, 0, 0, 0, 0};
  int64_t a_strides[kMaxBroadcastRank] = {0, 0, 0, 0, 0};
  int64_t b_strides[kMaxBroadcastRank] = {0, 0, 0, 0, 0};
  int64_t out_size() const;
  // Elements of a (b): the largest offset a stride reaches + 1.
  int64_t a_size() const;
  int64_t b_size() const;
};

class Binary {
 public:
  virtual ~Binary() = default;
  // y = a op b (y may alias a or b when it has the same size and strides).
  virtual absl::Status Forward(const float* a, const float* b, float* y) = 0;
  // da = sum over a's broadcast dimensions of dy * d(a op b)/da, db likewise; either may be null (not needed).
  // Both are overwritten. a and b are the forward's inputs (only read by Mul/Div).
  virtual absl::Status Backward(const float* a, const float* b, const float* dy, float* da, float* db) = 0;
};

// Elementwise activations beyond ReLU (kernels with no state). Gradients at the kinks are PyTorch's.
struct ActivationParams {
  enum class Kind {
    kLeakyRelu,    // y = x < 0 ? alpha x : x; slope alpha at 0
    kClip,         // y = min(max(x, lo), hi); gradient 1 strictly inside, 0 outside
    kSigmoid,      // y = 1 / (1 + exp(-x))
    kTanh,
    kHardSigmoid,  // y = max(0, min(1, alpha x + beta)) (ONNX's alpha 0.2, PyTorch's 1/6 and beta 0.5);
                   // gradient alpha strictly inside (0, 1)
    kHardSwish,    // y = x max(0, min(1, x / 6 + 1 / 2)); gradient 0 below -3, x / 3 + 1 / 2 up to 3, 1 above
    kGelu,         // y = x / 2 (1 + erf(x / sqrt 2)) (the exact GELU; ONNX exports it as Div, Erf, Add, Mul, Mul)
    kSilu,         // y = x sigmoid(x) (SiLU / swish; exported as Sigmoid and Mul)
    kErf,          // y = erf(x)
    kSqrt,         // y = sqrt(x)
    kPow,          // y = x ^ exponent (gradient exponent x ^ (exponent - 1))
  };
  Kind kind = Kind::kSigmoid;
  float alpha = 0.01f;             // kLeakyRelu's slope; kHardSigmoid's alpha
  float lo = 0.0f, hi = 6.0f;      // kClip
  float beta = 0.5f;               // kHardSigmoid
  float exponent = 2.0f;           // kPow
};
const char* ActivationName(ActivationParams::Kind kind);

// An embedding table's rows gathered by index: y[i, :] = table[index[i], :]. Indices are int32 row numbers in
// a buffer of the device (Alloc'd floats reinterpreted: one int32 per float), so that a step's lookups need no
// host round trip.
struct GatherParams {
  int64_t rows = 0;   // rows of the table
  int dim = 0;        // floats per row
  int64_t count = 0;  // lookups (y has count rows)
  // Bags (EmbeddingBag): when num_bags > 0, y has num_bags rows and y[b, :] = combine(table[index[j], :] for j in
  // [offsets[b], offsets[b + 1])), offsets being num_bags + 1 int32 in a device buffer like the indices
  // (offsets[num_bags] == count). An empty bag gives zeros.
  int64_t num_bags = 0;
  bool mean = false;  // bags: average instead of sum
};

// DLRM's pairwise dot-product interaction: for each example, the f feature vectors z[k] (dim floats each; x is
// [batch, f, dim]) give the f (f - 1) / 2 dot products z[i] . z[j], i > j, in row-major lower-triangle order
// (i = 1..f-1, j = 0..i-1): y is [batch, f (f - 1) / 2].
struct InteractionParams {
  int batch = 0, features = 0, dim = 0;
  int64_t outputs() const { return static_cast<int64_t>(features) * (features - 1) / 2; }
};
// What every backend requires of InteractionParams (kernels/shape.cc): InvalidArgument naming `op` otherwise.
absl::Status CheckInteractionParams(const char* op, const InteractionParams& p);

// The two queues of a Device. The CPU backend has one in-order queue: both names run there, synchronously.
enum class Queue { kCompute, kCopy };

// An event for ordering a Device's queues (Device::MakeEvent). Opaque; belongs to the Device that made it.
class Event {
 public:
  virtual ~Event() = default;
  virtual const Device* device() const = 0;
};

// A recorded sequence of work (Device::EndCapture), replayed on the device's compute queue. The buffers, ops
// and counters it used must stay alive (and keep their addresses) while it may be launched. Destroy it before
// its Device.
class Graph {
 public:
  virtual ~Graph() = default;
  // Enqueues one replay on the compute queue and returns at once.
  virtual absl::Status Launch() = 0;
  virtual const Device* device() const = 0;
};

// An int64 in device memory (host memory on the CPU backend), read by ops when they run (see the header
// comment).
class DeviceCounter {
 public:
  virtual ~DeviceCounter() = default;
  virtual const Device* device() const = 0;
  // The value's address in device memory, for ops of the same device.
  virtual const int64_t* device_ptr() const = 0;
  // Enqueued on the compute queue, ordered with ops (both are small kernels on a GPU, so capturable).
  virtual absl::Status Set(int64_t value) = 0;
  virtual absl::Status Increment() = 0;
  // Synchronizes the compute queue and returns the value (FailedPrecondition during a capture).
  virtual absl::StatusOr<int64_t> Read() = 0;
};

// What a Device's matrix products (convolutions, Dense, MatMul) compute in. kBf16 is mixed precision: inside the
// op the operands (activations, weights, incoming gradients) are rounded to bfloat16 (to nearest even) and the
// products accumulate in fp32; the op's outputs (y, dx, dw, db) are fp32, as is every pointer crossing this
// interface, and every other op (pooling, normalization, elementwise, softmax, the loss, the optimizer) computes
// in fp32. Parameters are therefore fp32 everywhere outside the products (the master weights). An op the backend
// has no bf16 path for computes in fp32 and Device::PrecisionReport says which and why.
enum class ComputeDtype { kFp32, kBf16 };
// "fp32" | "bf16"; InvalidArgument naming the value otherwise.
absl::StatusOr<ComputeDtype> ParseComputeDtype(const std::string& name);
const char* ComputeDtypeName(ComputeDtype dtype);

// Where a Device runs. `threads` is the number of CPU threads its ops may use (CPU backend).
struct DeviceSpec {
  enum class Kind { kCpu, kGpu };
  Kind kind = Kind::kCpu;
  int gpu_index = 0;
  int threads = 1;
  ComputeDtype compute_dtype = ComputeDtype::kFp32;
  static DeviceSpec Cpu(int threads, ComputeDtype dtype = ComputeDtype::kFp32) {
    return {Kind::kCpu, 0, threads, dtype};
  }
  static DeviceSpec Gpu(int index, ComputeDtype dtype = ComputeDtype::kFp32) { return {Kind::kGpu, index, 1, dtype}; }
  std::string ToString() const;  // "cpu" or "gpu:N"
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;  // e.g. "cpu" or "gpu:0"
  virtual const DeviceSpec& spec() const = 0;
  // With bf16 compute (spec().compute_dtype): one line saying which ops made so far compute in bf16 and on which
  // kernels (the library's implementation names, e.g. oneDNN's "brg:avx512_core_bf16", with the CPU's
  // instruction set), and which fell back to fp32 and why. Empty with fp32 compute.
  virtual std::string PrecisionReport() const { return ""; }

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
  // Waits for both queues; reports device-data errors (see the header comment).
  virtual absl::Status Synchronize() = 0;

  // ---- asynchronous execution (see the header comment) ----
  // Copies n floats on queue q and returns at once. `host` must be pinned memory from AllocHostPinned of this
  // device (any address inside such a buffer; InvalidArgument otherwise on a GPU). Capturable.
  virtual absl::Status CopyToDeviceAsync(const float* host, float* dev, int64_t n, Queue q) = 0;
  virtual absl::Status CopyToHostAsync(const float* dev, float* host, int64_t n, Queue q) = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> MakeEvent() = 0;
  // InvalidArgument for an event of another device.
  virtual absl::Status RecordEvent(Event* event, Queue q) = 0;
  // `event` may belong to another Device of the same backend (cross-device ordering); InvalidArgument for one
  // of another backend or null.
  virtual absl::Status WaitEvent(const Event* event, Queue q) = 0;
  // Blocks the host until the work the event marks has run (an event never recorded counts as done).
  virtual absl::Status SynchronizeEvent(Event* event) = 0;
  // Whether that work has run, without blocking.
  virtual absl::StatusOr<bool> QueryEvent(Event* event) = 0;
  // A counter holding `initial`.
  virtual absl::StatusOr<std::unique_ptr<DeviceCounter>> MakeCounter(int64_t initial) = 0;
  // Graph capture of the compute queue. BeginCapture: Unimplemented on a backend without graphs (the CPU),
  // with the reason; FailedPrecondition when already capturing. EndCapture: FailedPrecondition without a
  // capture, or when something enqueued during the capture could not be captured (the message says what CUDA
  // reported); the device leaves capture mode either way and stays usable.
  virtual absl::Status BeginCapture() = 0;
  virtual absl::StatusOr<std::unique_ptr<Graph>> EndCapture() = 0;

  // ---- shape-specialized ops ----
  virtual absl::StatusOr<std::unique_ptr<Conv2D>> MakeConv2D(const Conv2DParams& p) = 0;
  virtual absl::StatusOr<std::unique_ptr<MaxPool>> MakeMaxPool(const PoolParams& p) = 0;
  virtual absl::StatusOr<std::unique_ptr<Lrn>> MakeLrn(const LrnParams& p) = 0;
  virtual absl::StatusOr<std::unique_ptr<Dense>> MakeDense(const DenseParams& p) = 0;
  // The ops of imported (ONNX) graphs and sparse models. A backend that lacks one returns Unimplemented naming
  // it (the base class's default), so a model that needs it fails when it is built, never mid-step.
  virtual absl::StatusOr<std::unique_ptr<AvgPool>> MakeAvgPool(const PoolParams& p);
  virtual absl::StatusOr<std::unique_ptr<BatchNorm>> MakeBatchNorm(const BatchNormParams& p);
  virtual absl::StatusOr<std::unique_ptr<Binary>> MakeBinary(const BroadcastParams& p);
  // The device-resident optimizer (kernels/optimizer_ops.h), reading the step being applied from `step` (a
  // counter of this device, which must outlive the optimizer). InvalidArgument for bad params or a foreign
  // counter.
  virtual absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeOptimizer(const OptimizerParams& p,
                                                                         const DeviceCounter* step) = 0;

  // ---- stateless elementwise / reduction ops (n = number of floats) ----
  virtual absl::Status Relu(const float* x, float* y, int64_t n) = 0;  // in place allowed (x == y)
  // dx = dy * (y > 0); y is the ReLU output. In place allowed (dy == dx).
  virtual absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n) = 0;
  // Inverted dropout: mask[i] = (u < keep_prob) / keep_prob with u uniform from a counter-based RNG keyed by
  // (seed, counter, i), so the same (seed, counter) gives the same mask on every backend.
  // y = x * mask. keep_prob == 1 copies x and fills mask with 1.
  virtual absl::Status Dropout(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                               uint64_t counter) = 0;
  // Dropout(x, y, mask, n, keep_prob, seed, counter) with counter = uint64(*device_counter) * counter_stride
  // + counter_offset, read from device memory when the op runs (kernels/dropout_rng.h): the same mask bit for
  // bit, and a captured graph replayed after device_counter->Increment() draws a new one. InvalidArgument for
  // a counter of another device.
  virtual absl::Status DropoutDeviceCounter(const float* x, float* y, float* mask, int64_t n, float keep_prob,
                                            uint64_t seed, const DeviceCounter& device_counter,
                                            uint64_t counter_stride, uint64_t counter_offset) = 0;
  // dx = dy * mask (in place allowed).
  virtual absl::Status DropoutBackward(const float* dy, const float* mask, float* dx, int64_t n) = 0;
  // slots[k] = *src with k = *counter mod num_slots, the counter read when the op runs (one float, e.g. a
  // step's loss into a ring of recent losses that the host reads back every few steps). Capturable: a graph
  // replayed after counter->Increment() writes the next slot. InvalidArgument for num_slots < 1 or a counter
  // of another device.
  virtual absl::Status CopyToCounterSlot(const float* src, float* slots, int64_t num_slots,
                                         const DeviceCounter& counter) = 0;
  // Mean softmax cross-entropy over the batch. `labels` holds class indices as floats (exact below 2^24), on
  // the device, so that one buffer type serves every tensor.
  //   dlogits = (softmax(logits) - onehot(labels)) / batch;  *loss (device scalar) = mean loss.
  // A label that is not an integer in [0, classes) is InvalidArgument "SoftmaxCrossEntropy: label L of row R
  // is not a class index in [0, C)" on every backend: from this call on the CPU, from the next synchronizing
  // call on a GPU (see the header comment).
  virtual absl::Status SoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes,
                                           float* dlogits, float* loss) = 0;
  // *out (device scalar) = sum(x^2) / 2, TensorFlow's tf.nn.l2_loss.
  virtual absl::Status L2Loss(const float* x, int64_t n, float* out) = 0;
  // y = a * x + y.
  virtual absl::Status Axpy(float a, const float* x, float* y, int64_t n) = 0;
  // y = a * x (in place allowed).
  virtual absl::Status Scale(float a, const float* x, float* y, int64_t n) = 0;
  virtual absl::Status Fill(float value, float* x, int64_t n) = 0;

  // ---- ops of imported graphs and sparse models (default: Unimplemented naming the op) ----
  // y = f(x) for an activation other than ReLU (in place allowed).
  virtual absl::Status Activation(const ActivationParams& p, const float* x, float* y, int64_t n);
  // dx = dy * f'(x), from the forward's input x and output y (in place allowed: dx == dy).
  virtual absl::Status ActivationBackward(const ActivationParams& p, const float* x, const float* y,
                                          const float* dy, float* dx, int64_t n);
  // A block of rows x cols floats: dst[r * dst_stride + c] = src[r * src_stride + c] (accumulate: +=). Concat
  // along the last stored dimension, and its backward (the split).
  virtual absl::Status CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                                   int64_t rows, int64_t cols, bool accumulate);
  // Per batch entry, a [rows, cols] row-major matrix transposed into [cols, rows]: y[b][c][r] = x[b][r][c]
  // (NHWC -> NCHW order for an ONNX Flatten, and back in its backward).
  virtual absl::Status Transpose(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols);
  // The running-statistics update of BatchNorm in training mode (PyTorch's convention: momentum is the weight of
  // the new batch statistics, ONNX's is 1 minus it), expressed as the change a parameter server applies by
  // subtracting it ("gradient" of a non-trainable variable):
  //   d_mean = momentum * (running_mean - batch_mean)
  //   d_var  = momentum * (running_var - batch_var * (unbiased ? count / (count - 1) : 1))
  // so that running - d = (1 - momentum) running + momentum batch. channels floats each.
  virtual absl::Status BatchNormRunningDelta(const float* running_mean, const float* running_var,
                                             const float* batch_mean, const float* batch_var, int channels,
                                             int64_t count, float momentum, bool unbiased, float* d_mean,
                                             float* d_var);
  // Embedding lookups (GatherParams): y = gathered (or combined) rows. Bad data is InvalidArgument, reported as
  // SoftmaxCrossEntropy reports its bad labels: "Gather: index I of lookup L is not a row in [0, ROWS)", or for
  // bags (offsets must ascend from 0 to count) "Gather: bag B has offsets [A, B'), not an ascending range in
  // [0, COUNT]" (GatherBackward likewise).
  virtual absl::Status Gather(const GatherParams& p, const float* table, const int32_t* indices,
                              const int32_t* offsets, float* y);
  // The backward of Gather: dtable[index[i], :] += dy[i, :] (bags: the bag's row of dy, / bag size for mean).
  // dtable is NOT zeroed first (the caller zeroes the rows it will read).
  virtual absl::Status GatherBackward(const GatherParams& p, const float* dy, const int32_t* indices,
                                      const int32_t* offsets, float* dtable);
  // DLRM interaction (InteractionParams) and its backward (dx overwritten).
  virtual absl::Status Interaction(const InteractionParams& p, const float* x, float* y);
  virtual absl::Status InteractionBackward(const InteractionParams& p, const float* x, const float* dy, float* dx);
  // ---- tensor ops of imported graphs (kernels/tensor_ops.h; default: Unimplemented naming the op) ----
  // The strided copy StridedCopyParams describes (accumulate: dst +=). InvalidArgument for bad params.
  virtual absl::Status StridedCopy(const StridedCopyParams& p, const float* src, float* dst, bool accumulate);
  virtual absl::StatusOr<std::unique_ptr<Reduce>> MakeReduce(const ReduceParams& p);
  virtual absl::StatusOr<std::unique_ptr<Softmax>> MakeSoftmax(const SoftmaxParams& p);
  virtual absl::StatusOr<std::unique_ptr<LayerNorm>> MakeLayerNorm(const LayerNormParams& p);
  virtual absl::StatusOr<std::unique_ptr<MatMul>> MakeMatMul(const MatMulParams& p);

  // Mean sigmoid cross-entropy of batch logits against labels in {0, 1} (floats):
  //   loss = mean(max(z, 0) - z * t + log(1 + exp(-|z|))),  dlogits = (sigmoid(z) - t) / batch.
  // A label other than 0 or 1 is InvalidArgument "SigmoidCrossEntropy: label L of row R is not 0 or 1", reported
  // as SoftmaxCrossEntropy reports its bad labels.
  virtual absl::Status SigmoidCrossEntropy(const float* logits, const float* labels, int batch, float* dlogits,
                                           float* loss);
};

// Backend factories (kernels/cpu, kernels/cuda). Prefer CreateDevice, which dispatches on spec.kind.
absl::StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const DeviceSpec& spec);

// Makes a Device. Errors: InvalidArgument for a bad spec; FailedPrecondition "no CUDA device available: ..."
// when a GPU is asked for and none is usable (or the CUDA backend was not built).
absl::StatusOr<std::unique_ptr<Device>> CreateDevice(const DeviceSpec& spec);

// Number of usable CUDA devices; 0 when the CUDA backend is not built or no GPU/driver is present.
int CudaDeviceCount();

// Graph capture of one step spread over several Devices (towers; see "Asynchronous execution" above).
// BeginCaptureGroup: devices[0]->BeginCapture(), then every other device's compute queue joins the capture
// (it waits on an event recorded on devices[0]'s compute queue) and refuses host-synchronizing calls like a
// capturing device. Work enqueued on any of their compute queues (and on queues that wait on their events,
// e.g. a GradientAverager's) is recorded until EndCaptureGroup, which joins every other compute queue back
// into devices[0]'s by events and ends the capture there; the Graph launches on devices[0]'s compute queue.
// To order a device's later work after a replay, wait (WaitEvent) on an event recorded on devices[0]'s
// compute queue after Graph::Launch. A single device is BeginCapture / EndCapture. Errors: Unimplemented on
// the CPU backend (with the reason); InvalidArgument for an empty list, a null or repeated device, or devices
// of different backends; EndCaptureGroup: FailedPrecondition as EndCapture, and the devices leave capture
// mode either way.
absl::Status BeginCaptureGroup(const std::vector<Device*>& devices);
absl::StatusOr<std::unique_ptr<Graph>> EndCaptureGroup(const std::vector<Device*>& devices);

}  // namespace dtrain::kernels

#endif  // DTRAIN_KERNELS_DEVICE_H_
