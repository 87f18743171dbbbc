// CudaDevice: memory, synchronous copies, streams, cuDNN/cuBLAS handles, device-data errors, and the
// stateless elementwise ops (own kernels, cuda_kernels.h). The shape-specialized ops live in cuda_conv.cc,
// cuda_layers.cc, cuda_batch_norm.cc and cuda_binary.cc, the stateless ops of imported graphs and sparse models
// in cuda_imported_ops.cc, the optimizer in cuda_optimizer.cc, asynchronous copies, events, counters and graphs
// in cuda_async.cc.
#include "kernels/cuda/cuda_device.h"

#include <glog/logging.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_status.h"

namespace dtrain::kernels::cuda {
namespace {

absl::Status CheckCount(int64_t n, absl::string_view op) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": negative element count ", n));
  return absl::OkStatus();
}

// cuBLAS's recommended workspace on Hopper (4 MiB suffices before it); set once so cuBLAS never allocates in
// a step.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

}  // namespace

// ---- DeviceBuffer ----

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes, absl::string_view what) {
  DeviceBuffer buf;
  if (bytes == 0) bytes = 1;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&buf.ptr_, bytes), absl::StrCat("cudaMalloc(", bytes, " bytes) for ", what)));
  buf.bytes_ = bytes;
  return buf;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.ptr_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

// ---- CudaDevice: lifetime ----

CudaDevice::CudaDevice(const DeviceSpec& spec) : spec_(spec), name_(spec.ToString()) {}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const DeviceSpec& spec) {
  std::unique_ptr<CudaDevice> dev(new CudaDevice(spec));
  RETURN_IF_ERROR(dev->Activate("CreateCudaDevice"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&dev->stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&dev->copy_stream_, cudaStreamNonBlocking),
                             "cudaStreamCreate (copy stream)"));
  void* error_host = nullptr;
  RETURN_IF_ERROR(CudaStatus(
      cudaHostAlloc(&error_host, sizeof(DeviceErrorInfo), cudaHostAllocMapped | cudaHostAllocPortable),
      "cudaHostAlloc (mapped device-error record)"));
  dev->error_host_ = static_cast<DeviceErrorInfo*>(error_host);
  *dev->error_host_ = DeviceErrorInfo{};  // code kNone
  void* error_dev = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaHostGetDevicePointer(&error_dev, error_host, 0),
                             "cudaHostGetDevicePointer (device-error record)"));
  dev->error_dev_ = static_cast<DeviceErrorInfo*>(error_dev);
  RETURN_IF_ERROR(CudnnStatus(cudnnCreate(&dev->cudnn_), "cudnnCreate"));
  RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(dev->cudnn_, dev->stream_), "cudnnSetStream"));
  RETURN_IF_ERROR(CublasStatus(cublasCreate(&dev->cublas_), "cublasCreate"));
  RETURN_IF_ERROR(CublasStatus(cublasSetStream(dev->cublas_, dev->stream_), "cublasSetStream"));
  // Full fp32 (no TF32 tensor cores), so that results match the CPU backend to fp32 rounding.
  RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(dev->cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
  ASSIGN_OR_RETURN(dev->cublas_workspace_, DeviceBuffer::Allocate(kCublasWorkspaceBytes, "cuBLAS workspace"));
  RETURN_IF_ERROR(CublasStatus(
      cublasSetWorkspace(dev->cublas_, dev->cublas_workspace_.get(), dev->cublas_workspace_.bytes()),
      "cublasSetWorkspace"));
  ASSIGN_OR_RETURN(dev->l2_partials_, DeviceBuffer::AllocateFloats(kL2LossPartials, "L2Loss partial sums"));
  ASSIGN_OR_RETURN(dev->gather_first_bad_,
                   DeviceBuffer::Allocate(2 * sizeof(unsigned long long), "Gather bad-index record"));
  RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(dev->gather_first_bad_.get(), 0xFF, dev->gather_first_bad_.bytes(),
                                             dev->stream_),
                             "cudaMemsetAsync (Gather bad-index record)"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&dev->capture_event_, cudaEventDisableTiming),
                             "cudaEventCreate (capture fork/join event)"));
  return dev;
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(spec_.gpu_index);
  if (capturing_) {  // abandon an unfinished capture so the stream can be destroyed
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(stream_, &g) == cudaSuccess && g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();
  }
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  for (float* p : allocations_) cudaFree(p);
  for (float* p : pinned_) cudaFreeHost(p);
  l2_partials_ = DeviceBuffer();
  gather_first_bad_ = DeviceBuffer();
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  cublas_workspace_ = DeviceBuffer();
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
  if (capture_event_ != nullptr) cudaEventDestroy(capture_event_);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (error_host_ != nullptr) cudaFreeHost(error_host_);
}

