// The CPU Device: host memory, a oneDNN CPU engine and stream, and spec.threads OpenMP threads for every op.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/graph_loops.h"
#include "kernels/cpu/tensor_loops.h"
#include "kernels/device.h"
#include "kernels/dropout_rng.h"

namespace dtrain::kernels {
namespace cpu {

std::string EffectiveCpuIsa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

std::string PrecisionLog::Report() const {
  std::string bf16;
  for (const auto& [kind, n] : bf16_) absl::StrAppend(&bf16, bf16.empty() ? "" : ", ", n, " ", kind);
  std::string impls;
  for (const std::string& i : impls_) absl::StrAppend(&impls, impls.empty() ? "" : ", ", i);
  // Repeated entries (a network's identical blocks) once, with their count.
  auto join = [](const std::vector<std::string>& items) {
    std::vector<std::pair<std::string, int>> counted;
    for (const std::string& i : items) {
      auto it = std::find_if(counted.begin(), counted.end(), [&](const auto& c) { return c.first == i; });
      if (it == counted.end()) {
        counted.push_back({i, 1});
      } else {
        ++it->second;
      }
    }
    std::string out;
    for (const auto& [item, n] : counted) {
      absl::StrAppend(&out, out.empty() ? "" : "; ", n > 1 ? absl::StrCat(n, " x ") : "", item);
    }
    return out;
  };
  const std::string fp32 = join(fp32_), winograd = join(winograd_);
  const std::string isa = EffectiveCpuIsa();
  const bool native = isa == "avx512_core_bf16" || isa == "avx512_core_amx";
  return absl::StrCat("compute bf16 (fp32 accumulation) on oneDNN's ", isa,
                      native ? "" : " (no bf16 instructions on this CPU: bf16 runs emulated or on reference kernels, "
                                    "slower than fp32)",
                      ": bf16 ", bf16.empty() ? "none" : bf16, impls.empty() ? "" : absl::StrCat(" [", impls, "]"),
                      winograd.empty() ? "" : absl::StrCat("; fp32 Winograd where it timed faster: ", winograd),
                      "; fp32 fallback: ", fp32.empty() ? "none" : fp32,
                      "; pooling, normalization, elementwise, softmax, the loss and the optimizer compute in fp32");
}

}  // namespace cpu

namespace {

absl::Status CheckCount(const char* op, int64_t n) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": negative element count ", n));
  return absl::OkStatus();
}

absl::Status CheckGatherParams(const char* op, const GatherParams& p, const int32_t* offsets) {
  if (p.rows < 0 || p.dim <= 0 || p.count < 0 || p.num_bags < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": need rows, count, num_bags >= 0 and dim > 0, got rows=",
                                                   p.rows, " dim=", p.dim, " count=", p.count,
                                                   " num_bags=", p.num_bags));
  }
  if (p.num_bags > 0 && offsets == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": bags need offsets"));
  }
  return absl::OkStatus();
}

// The CPU backend runs every op synchronously on the calling thread, so its queues are one: events are always
// complete, asynchronous copies are plain copies, and a counter is an int64 in host memory.
class CpuEvent final : public Event {
 public:
  explicit CpuEvent(const Device* dev) : dev_(dev) {}
  const Device* device() const override { return dev_; }

 private:
  const Device* dev_;
};

class CpuCounter final : public DeviceCounter {
 public:
  CpuCounter(const Device* dev, int64_t initial) : dev_(dev), value_(initial) {}
  const Device* device() const override { return dev_; }
  const int64_t* device_ptr() const override { return &value_; }
  absl::Status Set(int64_t value) override {
    value_ = value;
    return absl::OkStatus();
  }
  absl::Status Increment() override {
    ++value_;
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> Read() override { return value_; }

 private:
  const Device* dev_;
  int64_t value_;
};

// Thread-safety: as for every Device, one owning thread at a time; Alloc/Free are additionally guarded by a
// mutex so that a Device may be torn down from another thread than the one that allocated.
class CpuDevice final : public Device {
 public:
  CpuDevice(const DeviceSpec& spec, cpu::DnnlContext ctx) : spec_(spec), ctx_(std::move(ctx)) {}

  ~CpuDevice() override {
    for (float* p : allocations_) std::free(p);
  }

  std::string name() const override { return "cpu"; }
  const DeviceSpec& spec() const override { return spec_; }
  std::string PrecisionReport() const override { return ctx_.bf16 ? ctx_.precision->Report() : ""; }

