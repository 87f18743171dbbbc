// The training state of a local run kept on the towers' devices (worker/train/resident_steps.h): the variables are
// each tower's model parameters (Model::device_parameters()); beside them each tower has its optimizer slots
// and a DeviceOptimizer that reads the tower's step counter (Towers::step_counter), and tower 0 the moving
// averages. Every tower applies the same averaged gradients to its own copy (Towers made with
// TowersOptions::replicated), so the copies stay equal bit for bit and tower 0's is the one read back.
//
// Device-neutral: on GPU towers the state is in GPU memory and the updates are CUDA kernels; with CPU towers
// (device-owned, for tests) the same code runs on the CPU backend, whose optimizer is the parameter server's
// arithmetic (kernels/optimizer_math.h), so a run here equals today's local mode bit for bit.
//
// The host sees the state only when asked (Load at the start, Export for a checkpoint or at the end,
// ExportValues for the final parameters, UseMovingAverages for evaluation): never per step.
//
//   ASSIGN_OR_RETURN(auto state, DeviceState::Create(towers, params));
//   ASSIGN_OR_RETURN(ps::CheckpointData start, local_ps->ExportState());
//   RETURN_IF_ERROR(state->Load(start));
//   per step, after the towers' gradients are averaged: RETURN_IF_ERROR(state->EnqueueUpdates());
//   (with clip_norm > 0 each tower first gathers the global norm of its averaged gradient on its device)
//                                                      (then the step counters' Increment)
//   ASSIGN_OR_RETURN(std::vector<ps::SliceState> slices, state->Export());
//
// Thread-safety: driven by the thread that drives the Towers.
#ifndef DTRAIN_WORKER_TRAIN_DEVICE_STATE_H_
#define DTRAIN_WORKER_TRAIN_DEVICE_STATE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/optimizer_ops.h"
#include "ps/checkpoint/checkpoint_format.h"
#include "ps/api/ps_types.h"
#include "worker/towers/towers.h"

namespace dtrain::worker {

// The device optimizer's hyperparameters for a ps config (ps::ToOptimizerParams: InvalidArgument for an unknown
// optimizer name or an out-of-range value).
absl::StatusOr<kernels::OptimizerParams> DeviceOptimizerParams(const ps::TrainConfig& config);

class DeviceState {
 public:
  // Allocates the slots (and tower 0's moving averages when params.moving_average_decay > 0) and makes each
  // tower's optimizer. `towers` (device-owned, not host_resident()) must outlive the state. InvalidArgument
  // for host-resident towers or bad params; device errors (out of memory) as the device reports them.
  static absl::StatusOr<std::unique_ptr<DeviceState>> Create(Towers* towers,
                                                             const kernels::OptimizerParams& params);
  ~DeviceState();
  DeviceState(const DeviceState&) = delete;
  DeviceState& operator=(const DeviceState&) = delete;

  // Loads a ps task's whole state (ps::ParameterServer::ExportState, whose slices cover the flat buffer) onto
  // every tower: values, slots, and on tower 0 the moving averages (the values when `state` has none), and
  // sets every step counter to state.task_step. Remembers the slices' layout for Export. FailedPrecondition
  // when the state does not fit (number of slots, a slice outside the flat buffer, a gap).
  absl::Status Load(const ps::CheckpointData& state);
  // Enqueues each tower's update from its (averaged) gradients at the step its counter holds; the caller then
  // increments the counters. Never synchronizes nor allocates: capturable.
  absl::Status EnqueueUpdates();
  // Tower 0's state, cut into the slices Load saw (values, slots, moving averages). Synchronizes tower 0.
  absl::StatusOr<std::vector<ps::SliceState>> Export();
  // Tower 0's variables (flat). Synchronizes tower 0.
  absl::StatusOr<std::vector<float>> ExportValues();
  // Tower 0 computes with the moving averages (true) or with the variables (false) from now on: for
  // evaluating the averages. The variables are kept aside meanwhile (and Export/ExportValues read them
  // there). Steps must not run while the averages are in use. FailedPrecondition without moving averages.
  absl::Status UseMovingAverages(bool use);
  bool has_moving_averages() const { return shadow_ != nullptr; }

 private:
  struct TowerState {
    float* slots[3] = {nullptr, nullptr, nullptr};  // params.num_slots() of them
    std::unique_ptr<kernels::DeviceOptimizer> optimizer;
  };
  DeviceState(Towers* towers, const kernels::OptimizerParams& params);
  // Tower 0's variables: the parameters, or where they are kept while the moving averages are in use.
  const float* values0();

  Towers* towers_;
  kernels::OptimizerParams params_;
  int64_t n_ = 0;
  std::vector<TowerState> state_;
  // The flat buffer as runs of trainable variables and of state, in order.
  struct Run {
    int64_t offset = 0, size = 0;
    bool trainable = true;
  };
  std::vector<Run> runs_;
  float* shadow_ = nullptr;       // tower 0's moving averages
  float* kept_values_ = nullptr;  // tower 0's variables while the moving averages are in use
  bool using_averages_ = false;
  std::vector<ps::SliceSpec> layout_;  // from Load
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_DEVICE_STATE_H_
