// Local towers: one model replica per device (CPU towers share the worker's threads; GPU towers one per GPU),
// each on its own batch; their gradients are averaged (the seeds' average_gradients).
//
// Two kinds of towers:
// - Host-resident (CPU towers, by default): the models compute straight on the flat host parameter buffer
//   (shared by every tower) and tower 0 writes its gradients straight into the flat host gradient buffer:
//   nothing is copied per step. A step's hooks run layer by layer as the towers compute.
// - Device-owned (GPU towers; CPU towers with TowersOptions::cpu_in_place = false, so that tests run this
// path
//   on the CPU backend): each model owns its parameters and gradients in device memory. A step is *enqueued*:
//   inputs are staged through pinned memory (InputStager), forward and backward are enqueued on each tower's
//   compute queue, each layer's gradients are averaged across towers (GradientAverager::AverageRange, the
//   towers' threads meeting layer by layer) while backward goes on, and nothing waits on the host except
//   what a caller's hooks wait for. Two users:
//     * ComputeGradients (a worker in a cluster): each layer's parameters are uploaded on the copy queue as
//       soon as the pull has brought them (before_forward), each layer's averaged gradients are copied to the
//       pinned host buffer on the copy queue as soon as backward has produced them, and gradients_ready fires
//       when that copy has landed (the compute queues never wait for it).
//     * local device-resident training (worker/train/resident_steps.h): StageInputs + EnqueueGradients + the
//       optimizer on the devices, with no host copy at all (TowersOptions::replicated).
//
// Thread-safety: a Towers object is driven by one thread; it runs the towers on its own threads.
#ifndef DTRAIN_WORKER_TOWERS_TOWERS_H_
#define DTRAIN_WORKER_TOWERS_TOWERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/host_memory.h"
#include "kernels/async_readback.h"
#include "kernels/device.h"
#include "kernels/gradient_averager.h"
#include "worker/towers/input_stager.h"
#include "worker/models/model.h"

namespace dtrain::worker {

// Parses --towers: "" or "1" → one CPU tower; "N" → N CPU towers; "cpu,cpu" likewise; "gpu:0,gpu:1" → GPU
// towers (a GPU may appear twice). `num_gpus` > 0 means gpu:0..num_gpus-1 and overrides an empty --towers.
// CPU towers split `threads` among themselves (at least one each). Every tower computes in `dtype`.
// InvalidArgument on a malformed list.
absl::StatusOr<std::vector<kernels::DeviceSpec>> ParseTowers(
    const std::string& towers, int num_gpus, int threads,
    kernels::ComputeDtype dtype = kernels::ComputeDtype::kFp32);

struct TowersOptions {
  // CPU towers compute in place on the host buffers (nothing copied). false: each CPU tower's model owns
  // its buffers like a GPU tower's, so the device-owned paths run on the CPU backend (tests).
  bool cpu_in_place = true;
  // Every tower applies the update to its own copy of the training state (local device-resident training),
  // so each layer's average lands in every tower's gradients. false: in tower 0's only (copied to the host).
  bool replicated = false;
  // Where host-resident (CPU) towers keep host_params() and host_grads(); null: the device's host memory.
  // A worker whose ps tasks share its memory (ps/shm/) passes theirs, so that pushes and pulls copy nothing.
  // Not used for GPU towers (their host buffers are pinned). Must outlive the towers.
  HostMemory* host_memory = nullptr;
};

class Towers {
 public:
  // Makes one device and one model per spec. FailedPrecondition "no CUDA device available: ..." when a GPU
  // tower cannot be made.
  static absl::StatusOr<std::unique_ptr<Towers>> Create(const models::ModelSpec& model,
                                                        const models::ModelOptions& options,
                                                        const std::vector<kernels::DeviceSpec>& specs,
                                                        const TowersOptions& towers_options = {});
  ~Towers();

  int size() const { return static_cast<int>(models_.size()); }
  models::Model* tower(int i) { return models_[i].get(); }
  kernels::Device* device(int i) { return devices_[i].get(); }
  int64_t num_parameters() const { return models_[0]->num_parameters(); }
  // With bf16 compute, what the first tower's ops compute in (kernels::Device::PrecisionReport; the towers
  // run the same ops); empty in fp32. Complete once a step has run (ops are made as the first one runs).
  std::string PrecisionReport() const { return devices_[0]->PrecisionReport(); }
  // Whether the towers read host_params() and write host_grads() in place (CPU towers by default).
  bool host_resident() const { return host_resident_; }
  // Whether every tower is a GPU.
  bool gpu() const { return gpu_; }

  // The flat parameters and gradients on the host (num_parameters() floats each), allocated through tower 0's
  // device: pinned memory for GPU towers, so the host<->device copies are fast DMA.
  float* host_params() { return host_params_; }
  float* host_grads() { return host_grads_; }

