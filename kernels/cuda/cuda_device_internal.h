// The CUDA Device and what its ops share. Internal to kernels/cuda: nothing outside this folder includes it
// (the rest of dtrain sees only kernels/device.h).
//
// Streams: `stream()` (Queue::kCompute) runs every op; `copy_stream()` (Queue::kCopy) runs asynchronous
// copies that should overlap compute. Both are non-blocking streams (no implicit sync with the legacy default
// stream).
//
// Graph capture (cuda_async.cc): BeginCapture puts stream() in thread-local capture mode; while capturing_,
// every entry point that would synchronize with the host or allocate returns FailedPrecondition
// (NotCapturing) instead of invalidating the capture. Ops never allocate or synchronize (cuDNN algorithms,
// workspaces and the cuBLAS workspace are set up when ops and the device are made), so they are capturable.
//
// Device-data errors: kernels record them in a host-mapped DeviceErrorInfo; every host-synchronizing entry
// point reports it (TakeDeviceError) as InvalidArgument, once.
//
// Thread-safety: as for every Device (kernels/device.h), a CudaDevice and the ops it made belong to one
// thread at a time. Every public entry point makes the device's GPU current on the calling thread
// (cudaSetDevice) first, so towers on different GPUs may run in different threads. Ops keep a raw pointer to
// their CudaDevice and must not be used after it is destroyed (destroying them afterwards is fine).
#ifndef DTRAIN_KERNELS_CUDA_CUDA_DEVICE_INTERNAL_H_
#define DTRAIN_KERNELS_CUDA_CUDA_DEVICE_INTERNAL_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <memory>
#include <string>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {

