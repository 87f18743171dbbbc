#include "kernels/cuda/nccl_allreduce.h"

#include <nccl.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_status.h"

namespace dtrain::kernels::cuda {
namespace {

absl::Status NcclStatus(ncclResult_t r, absl::string_view op) {
  if (r == ncclSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(op, ": NCCL error ", static_cast<int>(r), ": ", ncclGetErrorString(r));
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return absl::InvalidArgumentError(msg);
  if (r == ncclRemoteError || r == ncclSystemError) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

// The towers on one GPU; towers[0] is the leader that takes part in NCCL.
struct GpuGroup {
  int gpu = 0;
  std::vector<int> towers;   // indices into devices_
  cudaEvent_t done = nullptr;  // recorded on the leader's stream once the mean is everywhere on this GPU
  ncclComm_t comm = nullptr;   // only with several GPUs
};

class GroupedAllReducer final : public GradientAllReducer {
 public:
  GroupedAllReducer(std::vector<CudaDevice*> devices, int64_t n) : devices_(std::move(devices)), n_(n) {}
  ~GroupedAllReducer() override;

  absl::Status Init();
  absl::Status AverageInPlace(const std::vector<float*>& buffers) override;
  int64_t size() const override { return n_; }
  int num_towers() const override { return static_cast<int>(devices_.size()); }
  int num_gpus() const override { return static_cast<int>(groups_.size()); }

 private:
  std::vector<CudaDevice*> devices_;
  int64_t n_;
  std::vector<GpuGroup> groups_;
  std::vector<cudaEvent_t> ready_;  // per tower: its gradient is complete (recorded on its own stream)
};

GroupedAllReducer::~GroupedAllReducer() {
  for (GpuGroup& g : groups_) {
    cudaSetDevice(g.gpu);
    if (g.comm != nullptr) ncclCommDestroy(g.comm);
    if (g.done != nullptr) cudaEventDestroy(g.done);
  }
  for (size_t i = 0; i < ready_.size(); ++i) {
    if (ready_[i] == nullptr) continue;
    cudaSetDevice(devices_[i]->gpu());
    cudaEventDestroy(ready_[i]);
  }
}

absl::Status GroupedAllReducer::Init() {
  std::map<int, size_t> group_of_gpu;
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int gpu = devices_[i]->gpu();
    auto [it, inserted] = group_of_gpu.emplace(gpu, groups_.size());
    if (inserted) groups_.push_back(GpuGroup{gpu, {}, nullptr, nullptr});
    groups_[it->second].towers.push_back(static_cast<int>(i));
  }
  ready_.assign(devices_.size(), nullptr);
  for (size_t i = 0; i < devices_.size(); ++i) {
    RETURN_IF_ERROR(devices_[i]->Activate("CreateGradientAllReducer"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&ready_[i], cudaEventDisableTiming),
                               "CreateGradientAllReducer: cudaEventCreate"));
  }
  for (GpuGroup& g : groups_) {
    RETURN_IF_ERROR(devices_[g.towers[0]]->Activate("CreateGradientAllReducer"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&g.done, cudaEventDisableTiming),
                               "CreateGradientAllReducer: cudaEventCreate"));
  }
  if (groups_.size() > 1) {
    std::vector<int> gpus;
    for (const GpuGroup& g : groups_) gpus.push_back(g.gpu);
    std::vector<ncclComm_t> comms(gpus.size(), nullptr);
    RETURN_IF_ERROR(NcclStatus(ncclCommInitAll(comms.data(), static_cast<int>(gpus.size()), gpus.data()),
                               absl::StrCat("ncclCommInitAll over ", gpus.size(), " GPUs")));
    for (size_t k = 0; k < groups_.size(); ++k) groups_[k].comm = comms[k];
  }
  return absl::OkStatus();
}

absl::Status GroupedAllReducer::AverageInPlace(const std::vector<float*>& buffers) {
  if (buffers.size() != devices_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("AverageInPlace: ", buffers.size(), " buffers for ",
                                                   devices_.size(), " towers"));
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i] == nullptr) return absl::InvalidArgumentError(absl::StrCat("AverageInPlace: buffer ", i, " is null"));
  }
  if (devices_.size() == 1) return absl::OkStatus();

  // 1. Per GPU: wait for the other towers' gradients, then sum them into the leader's buffer.
  for (const GpuGroup& g : groups_) {
    CudaDevice* leader = devices_[g.towers[0]];
    for (size_t k = 1; k < g.towers.size(); ++k) {
      const int t = g.towers[k];
      RETURN_IF_ERROR(devices_[t]->Activate("AverageInPlace"));
      RETURN_IF_ERROR(CudaStatus(cudaEventRecord(ready_[t], devices_[t]->stream()), "AverageInPlace: event record"));
      RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(leader->stream(), ready_[t], 0), "AverageInPlace: event wait"));
    }
    for (size_t k = 1; k < g.towers.size(); ++k) {
      RETURN_IF_ERROR(leader->Axpy(1.0f, buffers[g.towers[k]], buffers[g.towers[0]], n_));
    }
  }
  // 2. Across GPUs: NCCL sum of the leaders' buffers, each on its leader's stream.
  if (groups_.size() > 1) {
    RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "AverageInPlace: ncclGroupStart"));
    for (const GpuGroup& g : groups_) {
      const int t = g.towers[0];
      const ncclResult_t r = ncclAllReduce(buffers[t], buffers[t], static_cast<size_t>(n_), ncclFloat, ncclSum,
                                           g.comm, devices_[t]->stream());
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return NcclStatus(r, "AverageInPlace: ncclAllReduce");
      }
    }
    RETURN_IF_ERROR(NcclStatus(ncclGroupEnd(), "AverageInPlace: ncclGroupEnd"));
  }
  // 3. Per GPU: scale to the mean, copy it to the other towers, and order their streams after the copies.
  const float inv = 1.0f / static_cast<float>(devices_.size());
  for (const GpuGroup& g : groups_) {
    CudaDevice* leader = devices_[g.towers[0]];
    float* mean = buffers[g.towers[0]];
    RETURN_IF_ERROR(leader->Scale(inv, mean, mean, n_));
    if (g.towers.size() == 1) continue;
    for (size_t k = 1; k < g.towers.size(); ++k) RETURN_IF_ERROR(leader->CopyOnDevice(mean, buffers[g.towers[k]], n_));
    RETURN_IF_ERROR(leader->Activate("AverageInPlace"));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(g.done, leader->stream()), "AverageInPlace: event record"));
    for (size_t k = 1; k < g.towers.size(); ++k) {
      RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(devices_[g.towers[k]]->stream(), g.done, 0),
                                 "AverageInPlace: event wait"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GradientAllReducer>> CreateGradientAllReducer(std::vector<Device*> devices,
                                                                             int64_t n) {
  if (devices.empty()) return absl::InvalidArgumentError("CreateGradientAllReducer: no devices");
  if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("CreateGradientAllReducer: n must be positive, got ", n));
  std::vector<CudaDevice*> cuda_devices;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto* d = dynamic_cast<CudaDevice*>(devices[i]);
    if (d == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("CreateGradientAllReducer: device ", i, " (",
                                                     devices[i] == nullptr ? "null" : devices[i]->name(),
                                                     ") is not a CUDA device"));
    }
    for (CudaDevice* seen : cuda_devices) {
      if (seen == d) {
        return absl::InvalidArgumentError(
            absl::StrCat("CreateGradientAllReducer: device ", d->name(), " is listed twice"));
      }
    }
    cuda_devices.push_back(d);
  }
  auto reducer = std::make_unique<GroupedAllReducer>(std::move(cuda_devices), n);
  RETURN_IF_ERROR(reducer->Init());
  return std::unique_ptr<GradientAllReducer>(std::move(reducer));
}

}  // namespace dtrain::kernels::cuda