absl::Status CudaDevice::Activate(absl::string_view op) const {
  return CudaStatus(cudaSetDevice(spec_.gpu_index), absl::StrCat(op, " on ", name_, ": cudaSetDevice"));
}

absl::Status CudaDevice::NotCapturing(absl::string_view op) const {
  if (!capturing_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(op, " on ", name_,
                   " during a graph capture: it would synchronize with the host or allocate, which a CUDA "
                   "graph cannot record (use the *Async copies from pinned memory, and make buffers and ops "
                   "before capturing)"));
}

absl::Status CudaDevice::CheckPinned(const void* host, absl::string_view op) const {
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, host);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cannot inspect host pointer: ", cudaGetErrorString(err)));
  }
  if (attr.type != cudaMemoryTypeHost) {
    return absl::InvalidArgumentError(
        absl::StrCat(op,
                     ": the host buffer is not pinned memory (allocate it with AllocHostPinned); an "
                     "asynchronous copy from "
                     "pageable memory would synchronize or break a graph capture"));
  }
  return absl::OkStatus();
}

absl::Status CudaDevice::TakeDeviceError() {
  volatile DeviceErrorInfo* e = error_host_;
  if (e == nullptr || e->code == DeviceErrorInfo::kNone) return absl::OkStatus();
  const int32_t code = e->code, row = e->row, classes = e->classes;
  const float label = e->label;
  const char* gather_op = e->backward ? "GatherBackward" : "Gather";
  const int64_t position = e->position, value = e->value, value2 = e->value2, bound = e->bound;
  e->code = DeviceErrorInfo::kNone;
  switch (code) {
    case DeviceErrorInfo::kBadLabel:
      // The CPU backend's message, word for word (kernels/cpu/cpu_device.cc).
      return absl::InvalidArgumentError(absl::StrCat("SoftmaxCrossEntropy: label ", label, " of row ", row,
                                                     " is not a class index in [0, ", classes, ")"));
    case DeviceErrorInfo::kBadBinaryLabel:
      // kernels/device.h's message.
      return absl::InvalidArgumentError(
          absl::StrCat("SigmoidCrossEntropy: label ", label, " of row ", row, " is not 0 or 1"));
    case DeviceErrorInfo::kBadGatherIndex:
      return absl::InvalidArgumentError(absl::StrCat(gather_op, ": index ", value, " of lookup ", position,
                                                     " is not a row in [0, ", bound, ")"));
    case DeviceErrorInfo::kBadGatherOffsets:
      return absl::InvalidArgumentError(absl::StrCat(gather_op, ": bag ", position, " has offsets [", value, ", ",
                                                     value2, "), not an ascending range in [0, ", bound, "]"));
    default:
      break;
  }
  return absl::InternalError(absl::StrCat(name_, ": a kernel recorded unknown device error code ", code));
}

// ---- memory ----

absl::StatusOr<float*> CudaDevice::Alloc(int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "Alloc"));
  RETURN_IF_ERROR(NotCapturing("Alloc"));
  RETURN_IF_ERROR(Activate("Alloc"));
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(n) * sizeof(float));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&p, bytes), absl::StrCat("Alloc(", n, " floats) on ", name_)));
  allocations_.insert(static_cast<float*>(p));
  return static_cast<float*>(p);
}

void CudaDevice::Free(float* p) {
  if (p == nullptr) return;
  if (capturing_) {
    LOG(ERROR) << name_
               << ": Free during a graph capture (cudaFree would break it); the memory is kept until the "
               << "device is destroyed";
    return;
  }
  if (allocations_.erase(p) == 0) {
    LOG(ERROR) << name_ << ": Free of a pointer this device did not allocate; ignored";
    return;
  }
  cudaSetDevice(spec_.gpu_index);
  cudaFree(p);
}

absl::StatusOr<float*> CudaDevice::AllocHostPinned(int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "AllocHostPinned"));
  RETURN_IF_ERROR(NotCapturing("AllocHostPinned"));
  RETURN_IF_ERROR(Activate("AllocHostPinned"));
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(1, static_cast<size_t>(n) * sizeof(float));
  RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&p, bytes), absl::StrCat("AllocHostPinned(", n, " floats)")));
  pinned_.insert(static_cast<float*>(p));
  return static_cast<float*>(p);
}

void CudaDevice::FreeHostPinned(float* p) {
  if (p == nullptr) return;
  if (capturing_) {
    LOG(ERROR) << name_
               << ": FreeHostPinned during a graph capture; the memory is kept until the device is destroyed";
    return;
  }
  if (pinned_.erase(p) == 0) {
    LOG(ERROR) << name_ << ": FreeHostPinned of a pointer this device did not allocate; ignored";
    return;
  }
  cudaFreeHost(p);
}

