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

// CPU towers compute straight from the flat host parameter buffer (shared by every tower) and tower 0 writes
// its gradients straight into the flat host gradient buffer: nothing is copied per step, and a step's hooks run
// layer by layer (parameters awaited layer by layer, gradients handed on layer by layer once every tower's are
// averaged). GPU towers (all of them GPUs) copy the parameters in at the start of a step and keep their
// gradients on the devices: they are averaged there (NCCL all-reduce across GPUs, device copies for towers
// sharing a GPU) and tower 0's average is copied to the host once per step.
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
  // Whether the towers read host_params() and write host_grads() in place (CPU towers).
  bool host_resident() const { return host_resident_; }

  // The flat parameters and gradients on the host (num_parameters() floats each), allocated through tower 0's
  // device: pinned memory for GPU towers, so the host<->device copies are fast DMA.
  float* host_params() { return host_params_; }
  float* host_grads() { return host_grads_; }

  // Makes the towers compute with `params` (flat) from now on: copies them to every GPU tower; for CPU towers
  // copies them into host_params() unless they are host_params() already.
  absl::Status SetParameters(const float* params);
  // Runs tower i on batches[i] in parallel with the parameters in host_params(); writes the averaged flat
  // gradient to host_grads() and returns the mean loss. batches.size() must equal size(). `hooks` (may be
  // null; see models::StepHooks): before_forward may run on several tower threads at once; after_forward runs
  // with each tower's loss; gradients_ready runs once per range, one call at a time, when the average of every
  // tower's gradient of the range is in host_grads(). GPU towers await the whole range before the step and
  // report it whole after it.
  absl::StatusOr<float> ComputeGradients(const std::vector<models::HostBatch>& batches, int64_t step,
                                         const models::StepHooks* hooks = nullptr);

 private:
  Towers() = default;
  absl::StatusOr<float> ComputeResident(const std::vector<models::HostBatch>& batches, int64_t step,
                                        const models::StepHooks* hooks);
  absl::StatusOr<float> ComputeOnDevices(const std::vector<models::HostBatch>& batches, int64_t step,
                                         const models::StepHooks* hooks);

  std::vector<std::unique_ptr<kernels::Device>> devices_;
  std::vector<std::unique_ptr<models::Model>> models_;
  bool host_resident_ = false;
  float* host_params_ = nullptr;
  float* host_grads_ = nullptr;
  std::vector<float*> tower_grads_;  // CPU towers 1..n-1: their own gradient buffers (owned by their devices)
  // GPU towers: gradients are averaged on the devices (NCCL across GPUs) and copied back once per step.
  struct DeviceAverager;
  std::unique_ptr<DeviceAverager> device_averager_;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TOWERS_H_