  absl::StatusOr<float*> Alloc(int64_t n) override {
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat("Alloc: negative size ", n));
    const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr)
      return absl::ResourceExhaustedError(absl::StrCat("Alloc: out of memory allocating ", n, " floats"));
    std::lock_guard<std::mutex> lock(mu_);
    allocations_.insert(static_cast<float*>(p));
    return static_cast<float*>(p);
  }

  void Free(float* p) override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (allocations_.erase(p) > 0) std::free(p);
  }

  absl::Status CopyToDevice(const float* host, float* dev, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("CopyToDevice", n));
    cpu::CopyLoop(host, dev, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(const float* dev, float* host, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("CopyToHost", n));
    cpu::CopyLoop(dev, host, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status CopyOnDevice(const float* src, float* dst, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("CopyOnDevice", n));
    cpu::CopyLoop(src, dst, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::StatusOr<float*> AllocHostPinned(int64_t n) override { return Alloc(n); }
  void FreeHostPinned(float* p) override { Free(p); }

  absl::Status Synchronize() override {
    try {
      ctx_.stream.wait();
    } catch (const dnnl::error& e) {
      return cpu::DnnlError("Synchronize", e);
    }
    return absl::OkStatus();
  }

  // ---- asynchronous execution: synchronous here ----
  absl::Status CopyToDeviceAsync(const float* host, float* dev, int64_t n, Queue q) override {
    return CopyToDevice(host, dev, n);
  }
  absl::Status CopyToHostAsync(const float* dev, float* host, int64_t n, Queue q) override {
    return CopyToHost(dev, host, n);
  }
  absl::StatusOr<std::unique_ptr<Event>> MakeEvent() override { return std::make_unique<CpuEvent>(this); }
  absl::Status RecordEvent(Event* event, Queue q) override { return CheckOwn(event, "RecordEvent"); }
  // Any CPU device's event: the CPU queues are synchronous, so there is nothing to wait for.
  absl::Status WaitEvent(const Event* event, Queue q) override {
    if (dynamic_cast<const CpuEvent*>(event) == nullptr) {
      return absl::InvalidArgumentError("WaitEvent: the event is null or not a CPU device's");
    }
    return absl::OkStatus();
  }
  absl::Status SynchronizeEvent(Event* event) override {
    RETURN_IF_ERROR(CheckOwn(event, "SynchronizeEvent"));
    return Synchronize();
  }
  absl::StatusOr<bool> QueryEvent(Event* event) override {
    RETURN_IF_ERROR(CheckOwn(event, "QueryEvent"));
    return true;
  }
  absl::StatusOr<std::unique_ptr<DeviceCounter>> MakeCounter(int64_t initial) override {
    return std::make_unique<CpuCounter>(this, initial);
  }
  absl::Status BeginCapture() override {
    return absl::UnimplementedError(
        "BeginCapture on cpu: graph capture needs the CUDA backend (CPU ops run eagerly on the calling "
        "thread, "
        "there is nothing to replay); run the step without a graph");
  }
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override {
    return absl::FailedPreconditionError(
        "EndCapture on cpu: no capture in progress (the CPU backend cannot capture)");
  }

  absl::StatusOr<std::unique_ptr<Conv2D>> MakeConv2D(const Conv2DParams& p) override {
    return cpu::MakeCpuConv2D(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<MaxPool>> MakeMaxPool(const PoolParams& p) override {
    return cpu::MakeCpuMaxPool(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<Lrn>> MakeLrn(const LrnParams& p) override {
    return cpu::MakeCpuLrn(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<Dense>> MakeDense(const DenseParams& p) override {
    return cpu::MakeCpuDense(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<AvgPool>> MakeAvgPool(const PoolParams& p) override {
    return cpu::MakeCpuAvgPool(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<BatchNorm>> MakeBatchNorm(const BatchNormParams& p) override {
    return cpu::MakeCpuBatchNorm(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<Binary>> MakeBinary(const BroadcastParams& p) override {
    return cpu::MakeCpuBinary(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeOptimizer(const OptimizerParams& p,
                                                                 const DeviceCounter* step) override {
    if (step == nullptr || step->device() != this) {
      return absl::InvalidArgumentError(
          "MakeOptimizer: the step counter must be one of this device's (MakeCounter)");
    }
    return cpu::MakeCpuOptimizer(p, step, spec_.threads);
  }

  absl::Status Relu(const float* x, float* y, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("Relu", n));
    cpu::ReluLoop(x, y, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("ReluBackward", n));
    cpu::ReluBackwardLoop(y, dy, dx, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status Dropout(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                       uint64_t counter) override {
    RETURN_IF_ERROR(CheckCount("Dropout", n));
    if (!(keep_prob > 0.0f && keep_prob <= 1.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Dropout: keep_prob must be in (0, 1], got ", keep_prob));
    }
    if (keep_prob == 1.0f) {
      cpu::CopyLoop(x, y, n, spec_.threads);
      cpu::FillLoop(1.0f, mask, n, spec_.threads);
      return absl::OkStatus();
    }
    cpu::DropoutLoop(x, y, mask, n, keep_prob, seed, counter, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status DropoutDeviceCounter(const float* x, float* y, float* mask, int64_t n, float keep_prob,
                                    uint64_t seed, const DeviceCounter& device_counter,
                                    uint64_t counter_stride, uint64_t counter_offset) override {
    if (device_counter.device() != this) {
      return absl::InvalidArgumentError("DropoutDeviceCounter: the counter belongs to another device");
    }
    return Dropout(x, y, mask, n, keep_prob, seed,
                   DropoutCounterFrom(*device_counter.device_ptr(), counter_stride, counter_offset));
  }
  absl::Status CopyToCounterSlot(const float* src, float* slots, int64_t num_slots,
                                 const DeviceCounter& counter) override {
    if (num_slots < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopyToCounterSlot: num_slots must be >= 1, got ", num_slots));
    }
    if (counter.device() != this) {
      return absl::InvalidArgumentError("CopyToCounterSlot: the counter belongs to another device");
    }
    const int64_t k = *counter.device_ptr() % num_slots;
    slots[k < 0 ? k + num_slots : k] = *src;
    return absl::OkStatus();
  }
  absl::Status DropoutBackward(const float* dy, const float* mask, float* dx, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("DropoutBackward", n));
    cpu::MulLoop(dy, mask, dx, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status SoftmaxCrossEntropy(const float* logits, const float* labels, int batch, int classes,
                                   float* dlogits, float* loss) override {
    if (batch <= 0 || classes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("SoftmaxCrossEntropy: batch and classes must be positive, got ", batch, "x", classes));
    }
    int bad_row = -1;
    const double mean =
        cpu::SoftmaxCrossEntropyLoop(logits, labels, batch, classes, dlogits, spec_.threads, &bad_row);
    if (bad_row >= 0) {
      return absl::InvalidArgumentError(absl::StrCat("SoftmaxCrossEntropy: label ", labels[bad_row],
                                                     " of row ", bad_row, " is not a class index in [0, ",
                                                     classes, ")"));
    }
    *loss = static_cast<float>(mean);
    return absl::OkStatus();
  }
  absl::Status L2Loss(const float* x, int64_t n, float* out) override {
    RETURN_IF_ERROR(CheckCount("L2Loss", n));
    *out = static_cast<float>(cpu::SumSquaresHalf(x, n, spec_.threads));
    return absl::OkStatus();
  }
  absl::Status Axpy(float a, const float* x, float* y, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("Axpy", n));
    cpu::AxpyLoop(a, x, y, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status Scale(float a, const float* x, float* y, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("Scale", n));
    cpu::ScaleLoop(a, x, y, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status Fill(float value, float* x, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("Fill", n));
    cpu::FillLoop(value, x, n, spec_.threads);
    return absl::OkStatus();
  }

  // ---- ops of imported graphs and sparse models (kernels/cpu/graph_loops.h) ----
  absl::Status Activation(const ActivationParams& p, const float* x, float* y, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("Activation", n));
    if (cpu::HasDnnlEltwise(p.kind)) return cpu::DnnlEltwiseForward(ctx_, p, x, y, n);
    cpu::UseThreads(spec_.threads);
    cpu::ActivationLoop(p, x, y, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status ActivationBackward(const ActivationParams& p, const float* x, const float* y, const float* dy,
                                  float* dx, int64_t n) override {
    RETURN_IF_ERROR(CheckCount("ActivationBackward", n));
    if (cpu::HasDnnlEltwise(p.kind)) return cpu::DnnlEltwiseBackward(ctx_, p, x, dy, dx, n);
    cpu::UseThreads(spec_.threads);
    cpu::ActivationBackwardLoop(p, x, y, dy, dx, n, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status CopyStrided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                           int64_t cols, bool accumulate) override {
    if (rows < 0 || cols < 0 || (rows > 1 && (src_stride < cols || dst_stride < cols))) {
      return absl::InvalidArgumentError(absl::StrCat("CopyStrided: need rows, cols >= 0 and strides >= cols, got ",
                                                     rows, "x", cols, " strides ", src_stride, ", ", dst_stride));
    }
    cpu::CopyStridedLoop(src, src_stride, dst, dst_stride, rows, cols, accumulate, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status Transpose(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols) override {
    if (batch < 0 || rows < 0 || cols < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Transpose: negative size ", batch, "x", rows, "x", cols));
    }
    if (x == y && rows > 1 && cols > 1 && batch > 0) {  // as the CUDA backend: no transpose in place
      return absl::InvalidArgumentError("Transpose: x and y must not be the same buffer");
    }
    cpu::TransposeLoop(x, y, batch, rows, cols, spec_.threads);
    return absl::OkStatus();
  }
  // ---- tensor ops (kernels/tensor_ops.h) ----
  absl::Status StridedCopy(const StridedCopyParams& p, const float* src, float* dst, bool accumulate) override {
    RETURN_IF_ERROR(CheckStridedCopyParams("StridedCopy", p));
    cpu::UseThreads(spec_.threads);
    cpu::StridedCopyLoop(p, src, dst, accumulate, spec_.threads);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Reduce>> MakeReduce(const ReduceParams& p) override {
    return cpu::MakeCpuReduce(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<Softmax>> MakeSoftmax(const SoftmaxParams& p) override {
    return cpu::MakeCpuSoftmax(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<LayerNorm>> MakeLayerNorm(const LayerNormParams& p) override {
    return cpu::MakeCpuLayerNorm(ctx_, p);
  }
  absl::StatusOr<std::unique_ptr<MatMul>> MakeMatMul(const MatMulParams& p) override {
    return cpu::MakeCpuMatMul(ctx_, p);
  }

  absl::Status BatchNormRunningDelta(const float* running_mean, const float* running_var, const float* batch_mean,
                                     const float* batch_var, int channels, int64_t count, float momentum,
                                     bool unbiased, float* d_mean, float* d_var) override {
    if (channels < 0 || count < (unbiased ? 2 : 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BatchNormRunningDelta: need channels >= 0 and count >= ", unbiased ? 2 : 1,
          " (the unbiased variance divides by count - 1), got ", channels, " channels, count ", count));
    }
    cpu::BatchNormRunningDeltaLoop(running_mean, running_var, batch_mean, batch_var, channels, count, momentum,
                                   unbiased, d_mean, d_var);
    return absl::OkStatus();
  }
  absl::Status Gather(const GatherParams& p, const float* table, const int32_t* indices, const int32_t* offsets,
                      float* y) override {
    RETURN_IF_ERROR(CheckGatherParams("Gather", p, offsets));
    RETURN_IF_ERROR(cpu::CheckGatherData("Gather", p, indices, offsets));
    cpu::GatherLoop(p, table, indices, offsets, y, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status GatherBackward(const GatherParams& p, const float* dy, const int32_t* indices, const int32_t* offsets,
                              float* dtable) override {
    RETURN_IF_ERROR(CheckGatherParams("GatherBackward", p, offsets));
    RETURN_IF_ERROR(cpu::CheckGatherData("GatherBackward", p, indices, offsets));
    cpu::GatherBackwardLoop(p, dy, indices, offsets, dtable, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status Interaction(const InteractionParams& p, const float* x, float* y) override {
    RETURN_IF_ERROR(CheckInteractionParams("Interaction", p));
    cpu::InteractionLoop(p, x, y, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status InteractionBackward(const InteractionParams& p, const float* x, const float* dy, float* dx) override {
    RETURN_IF_ERROR(CheckInteractionParams("InteractionBackward", p));
    cpu::InteractionBackwardLoop(p, x, dy, dx, spec_.threads);
    return absl::OkStatus();
  }
  absl::Status SigmoidCrossEntropy(const float* logits, const float* labels, int batch, float* dlogits,
                                   float* loss) override {
    if (batch <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("SigmoidCrossEntropy: batch must be positive, got ", batch));
    }
    return cpu::SigmoidCrossEntropyLoop(logits, labels, batch, dlogits, loss, spec_.threads);
  }

 private:
  absl::Status CheckOwn(const Event* event, const char* op) const {
    if (event == nullptr || event->device() != this) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": the event belongs to another device (or is null)"));
    }
    return absl::OkStatus();
  }

  DeviceSpec spec_;
  cpu::DnnlContext ctx_;
  std::mutex mu_;
  std::unordered_set<float*> allocations_;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> CreateCpuDevice(const DeviceSpec& spec) {
  if (spec.kind != DeviceSpec::Kind::kCpu) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateCpuDevice: spec is ", spec.ToString(), ", not cpu"));
  }
  if (spec.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CreateCpuDevice: threads must be >= 1, got ", spec.threads));
  }
  try {
    cpu::DnnlContext ctx;
    ctx.engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    ctx.stream = dnnl::stream(ctx.engine);
    ctx.threads = spec.threads;
    ctx.bf16 = spec.compute_dtype == ComputeDtype::kBf16;
    return std::unique_ptr<Device>(new CpuDevice(spec, std::move(ctx)));
  } catch (const dnnl::error& e) {
    return cpu::DnnlError("CreateCpuDevice", e);
  }
}

}  // namespace dtrain::kernels
