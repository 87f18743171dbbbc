// CudaDevice's asynchronous execution: copies on either stream from/to pinned memory, events between the
// streams, device counters, and CUDA graph capture of the compute stream (kernels/device.h, "Asynchronous
// execution").
#include <glog/logging.h>

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

const char* QueueName(Queue q) { return q == Queue::kCopy ? "copy" : "compute"; }

class CudaEvent final : public Event {
 public:
  CudaEvent(CudaDevice* dev, cudaEvent_t event) : dev_(dev), event_(event) {}
  ~CudaEvent() override {
    cudaSetDevice(dev_->gpu());
    cudaEventDestroy(event_);
  }
  const Device* device() const override { return dev_; }
  cudaEvent_t get() const { return event_; }

 private:
  CudaDevice* dev_;
  cudaEvent_t event_;
};

class CudaCounter final : public DeviceCounter {
 public:
  CudaCounter(CudaDevice* dev, DeviceBuffer value, int64_t* pinned)
      : dev_(dev), value_(std::move(value)), pinned_(pinned) {}
  ~CudaCounter() override {
    cudaSetDevice(dev_->gpu());
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
  }
  const Device* device() const override { return dev_; }
  const int64_t* device_ptr() const override { return ptr(); }

  absl::Status Set(int64_t value) override {
    RETURN_IF_ERROR(dev_->Activate("DeviceCounter::Set"));
    return CudaStatus(LaunchCounterSet(ptr(), value, dev_->stream()), "DeviceCounter::Set");
  }
  absl::Status Increment() override {
    RETURN_IF_ERROR(dev_->Activate("DeviceCounter::Increment"));
    return CudaStatus(LaunchCounterIncrement(ptr(), dev_->stream()), "DeviceCounter::Increment");
  }
  absl::StatusOr<int64_t> Read() override {
    RETURN_IF_ERROR(dev_->NotCapturing("DeviceCounter::Read"));
    RETURN_IF_ERROR(dev_->Activate("DeviceCounter::Read"));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(pinned_, ptr(), sizeof(int64_t), cudaMemcpyDeviceToHost, dev_->stream()),
                   "DeviceCounter::Read"));
    RETURN_IF_ERROR(
        CudaStatus(cudaStreamSynchronize(dev_->stream()), "DeviceCounter::Read: cudaStreamSynchronize"));
    RETURN_IF_ERROR(dev_->TakeDeviceError());
    return *pinned_;
  }

 private:
  int64_t* ptr() const { return static_cast<int64_t*>(value_.get()); }

  CudaDevice* dev_;
  DeviceBuffer value_;  // one int64
  int64_t* pinned_;     // staging for Read
};

class CudaGraph final : public Graph {
 public:
  CudaGraph(CudaDevice* dev, cudaGraph_t graph, cudaGraphExec_t exec)
      : dev_(dev), graph_(graph), exec_(exec) {}
  ~CudaGraph() override {
    cudaSetDevice(dev_->gpu());
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) cudaGraphDestroy(graph_);
  }
  absl::Status Launch() override {
    RETURN_IF_ERROR(dev_->Activate("Graph::Launch"));
    return CudaStatus(cudaGraphLaunch(exec_, dev_->stream()), "Graph::Launch: cudaGraphLaunch");
  }
  const Device* device() const override { return dev_; }

 private:
  CudaDevice* dev_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
};

}  // namespace

// ---- asynchronous copies ----

absl::Status CudaDevice::CopyToDeviceAsync(const float* host, float* dev, int64_t n, Queue q) {
  RETURN_IF_ERROR(CheckCount(n, "CopyToDeviceAsync"));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("CopyToDeviceAsync"));
  RETURN_IF_ERROR(CheckPinned(host, "CopyToDeviceAsync"));
  return CudaStatus(cudaMemcpyAsync(dev, host, n * sizeof(float), cudaMemcpyHostToDevice, queue(q)),
                    absl::StrCat("CopyToDeviceAsync (", QueueName(q), " stream)"));
}

absl::Status CudaDevice::CopyToHostAsync(const float* dev, float* host, int64_t n, Queue q) {
  RETURN_IF_ERROR(CheckCount(n, "CopyToHostAsync"));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("CopyToHostAsync"));
  RETURN_IF_ERROR(CheckPinned(host, "CopyToHostAsync"));
  return CudaStatus(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, queue(q)),
                    absl::StrCat("CopyToHostAsync (", QueueName(q), " stream)"));
}