  // Makes the towers compute with `params` (flat, host) from now on: copies them to every device-owned tower;
  // for host-resident towers copies them into host_params() unless they are host_params() already.
  absl::Status SetParameters(const float* params);

  // Runs tower i on batches[i] in parallel with the parameters in host_params(); writes the averaged flat
  // gradient to host_grads() and returns the mean loss. batches.size() must equal size(). `hooks` (may be
  // null; see models::StepHooks): before_forward runs per layer (on several tower threads at once) before
  // the layer's parameters are read from host_params(); after_forward runs before any gradients_ready, with
  // each tower's loss (host-resident towers) or once with the mean loss (device-owned towers, once it has
  // been read back); gradients_ready runs once per layer range, one call at a time, last layer first, when
  // the average of every tower's gradient of the range is in host_grads() (device-owned towers: when its
  // download has landed).
  absl::StatusOr<float> ComputeGradients(const std::vector<models::HostBatch>& batches, int64_t step,
                                         const models::StepHooks* hooks = nullptr);

  // ---- device-owned towers: steps enqueued on the devices (see the header comment) ----
  // Tower i's step counter: dropout's counter is *counter * 64 + i (as ComputeGradients' step * 64 + i);
  // the device optimizer of resident training reads and increments it.
  kernels::DeviceCounter* step_counter(int i) { return counters_[i].get(); }
  // Averages the towers' gradients (null with one tower).
  kernels::GradientAverager* averager() { return averager_.get(); }
  // Checks batches[i] against tower i's model and stages it into the model's inputs (InputStager).
  absl::Status StageInputs(const std::vector<models::HostBatch>& batches);
  // Hooks of EnqueueGradients, all optional, called on the host while the step is enqueued.
  struct EnqueueHooks {
    // Tower t is about to enqueue the forward of the layer whose variables are [begin, end) (tower threads).
    std::function<absl::Status(int tower, int64_t begin, int64_t end)> before_forward;
    // Tower t has enqueued its loss (Model::device_loss()) (tower threads).
    std::function<absl::Status(int tower)> loss_enqueued;
    // Every tower has enqueued its final gradients of [begin, end) and, with several towers, their average
    // has been enqueued (one call at a time, last layer first).
    std::function<absl::Status(int64_t begin, int64_t end)> range_averaged;
  };
  // Enqueues forward + backward on every tower, on the staged inputs, averaging each layer's gradients as
  // soon as every tower has enqueued them. With several towers the towers' threads meet once per layer, so
  // each average waits only for that layer's work. Does not Join the averages (averager()->Join()). Never
  // allocates nor synchronizes with the host (given hooks that do neither): capturable.
  absl::Status EnqueueGradients(const EnqueueHooks* hooks);

 private:
  Towers() = default;
  absl::StatusOr<float> ComputeResident(const std::vector<models::HostBatch>& batches, int64_t step,
                                        const models::StepHooks* hooks);
  absl::StatusOr<float> ComputeOnDevices(const std::vector<models::HostBatch>& batches, int64_t step,
                                         const models::StepHooks* hooks);
  // Events reused every step (made on first use: nothing is made after the first step).
  kernels::Event* PooledEvent(std::vector<std::unique_ptr<kernels::Event>>* pool, size_t index,
                              kernels::Device* dev, absl::Status* status);

  std::vector<std::unique_ptr<kernels::Device>> devices_;
  std::vector<std::unique_ptr<models::Model>> models_;
  bool host_resident_ = false;
  bool gpu_ = false;
  float* host_params_ = nullptr;
  float* host_grads_ = nullptr;
  HostMemory* host_memory_ = nullptr;  // where host_params_ and host_grads_ come from (null: devices_[0])
  std::vector<float*> tower_grads_;  // host-resident towers 1..n-1: their own gradient buffers
  std::unique_ptr<kernels::GradientAverager> averager_;
  // Device-owned towers.
  std::vector<std::unique_ptr<kernels::DeviceCounter>> counters_;
  std::vector<std::unique_ptr<InputStager>> stagers_;
  std::vector<std::unique_ptr<kernels::AsyncReadback>> loss_readers_;   // ComputeOnDevices: each tower's loss
  std::vector<std::vector<std::unique_ptr<kernels::Event>>> uploaded_;  // per tower, per layer range
  std::vector<std::unique_ptr<kernels::Event>> produced_;               // tower 0, per range: grads enqueued
  std::vector<std::unique_ptr<kernels::Event>> downloaded_;             // tower 0, per range: on the host
  std::vector<std::unique_ptr<kernels::Event>> step_done_;              // per tower: end of its compute
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TOWERS_TOWERS_H_
