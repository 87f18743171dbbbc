// Local towers: one model replica per device (CPU towers share the worker's threads; GPU towers one per GPU),
// each on its own batch; their gradients are averaged before the push (the seeds' average_gradients).
//
// Thread-safety: a Towers object is driven by one thread; it runs the towers on its own threads.
#ifndef DTRAIN_WORKER_TOWERS_H_
#define DTRAIN_WORKER_TOWERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/models/model.h"

namespace dtrain::worker {

// Parses --towers: "" or "1" → one CPU tower; "N" → N CPU towers; "cpu,cpu" likewise; "gpu:0,gpu:1" → GPU
// towers (a GPU may appear twice). `num_gpus` > 0 means gpu:0..num_gpus-1 and overrides an empty --towers.
// CPU towers split `threads` among themselves (at least one each). InvalidArgument on a malformed list.
absl::StatusOr<std::vector<kernels::DeviceSpec>> ParseTowers(const std::string& towers, int num_gpus,
                                                             int threads);

// CPU towers run on host threads and average their host gradients. GPU towers (all of them GPUs) keep their
// gradients on the devices: they are averaged there (NCCL all-reduce across GPUs, device copies for towers sharing
// a GPU) and tower 0's average is copied to the host once per step for the push.
class Towers {
 public:
  // Makes one device and one model per spec. FailedPrecondition "no CUDA device available: ..." when a GPU
  // tower cannot be made.
  static absl::StatusOr<std::unique_ptr<Towers>> Create(const std::string& model_name,
                                                        const models::ModelOptions& options,
                                                        const std::vector<kernels::DeviceSpec>& specs);
  ~Towers();

  int size() const { return static_cast<int>(models_.size()); }
  models::Model* tower(int i) { return models_[i].get(); }
  int64_t num_parameters() const { return models_[0]->num_parameters(); }

  // Host staging buffers for the flat parameters and gradients (num_parameters() floats each), allocated through
  // tower 0's device: pinned memory for GPU towers, so the once-per-step host<->device copies are fast DMA.
  float* host_params() { return host_params_; }
  float* host_grads() { return host_grads_; }

  // Copies the flat parameters to every tower.
  absl::Status SetParameters(const float* params);
  // Runs tower i on batches[i] in parallel; writes the averaged flat gradient to `grads` and returns the mean
  // loss. batches.size() must equal size().
  absl::StatusOr<float> ComputeGradients(const std::vector<models::HostBatch>& batches, int64_t step,
                                         float* grads);

 private:
  Towers() = default;
  std::vector<std::unique_ptr<kernels::Device>> devices_;
  std::vector<std::unique_ptr<models::Model>> models_;
  float* host_params_ = nullptr;
  float* host_grads_ = nullptr;
  std::vector<std::vector<float>> tower_grads_;  // towers 1..n-1 (tower 0 writes straight into the output)
  // GPU towers: gradients are averaged on the devices (NCCL across GPUs) and copied back once per step.
  struct DeviceAverager;
  std::unique_ptr<DeviceAverager> device_averager_;
  absl::StatusOr<float> ComputeOnDevices(const std::vector<models::HostBatch>& batches, int64_t step,
                                         float* grads);
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TOWERS_H_