// ---- events ----

namespace {

absl::StatusOr<const CudaEvent*> Own(const CudaDevice* dev, const Event* event, absl::string_view op) {
  if (event == nullptr || event->device() != dev) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": the event belongs to another device (or is null)"));
  }
  return static_cast<const CudaEvent*>(event);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Event>> CudaDevice::MakeEvent() {
  RETURN_IF_ERROR(NotCapturing("MakeEvent"));
  RETURN_IF_ERROR(Activate("MakeEvent"));
  cudaEvent_t e = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "MakeEvent: cudaEventCreate"));
  return std::unique_ptr<Event>(new CudaEvent(this, e));
}

absl::Status CudaDevice::RecordEvent(Event* event, Queue q) {
  ASSIGN_OR_RETURN(const CudaEvent* e, Own(this, event, "RecordEvent"));
  RETURN_IF_ERROR(Activate("RecordEvent"));
  return CudaStatus(cudaEventRecord(e->get(), queue(q)),
                    absl::StrCat("RecordEvent (", QueueName(q), " stream)"));
}

absl::Status CudaDevice::WaitEvent(const Event* event, Queue q) {
  // Any CUDA device's event: cudaStreamWaitEvent orders streams across devices.
  const auto* e = dynamic_cast<const CudaEvent*>(event);
  if (e == nullptr) {
    return absl::InvalidArgumentError("WaitEvent: the event is null or not a CUDA device's");
  }
  RETURN_IF_ERROR(Activate("WaitEvent"));
  return CudaStatus(cudaStreamWaitEvent(queue(q), e->get(), 0),
                    absl::StrCat("WaitEvent (", QueueName(q), " stream)"));
}

absl::Status CudaDevice::SynchronizeEvent(Event* event) {
  ASSIGN_OR_RETURN(const CudaEvent* e, Own(this, event, "SynchronizeEvent"));
  RETURN_IF_ERROR(NotCapturing("SynchronizeEvent"));
  RETURN_IF_ERROR(Activate("SynchronizeEvent"));
  RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(e->get()), "SynchronizeEvent: cudaEventSynchronize"));
  return TakeDeviceError();
}

absl::StatusOr<bool> CudaDevice::QueryEvent(Event* event) {
  ASSIGN_OR_RETURN(const CudaEvent* e, Own(this, event, "QueryEvent"));
  RETURN_IF_ERROR(NotCapturing("QueryEvent"));
  RETURN_IF_ERROR(Activate("QueryEvent"));
  const cudaError_t err = cudaEventQuery(e->get());
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is not an error: keep it from surfacing in the next launch check
    return false;
  }
  RETURN_IF_ERROR(CudaStatus(err, "QueryEvent: cudaEventQuery"));
  RETURN_IF_ERROR(TakeDeviceError());
  return true;
}

// ---- counters ----

absl::StatusOr<std::unique_ptr<DeviceCounter>> CudaDevice::MakeCounter(int64_t initial) {
  RETURN_IF_ERROR(NotCapturing("MakeCounter"));
  RETURN_IF_ERROR(Activate("MakeCounter"));
  ASSIGN_OR_RETURN(DeviceBuffer value, DeviceBuffer::Allocate(sizeof(int64_t), "DeviceCounter"));
  void* pinned = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&pinned, sizeof(int64_t)), "MakeCounter: cudaMallocHost"));
  auto counter = std::make_unique<CudaCounter>(this, std::move(value), static_cast<int64_t*>(pinned));
  RETURN_IF_ERROR(counter->Set(initial));
  return std::unique_ptr<DeviceCounter>(std::move(counter));
}

// ---- graphs ----