absl::Status CudaDevice::CopyToDevice(const float* host, float* dev, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "CopyToDevice"));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(NotCapturing("CopyToDevice"));
  RETURN_IF_ERROR(Activate("CopyToDevice"));
  return CudaStatus(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_),
                    "CopyToDevice");
}

absl::Status CudaDevice::CopyToHost(const float* dev, float* host, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "CopyToHost"));
  RETURN_IF_ERROR(NotCapturing("CopyToHost"));
  RETURN_IF_ERROR(Activate("CopyToHost"));
  if (n > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                               "CopyToHost"));
  }
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "CopyToHost: cudaStreamSynchronize"));
  return TakeDeviceError();
}

absl::Status CudaDevice::CopyOnDevice(const float* src, float* dst, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "CopyOnDevice"));
  if (n == 0 || src == dst) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("CopyOnDevice"));
  return CudaStatus(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                    "CopyOnDevice");
}

absl::Status CudaDevice::Synchronize() {
  RETURN_IF_ERROR(NotCapturing("Synchronize"));
  RETURN_IF_ERROR(Activate("Synchronize"));
  RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), absl::StrCat("Synchronize ", name_)));
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(copy_stream_), absl::StrCat("Synchronize ", name_, " (copy)")));
  return TakeDeviceError();
}

// ---- ops ----

absl::StatusOr<std::unique_ptr<Conv2D>> CudaDevice::MakeConv2D(const Conv2DParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeConv2D"));
  RETURN_IF_ERROR(Activate("MakeConv2D"));
  return MakeCudaConv2D(this, p);
}
absl::StatusOr<std::unique_ptr<MaxPool>> CudaDevice::MakeMaxPool(const PoolParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeMaxPool"));
  RETURN_IF_ERROR(Activate("MakeMaxPool"));
  return MakeCudaMaxPool(this, p);
}
absl::StatusOr<std::unique_ptr<Lrn>> CudaDevice::MakeLrn(const LrnParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeLrn"));
  RETURN_IF_ERROR(Activate("MakeLrn"));
  return MakeCudaLrn(this, p);
}
absl::StatusOr<std::unique_ptr<Dense>> CudaDevice::MakeDense(const DenseParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeDense"));
  RETURN_IF_ERROR(Activate("MakeDense"));
  return MakeCudaDense(this, p);
}
absl::StatusOr<std::unique_ptr<AvgPool>> CudaDevice::MakeAvgPool(const PoolParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeAvgPool"));
  RETURN_IF_ERROR(Activate("MakeAvgPool"));
  return MakeCudaAvgPool(this, p);
}
absl::StatusOr<std::unique_ptr<BatchNorm>> CudaDevice::MakeBatchNorm(const BatchNormParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeBatchNorm"));
  RETURN_IF_ERROR(Activate("MakeBatchNorm"));
  return MakeCudaBatchNorm(this, p);
}
absl::StatusOr<std::unique_ptr<Binary>> CudaDevice::MakeBinary(const BroadcastParams& p) {
  RETURN_IF_ERROR(NotCapturing("MakeBinary"));
  RETURN_IF_ERROR(Activate("MakeBinary"));
  return MakeCudaBinary(this, p);
}
absl::StatusOr<std::unique_ptr<DeviceOptimizer>> CudaDevice::MakeOptimizer(const OptimizerParams& p,
                                                                           const DeviceCounter* step) {
  RETURN_IF_ERROR(NotCapturing("MakeOptimizer"));
  if (step == nullptr || step->device() != this) {
    return absl::InvalidArgumentError(
        "MakeOptimizer: the step counter must be one of this device's (MakeCounter)");
  }
  RETURN_IF_ERROR(Activate("MakeOptimizer"));
  return MakeCudaOptimizer(this, p, step);
}

absl::Status CudaDevice::Relu(const float* x, float* y, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "Relu"));
  RETURN_IF_ERROR(Activate("Relu"));
  return CudaStatus(LaunchRelu(x, y, n, stream_), "Relu");
}

absl::Status CudaDevice::ReluBackward(const float* y, const float* dy, float* dx, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "ReluBackward"));
  RETURN_IF_ERROR(Activate("ReluBackward"));
  return CudaStatus(LaunchReluBackward(y, dy, dx, n, stream_), "ReluBackward");
}

absl::Status CudaDevice::Dropout(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                                 uint64_t counter) {
  RETURN_IF_ERROR(CheckCount(n, "Dropout"));
  if (!(keep_prob > 0.0f && keep_prob <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("Dropout: keep_prob must be in (0, 1], got ", keep_prob));
  }
  RETURN_IF_ERROR(Activate("Dropout"));
  // keep_prob == 1 needs no special case: every u < 1, so mask = 1 and y = x.
  return CudaStatus(LaunchDropout(x, y, mask, n, keep_prob, seed, counter, stream_), "Dropout");
}

