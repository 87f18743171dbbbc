#include "kernels/cuda/nccl_allreduce.h"

#include <nccl.h>

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_device_internal.h"
#include "kernels/cuda/cuda_kernels.h"
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
  std::vector<int> towers;      // indices into devices_
  cudaStream_t comm = nullptr;  // the averager's stream on this GPU
  cudaEvent_t done = nullptr;   // recorded on `comm` by Join
  cudaEvent_t averaged = nullptr;  // recorded on `comm` by WaitForAverages
  ncclComm_t nccl = nullptr;    // only with several GPUs
};

class NcclGradientAverager final : public GradientAverager {
 public:
  NcclGradientAverager(std::vector<CudaDevice*> devices, int64_t n, AverageTarget target)
      : devices_(std::move(devices)), n_(n), target_(target) {}
  ~NcclGradientAverager() override;

  absl::Status Init();
  absl::Status AverageRange(const std::vector<float*>& buffers, int64_t offset, int64_t count) override;
  absl::Status Join() override;
  absl::Status WaitForAverages(int tower, Queue q) override;
  int64_t size() const override { return n_; }
  int num_towers() const override { return static_cast<int>(devices_.size()); }

 private:
  std::vector<CudaDevice*> devices_;
  int64_t n_;
  AverageTarget target_;
  std::vector<GpuGroup> groups_;
  std::vector<size_t> group_of_tower_;  // index into groups_
  std::vector<cudaEvent_t> ready_;  // per tower: recorded on its compute stream by AverageRange
  bool pending_ = false;            // averages enqueued since the last Join
};

NcclGradientAverager::~NcclGradientAverager() {
  for (GpuGroup& g : groups_) {
    cudaSetDevice(g.gpu);
    if (g.comm != nullptr) cudaStreamSynchronize(g.comm);
    if (g.nccl != nullptr) ncclCommDestroy(g.nccl);
    if (g.done != nullptr) cudaEventDestroy(g.done);
    if (g.averaged != nullptr) cudaEventDestroy(g.averaged);
    if (g.comm != nullptr) cudaStreamDestroy(g.comm);
  }
  for (size_t i = 0; i < ready_.size(); ++i) {
    if (ready_[i] == nullptr) continue;
    cudaSetDevice(devices_[i]->gpu());
    cudaEventDestroy(ready_[i]);
  }
}

absl::Status NcclGradientAverager::Init() {
  std::map<int, size_t> group_of_gpu;
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int gpu = devices_[i]->gpu();
    auto [it, inserted] = group_of_gpu.emplace(gpu, groups_.size());
    if (inserted) groups_.push_back(GpuGroup{gpu, {}, nullptr, nullptr, nullptr, nullptr});
    groups_[it->second].towers.push_back(static_cast<int>(i));
    group_of_tower_.push_back(it->second);
  }
  ready_.assign(devices_.size(), nullptr);
  for (size_t i = 0; i < devices_.size(); ++i) {
    RETURN_IF_ERROR(devices_[i]->NotCapturing("CreateGradientAverager"));
    RETURN_IF_ERROR(devices_[i]->Activate("CreateGradientAverager"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&ready_[i], cudaEventDisableTiming),
                               "CreateGradientAverager: cudaEventCreate"));
  }
  for (GpuGroup& g : groups_) {
    RETURN_IF_ERROR(devices_[g.towers[0]]->Activate("CreateGradientAverager"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&g.comm, cudaStreamNonBlocking),
                               "CreateGradientAverager: cudaStreamCreate"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&g.done, cudaEventDisableTiming),
                               "CreateGradientAverager: cudaEventCreate"));
    RETURN_IF_ERROR(CudaStatus(cudaEventCreateWithFlags(&g.averaged, cudaEventDisableTiming),
                               "CreateGradientAverager: cudaEventCreate"));
  }
  if (groups_.size() > 1) {
    std::vector<int> gpus;
    for (const GpuGroup& g : groups_) gpus.push_back(g.gpu);
    std::vector<ncclComm_t> comms(gpus.size(), nullptr);
    RETURN_IF_ERROR(NcclStatus(ncclCommInitAll(comms.data(), static_cast<int>(gpus.size()), gpus.data()),
                               absl::StrCat("ncclCommInitAll over ", gpus.size(), " GPUs")));
    for (size_t k = 0; k < groups_.size(); ++k) groups_[k].nccl = comms[k];
  }
  return absl::OkStatus();
}