absl::Status CudaDevice::BeginCapture() {
  if (capturing_)
    return absl::FailedPreconditionError(absl::StrCat("BeginCapture on ", name_, ": already capturing"));
  RETURN_IF_ERROR(Activate("BeginCapture"));
  // Thread-local mode: only this thread's unsafe calls are refused, so towers on other threads (other
  // devices) may keep allocating while this one captures.
  RETURN_IF_ERROR(CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                             "BeginCapture: cudaStreamBeginCapture"));
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Graph>> CudaDevice::EndCapture() {
  if (!capturing_) {
    return absl::FailedPreconditionError(absl::StrCat("EndCapture on ", name_, ": no capture in progress"));
  }
  RETURN_IF_ERROR(Activate("EndCapture"));
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return absl::FailedPreconditionError(
        absl::StrCat("EndCapture on ", name_, ": the capture failed with CUDA error ", cudaGetErrorName(err),
                     " (", cudaGetErrorString(err),
                     "): something enqueued during it cannot be captured, or the copy stream was not "
                     "joined back to the compute stream with an event"));
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  if (inst != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(graph);
    return CudaStatus(inst, "EndCapture: cudaGraphInstantiate");
  }
  return std::unique_ptr<Graph>(new CudaGraph(this, graph, exec));
}

// ---- capture over several devices ----

absl::Status CudaDevice::JoinCapture(CudaDevice* origin) {
  if (capturing_) {
    return absl::FailedPreconditionError(absl::StrCat("BeginCaptureGroup: ", name_, " is already capturing"));
  }
  RETURN_IF_ERROR(origin->Activate("BeginCaptureGroup"));
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(origin->capture_event_, origin->stream_),
                             "BeginCaptureGroup: fork event record"));
  RETURN_IF_ERROR(Activate("BeginCaptureGroup"));
  RETURN_IF_ERROR(
      CudaStatus(cudaStreamWaitEvent(stream_, origin->capture_event_, 0),
                 absl::StrCat("BeginCaptureGroup: ", name_, " joins the capture of ", origin->name_)));
  capturing_ = true;
  return absl::OkStatus();
}

absl::Status CudaDevice::LeaveCapture(CudaDevice* origin) {
  if (!capturing_) {
    return absl::FailedPreconditionError(absl::StrCat("EndCaptureGroup: ", name_, " is not capturing"));
  }
  capturing_ = false;
  RETURN_IF_ERROR(Activate("EndCaptureGroup"));
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(capture_event_, stream_), "EndCaptureGroup: join event record"));
  RETURN_IF_ERROR(origin->Activate("EndCaptureGroup"));
  return CudaStatus(cudaStreamWaitEvent(origin->stream_, capture_event_, 0),
                    absl::StrCat("EndCaptureGroup: ", name_, " joins back into ", origin->name_));
}

namespace {

absl::StatusOr<std::vector<CudaDevice*>> AsCudaDevices(const std::vector<Device*>& devices,
                                                       absl::string_view op) {
  std::vector<CudaDevice*> out;
  for (Device* d : devices) {
    auto* c = dynamic_cast<CudaDevice*>(d);
    if (c == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(op, ": not every device is a CUDA device"));
    out.push_back(c);
  }
  return out;
}

}  // namespace

absl::Status BeginCaptureGroup(const std::vector<Device*>& devices) {
  ASSIGN_OR_RETURN(std::vector<CudaDevice*> devs, AsCudaDevices(devices, "BeginCaptureGroup"));
  RETURN_IF_ERROR(devs[0]->BeginCapture());
  for (size_t i = 1; i < devs.size(); ++i) {
    absl::Status s = devs[i]->JoinCapture(devs[0]);
    if (!s.ok()) {
      // Undo: the devices that joined leave, the origin ends (and drops) its capture.
      for (size_t j = 1; j < i; ++j) (void)devs[j]->LeaveCapture(devs[0]);
      (void)devs[0]->EndCapture();
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Graph>> EndCaptureGroup(const std::vector<Device*>& devices) {
  ASSIGN_OR_RETURN(std::vector<CudaDevice*> devs, AsCudaDevices(devices, "EndCaptureGroup"));
  absl::Status left = absl::OkStatus();
  for (size_t i = 1; i < devs.size(); ++i) {
    absl::Status s = devs[i]->LeaveCapture(devs[0]);
    if (left.ok()) left = s;
  }
  absl::StatusOr<std::unique_ptr<Graph>> graph = devs[0]->EndCapture();
  if (!left.ok()) return left;  // the graph (if any) is dropped: a stream was not joined back
  return graph;
}

}  // namespace dtrain::kernels::cuda