absl::Status CudaDevice::DropoutDeviceCounter(const float* x, float* y, float* mask, int64_t n,
                                              float keep_prob, uint64_t seed,
                                              const DeviceCounter& device_counter, uint64_t counter_stride,
                                              uint64_t counter_offset) {
  RETURN_IF_ERROR(CheckCount(n, "DropoutDeviceCounter"));
  if (!(keep_prob > 0.0f && keep_prob <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("DropoutDeviceCounter: keep_prob must be in (0, 1], got ", keep_prob));
  }
  if (device_counter.device() != this) {
    return absl::InvalidArgumentError("DropoutDeviceCounter: the counter belongs to another device");
  }
  RETURN_IF_ERROR(Activate("DropoutDeviceCounter"));
  return CudaStatus(LaunchDropoutDeviceCounter(x, y, mask, n, keep_prob, seed, device_counter.device_ptr(),
                                               counter_stride, counter_offset, stream_),
                    "DropoutDeviceCounter");
}

absl::Status CudaDevice::DropoutBackward(const float* dy, const float* mask, float* dx, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "DropoutBackward"));
  RETURN_IF_ERROR(Activate("DropoutBackward"));
  return CudaStatus(LaunchMultiply(dy, mask, dx, n, stream_), "DropoutBackward");
}

absl::Status CudaDevice::CopyToCounterSlot(const float* src, float* slots, int64_t num_slots,
                                           const DeviceCounter& counter) {
  if (num_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyToCounterSlot: num_slots must be >= 1, got ", num_slots));
  }
  if (counter.device() != this) {
    return absl::InvalidArgumentError("CopyToCounterSlot: the counter belongs to another device");
  }
  RETURN_IF_ERROR(Activate("CopyToCounterSlot"));
  return CudaStatus(LaunchCopyToCounterSlot(src, slots, num_slots, counter.device_ptr(), stream_),
                    "CopyToCounterSlot");
}

absl::Status CudaDevice::SoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes,
                                             float* dlogits, float* loss) {
  if (batch <= 0 || classes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SoftmaxCrossEntropy: batch and classes must be positive, got ", batch, " x ", classes));
  }
  RETURN_IF_ERROR(Activate("SoftmaxCrossEntropy"));
  return CudaStatus(
      LaunchSoftmaxCrossEntropy(logits, labels, batch, classes, dlogits, loss, error_dev_, stream_),
      "SoftmaxCrossEntropy");
}

absl::Status CudaDevice::L2Loss(const float* x, int64_t n, float* out) {
  RETURN_IF_ERROR(CheckCount(n, "L2Loss"));
  RETURN_IF_ERROR(Activate("L2Loss"));
  return CudaStatus(LaunchL2Loss(x, n, l2_partials_.floats(), out, stream_), "L2Loss");
}

absl::Status CudaDevice::Axpy(float a, const float* x, float* y, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "Axpy"));
  RETURN_IF_ERROR(Activate("Axpy"));
  return CudaStatus(LaunchAxpy(a, x, y, n, stream_), "Axpy");
}

absl::Status CudaDevice::Scale(float a, const float* x, float* y, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "Scale"));
  RETURN_IF_ERROR(Activate("Scale"));
  return CudaStatus(LaunchScale(a, x, y, n, stream_), "Scale");
}

absl::Status CudaDevice::Fill(float value, float* x, int64_t n) {
  RETURN_IF_ERROR(CheckCount(n, "Fill"));
  RETURN_IF_ERROR(Activate("Fill"));
  return CudaStatus(LaunchFill(value, x, n, stream_), "Fill");
}

// ---- entry points (cuda_device.h) ----

int UsableDeviceCount() {
  int n = 0;
  // Without a driver this returns cudaErrorInsufficientDriver and leaves n unwritten.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls on this thread start clean
    return 0;
  }
  return n > 0 ? n : 0;
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const DeviceSpec& spec) {
  if (spec.kind != DeviceSpec::Kind::kGpu) {
    return absl::InvalidArgumentError(absl::StrCat("CreateCudaDevice: spec ", spec.ToString(), " is not a GPU"));
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device available: ", spec.ToString(),
                                                      " was asked for but cudaGetDeviceCount failed: ",
                                                      cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
  }
  if (spec.gpu_index < 0 || spec.gpu_index >= count) {
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device available: ", spec.ToString(),
                                                      " was asked for but ", count,
                                                      " CUDA device(s) are visible"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> dev, CudaDevice::Create(spec));
  return std::unique_ptr<Device>(std::move(dev));
}

}  // namespace dtrain::kernels::cuda