// Device memory owned by an op (scratch, reordered weights). Move-only; frees on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Allocates `bytes` (at least 1) on the current device. ResourceExhausted names `what` when out of memory.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, absl::string_view what);
  static absl::StatusOr<DeviceBuffer> AllocateFloats(int64_t n, absl::string_view what) {
    return Allocate(static_cast<size_t>(n) * sizeof(float), what);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) {
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* get() const { return ptr_; }
  float* floats() const { return static_cast<float*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class CudaDevice final : public Device {
 public:
  // spec.kind must be kGpu and spec.gpu_index a usable device (the caller, CreateCudaDevice, has checked).
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(const DeviceSpec& spec);
  ~CudaDevice() override;

  std::string name() const override { return name_; }
  const DeviceSpec& spec() const override { return spec_; }
  // The CUDA backend has no bf16 path yet: with --compute_dtype=bf16 every op computes in fp32, and says so.
  std::string PrecisionReport() const override {
    return spec_.compute_dtype == ComputeDtype::kBf16
               ? "compute bf16 asked for, but the CUDA backend computes every op in fp32 (its bf16 path is not "
                 "built yet): bf16 none; fp32 fallback: every convolution, dense and matmul"
               : "";
  }

  absl::StatusOr<float*> Alloc(int64_t n) override;
  void Free(float* p) override;
  absl::Status CopyToDevice(const float* host, float* dev, int64_t n) override;
  absl::Status CopyToHost(const float* dev, float* host, int64_t n) override;
  absl::Status CopyOnDevice(const float* src, float* dst, int64_t n) override;
  absl::StatusOr<float*> AllocHostPinned(int64_t n) override;
  void FreeHostPinned(float* p) override;
  absl::Status Synchronize() override;

  // cuda_async.cc
  absl::Status CopyToDeviceAsync(const float* host, float* dev, int64_t n, Queue q) override;
  absl::Status CopyToHostAsync(const float* dev, float* host, int64_t n, Queue q) override;
  absl::StatusOr<std::unique_ptr<Event>> MakeEvent() override;
  absl::Status RecordEvent(Event* event, Queue q) override;
  absl::Status WaitEvent(const Event* event, Queue q) override;
  absl::Status SynchronizeEvent(Event* event) override;
  absl::StatusOr<bool> QueryEvent(Event* event) override;
  absl::StatusOr<std::unique_ptr<DeviceCounter>> MakeCounter(int64_t initial) override;
  absl::Status BeginCapture() override;
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override;

  absl::StatusOr<std::unique_ptr<Conv2D>> MakeConv2D(const Conv2DParams& p) override;
  absl::StatusOr<std::unique_ptr<MaxPool>> MakeMaxPool(const PoolParams& p) override;
  absl::StatusOr<std::unique_ptr<Lrn>> MakeLrn(const LrnParams& p) override;
  absl::StatusOr<std::unique_ptr<Dense>> MakeDense(const DenseParams& p) override;
  absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeOptimizer(const OptimizerParams& p,
                                                                 const DeviceCounter* step) override;

  absl::Status Relu(const float* x, float* y, int64_t n) override;
  absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n) override;
  absl::Status Dropout(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                       uint64_t counter) override;
  absl::Status DropoutDeviceCounter(const float* x, float* y, float* mask, int64_t n, float keep_prob,
                                    uint64_t seed, const DeviceCounter& device_counter,
                                    uint64_t counter_stride, uint64_t counter_offset) override;
  absl::Status DropoutBackward(const float* dy, const float* mask, float* dx, int64_t n) override;
  absl::Status CopyToCounterSlot(const float* src, float* slots, int64_t num_slots,
                                 const DeviceCounter& counter) override;
  absl::Status SoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes,
                                   float* dlogits, float* loss) override;
  absl::Status L2Loss(const float* x, int64_t n, float* out) override;
  absl::Status Axpy(float a, const float* x, float* y, int64_t n) override;
  absl::Status Scale(float a, const float* x, float* y, int64_t n) override;
  absl::Status Fill(float value, float* x, int64_t n) override;

  // The ops of imported graphs and sparse models: cuda_layers.cc (AvgPool), cuda_batch_norm.cc,
  // cuda_binary.cc, cuda_imported_ops.cc (the stateless ones).
  absl::StatusOr<std::unique_ptr<AvgPool>> MakeAvgPool(const PoolParams& p) override;
  absl::StatusOr<std::unique_ptr<BatchNorm>> MakeBatchNorm(const BatchNormParams& p) override;
  absl::StatusOr<std::unique_ptr<Binary>> MakeBinary(const BroadcastParams& p) override;
  absl::Status Activation(const ActivationParams& p, const float* x, float* y, int64_t n) override;
  absl::Status ActivationBackward(const ActivationParams& p, const float* x, const float* y, const float* dy,
                                  float* dx, int64_t n) override;
  absl::Status CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                           int64_t cols, bool accumulate) override;
  absl::Status Transpose(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) override;
  absl::Status BatchNormRunningDelta(const float* running_mean, const float* running_var,
                                     const float* batch_mean, const float* batch_var, int channels, int64_t count,
                                     float momentum, bool unbiased, float* d_mean, float* d_var) override;
  absl::Status Gather(const GatherParams& p, const float* table, const int32_t* indices, const int32_t* offsets,
                      float* y) override;
  absl::Status GatherBackward(const GatherParams& p, const float* dy, const int32_t* indices,
                              const int32_t* offsets, float* dtable) override;
  absl::Status Interaction(const InteractionParams& p, const float* x, float* y) override;
  absl::Status InteractionBackward(const InteractionParams& p, const float* x, const float* dy, float* dx) override;
  absl::Status SigmoidCrossEntropy(const float* logits, const float* labels, int batch, float* dlogits,
                                   float* loss) override;
  // The tensor ops of imported graphs (kernels/tensor_ops.h): cuda_tensor_ops.cc.
  absl::Status StridedCopy(const StridedCopyParams& p, const float* src, float* dst, bool accumulate) override;
  absl::StatusOr<std::unique_ptr<Reduce>> MakeReduce(const ReduceParams& p) override;
  absl::StatusOr<std::unique_ptr<Softmax>> MakeSoftmax(const SoftmaxParams& p) override;
  absl::StatusOr<std::unique_ptr<LayerNorm>> MakeLayerNorm(const LayerNormParams& p) override;
  absl::StatusOr<std::unique_ptr<MatMul>> MakeMatMul(const MatMulParams& p) override;

  // ---- for ops in kernels/cuda and the gradient all-reducer ----
  int gpu() const { return spec_.gpu_index; }
  cudaStream_t stream() const { return stream_; }
  cudaStream_t copy_stream() const { return copy_stream_; }
  cudaStream_t queue(Queue q) const { return q == Queue::kCopy ? copy_stream_ : stream_; }
  bool capturing() const { return capturing_; }
  // FailedPrecondition naming `op` while a graph capture is in progress (for calls that would break it).
  absl::Status NotCapturing(absl::string_view op) const;
  // InvalidArgument naming `op` unless `host` points into pinned (page-locked) host memory.
  absl::Status CheckPinned(const void* host, absl::string_view op) const;
  // After a host synchronization: the device-data error a kernel recorded (InvalidArgument), cleared; else
  // OK.
  absl::Status TakeDeviceError();
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  // Makes this device's GPU current on the calling thread; `op` names the caller in the error.
  absl::Status Activate(absl::string_view op) const;

  // ---- capture over several devices (cuda_async.cc: BeginCaptureGroup / EndCaptureGroup) ----
  // This device's compute stream joins the capture in progress on `origin` (waits on an event recorded there)
  // and refuses host-synchronizing calls until LeaveCapture, which joins it back into `origin`'s stream.
  absl::Status JoinCapture(CudaDevice* origin);
  absl::Status LeaveCapture(CudaDevice* origin);

 private:
  explicit CudaDevice(const DeviceSpec& spec);

  DeviceSpec spec_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  bool capturing_ = false;
  // Recorded on stream_ to fork other devices' streams into a capture this device leads (or to join this
  // stream back into the capture another device leads). Made in Create, so capturing never creates events.
  cudaEvent_t capture_event_ = nullptr;
  DeviceErrorInfo* error_host_ = nullptr;  // host-mapped pinned memory, written by kernels
  DeviceErrorInfo* error_dev_ = nullptr;   // its device address
  DeviceBuffer cublas_workspace_;          // given to cuBLAS so that it never allocates (graph capture)
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer l2_partials_;  // kL2LossPartials floats of scratch for L2Loss
  // Two unsigned 64-bit words, all ones between calls: the first bad lookup and bag of a Gather (embedding.cu).
  DeviceBuffer gather_first_bad_;
  std::unordered_set<float*> allocations_;
  std::unordered_set<float*> pinned_;
};