absl::Status NcclGradientAverager::AverageRange(const std::vector<float*>& buffers, int64_t offset,
                                                int64_t count) {
  RETURN_IF_ERROR(CheckArguments(buffers, offset, count));
  if (devices_.size() == 1 || count == 0) return absl::OkStatus();
  pending_ = true;

  // 1. Per GPU: the communication stream waits for every tower's work enqueued so far, then sums the other
  // towers'
  //    ranges into the leader's.
  for (const GpuGroup& g : groups_) {
    for (int t : g.towers) {
      RETURN_IF_ERROR(devices_[t]->Activate("AverageRange"));
      RETURN_IF_ERROR(
          CudaStatus(cudaEventRecord(ready_[t], devices_[t]->stream()), "AverageRange: event record"));
      RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(g.comm, ready_[t], 0), "AverageRange: event wait"));
    }
    float* sum = buffers[g.towers[0]] + offset;
    for (size_t k = 1; k < g.towers.size(); ++k) {
      RETURN_IF_ERROR(CudaStatus(LaunchAxpy(1.0f, buffers[g.towers[k]] + offset, sum, count, g.comm),
                                 "AverageRange: sum of the towers on one GPU (Axpy)"));
    }
  }
  // 2. Across GPUs: NCCL sum of the leaders' ranges, each on its group's communication stream.
  if (groups_.size() > 1) {
    RETURN_IF_ERROR(NcclStatus(ncclGroupStart(), "AverageRange: ncclGroupStart"));
    for (const GpuGroup& g : groups_) {
      float* sum = buffers[g.towers[0]] + offset;
      const ncclResult_t r =
          ncclAllReduce(sum, sum, static_cast<size_t>(count), ncclFloat, ncclSum, g.nccl, g.comm);
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return NcclStatus(r, "AverageRange: ncclAllReduce");
      }
    }
    RETURN_IF_ERROR(NcclStatus(ncclGroupEnd(), "AverageRange: ncclGroupEnd"));
  }
  // 3. Per GPU: scale to the mean and copy it to the other towers (only tower 0's group with kFirstTower;
  // tower 0
  //    leads the first group).
  const float inv = 1.0f / static_cast<float>(devices_.size());
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const GpuGroup& g = groups_[gi];
    if (target_ == AverageTarget::kFirstTower && gi > 0) continue;
    RETURN_IF_ERROR(devices_[g.towers[0]]->Activate("AverageRange"));
    float* mean = buffers[g.towers[0]] + offset;
    RETURN_IF_ERROR(
        CudaStatus(LaunchScale(inv, mean, mean, count, g.comm), "AverageRange: scale to the mean"));
    if (target_ == AverageTarget::kFirstTower) continue;
    for (size_t k = 1; k < g.towers.size(); ++k) {
      RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(buffers[g.towers[k]] + offset, mean, count * sizeof(float),
                                                 cudaMemcpyDeviceToDevice, g.comm),
                                 "AverageRange: copy of the mean to a tower"));
    }
  }
  return absl::OkStatus();
}

absl::Status NcclGradientAverager::Join() {
  if (!pending_) return absl::OkStatus();
  // Every tower waits, also with kFirstTower: the communication stream read the other towers' buffers, which
  // their next backward must not overwrite before.
  for (const GpuGroup& g : groups_) {
    RETURN_IF_ERROR(devices_[g.towers[0]]->Activate("GradientAverager::Join"));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(g.done, g.comm), "GradientAverager::Join: event record"));
    for (int t : g.towers) {
      RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(devices_[t]->stream(), g.done, 0),
                                 "GradientAverager::Join: event wait"));
    }
  }
  pending_ = false;
  return absl::OkStatus();
}

absl::Status NcclGradientAverager::WaitForAverages(int tower, Queue q) {
  if (tower < 0 || tower >= static_cast<int>(devices_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("GradientAverager::WaitForAverages: no tower ", tower));
  }
  if (devices_.size() == 1) return absl::OkStatus();  // AverageRange enqueues nothing for one tower
  const GpuGroup& g = groups_[group_of_tower_[tower]];
  RETURN_IF_ERROR(devices_[g.towers[0]]->Activate("GradientAverager::WaitForAverages"));
  RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(g.averaged, g.comm), "GradientAverager::WaitForAverages: event record"));
  RETURN_IF_ERROR(devices_[tower]->Activate("GradientAverager::WaitForAverages"));
  return CudaStatus(cudaStreamWaitEvent(devices_[tower]->queue(q), g.averaged, 0),
                    "GradientAverager::WaitForAverages: event wait");
}

}  // namespace

absl::StatusOr<std::unique_ptr<GradientAverager>> CreateNcclGradientAverager(std::vector<Device*> devices,
                                                                             int64_t n,
                                                                             AverageTarget target) {
  std::vector<CudaDevice*> cuda_devices;
  for (size_t i = 0; i < devices.size(); ++i) {
    auto* d = dynamic_cast<CudaDevice*>(devices[i]);
    if (d == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("CreateGradientAverager: device ", i, " (",
                                                     devices[i] == nullptr ? "null" : devices[i]->name(),
                                                     ") is not a CUDA device"));
    }
    cuda_devices.push_back(d);
  }
  auto averager = std::make_unique<NcclGradientAverager>(std::move(cuda_devices), n, target);
  RETURN_IF_ERROR(averager->Init());
  return std::unique_ptr<GradientAverager>(std::move(averager));
}

}  // namespace dtrain::kernels::cuda