// Op factories (cuda_conv.cc, cuda_layers.cc, cuda_batch_norm.cc, cuda_binary.cc). `dev` outlives the op's
// use; params are validated here.
absl::StatusOr<std::unique_ptr<Conv2D>> MakeCudaConv2D(CudaDevice* dev, const Conv2DParams& p);
absl::StatusOr<std::unique_ptr<MaxPool>> MakeCudaMaxPool(CudaDevice* dev, const PoolParams& p);
absl::StatusOr<std::unique_ptr<Lrn>> MakeCudaLrn(CudaDevice* dev, const LrnParams& p);
absl::StatusOr<std::unique_ptr<Dense>> MakeCudaDense(CudaDevice* dev, const DenseParams& p);
absl::StatusOr<std::unique_ptr<AvgPool>> MakeCudaAvgPool(CudaDevice* dev, const PoolParams& p);
absl::StatusOr<std::unique_ptr<BatchNorm>> MakeCudaBatchNorm(CudaDevice* dev, const BatchNormParams& p);
absl::StatusOr<std::unique_ptr<Binary>> MakeCudaBinary(CudaDevice* dev, const BroadcastParams& p);
// cuda_tensor_ops.cc (kernels/tensor_ops.h): InvalidArgument naming the op for bad params; scratch (Reduce's
// argmax, LayerNorm's partial sums) allocated here, so the ops never allocate.
absl::StatusOr<std::unique_ptr<Reduce>> MakeCudaReduce(CudaDevice* dev, const ReduceParams& p);
absl::StatusOr<std::unique_ptr<Softmax>> MakeCudaSoftmax(CudaDevice* dev, const SoftmaxParams& p);
absl::StatusOr<std::unique_ptr<LayerNorm>> MakeCudaLayerNorm(CudaDevice* dev, const LayerNormParams& p);
absl::StatusOr<std::unique_ptr<MatMul>> MakeCudaMatMul(CudaDevice* dev, const MatMulParams& p);
// cuda_optimizer.cc; `step` is a counter of `dev` (checked by the caller).
absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeCudaOptimizer(CudaDevice* dev, const OptimizerParams& p,
                                                                   const DeviceCounter* step);

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_CUDA_DEVICE_INTERNAL_H_
