// Local training with the training state on the towers' devices (GPU towers in --job_name=local and in
// dtrain_bench): variables, optimizer slots and moving averages live on the devices (worker/train/device_state.h),
// and a step is forward + backward + per-layer averaging across towers + the device optimizer + the step
// counters' increment, all enqueued on the devices. Nothing crosses to the host per step except the staged
// inputs: the losses collect in a ring on each device (Device::CopyToCounterSlot) and are read back at
// logging steps (TakeLosses); the host copies the state only to save a checkpoint, to evaluate with the
// moving averages (a device copy), and at the end.
//
// CUDA graphs (options.cuda_graphs, GPU towers): the first step runs eagerly (libraries load their kernels),
// the second is captured (one graph over every tower's compute stream, forked and joined by events:
// kernels::BeginCaptureGroup) and launched, and every later step replays it: one launch a step. Dropout and
// the optimizer read the step from device counters, so replays draw new masks and apply the right step. When
// capture fails, steps run eagerly and one log line says why.
//
// Checkpoints stay the in-process ps's (one checkpoint path, one format): the state starts from the ps's
// (initialized, or restored from the newest checkpoint by Register), and after every step the ps's schedule
// is asked whether a save is due (ParameterServer::CheckpointDue); if so tower 0's state is copied to the
// host and handed over (ImportState, which writes the checkpoint). Finish hands over the final state before
// the worker reports done, so the ps's final checkpoint holds it.
//
// Thread-safety: one thread drives it (the Towers use their own threads inside a step).
#ifndef DTRAIN_WORKER_TRAIN_RESIDENT_STEPS_H_
#define DTRAIN_WORKER_TRAIN_RESIDENT_STEPS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/async_readback.h"
#include "kernels/device.h"
#include "ps/core/parameter_server.h"
#include "worker/train/device_state.h"
#include "worker/towers/towers.h"
#include "worker/train/training_steps.h"

namespace dtrain::worker {

struct ResidentStepsOptions {
  bool cuda_graphs = true;  // capture and replay the step (GPU towers only; CPU towers always run eagerly)
  // Losses kept on each device before the host must read them (TakeLosses reads earlier; Step reads when the
  // ring is full, a host synchronization every this many steps at most).
  int loss_ring = 1024;
};

class ResidentSteps : public TrainingSteps {
 public:
  // `towers`: device-owned, made with TowersOptions::replicated; `ps`: the in-process ps the chief connected
  // (holding the initial or restored state); both outlive the steps. InvalidArgument for host-resident towers
  // or bad params; device errors as reported.
  static absl::StatusOr<std::unique_ptr<ResidentSteps>> Create(Towers* towers, ps::ParameterServer* ps,
                                                               const kernels::OptimizerParams& params,
                                                               const ResidentStepsOptions& options);
  ~ResidentSteps() override;

  // Loads the ps's state onto the devices.
  absl::StatusOr<ps::PullResult> Start() override;
  // Stages the inputs and enqueues (or replays) the step; saves a checkpoint when the ps's schedule says so.
  // Returns once the step is enqueued, except about every loss_ring steps (the loss ring is read) and when
  // the host runs two steps ahead of the devices (input staging waits for them).
  absl::Status Step(const std::vector<models::HostBatch>& batches, int64_t step) override;
  absl::StatusOr<ps::PullResult> NextStep() override { return ps::PullResult{step_, false}; }
  absl::StatusOr<std::vector<float>> TakeLosses() override;
  absl::StatusOr<ps::PullResult> Settle() override;
  absl::StatusOr<ps::PullResult> PullNewest() override { return ps::PullResult{step_, false}; }
  absl::Status LoadParameters(bool moving_averages) override;
  absl::StatusOr<std::vector<float>> Parameters() override;
  absl::Status Finish() override;

  // Whether steps replay a CUDA graph (after the second step).
  bool graph_captured() const { return graph_ != nullptr; }

 private:
  ResidentSteps(Towers* towers, ps::ParameterServer* ps, const ResidentStepsOptions& options)
      : towers_(towers), ps_(ps), options_(options) {}
  // Stages every tower's inputs; with several towers, orders them across the devices (a graph runs on tower
  // 0's stream, the other towers' staging on theirs).
  absl::Status StageInputs(const std::vector<models::HostBatch>& batches);
  // The step on the devices: gradients averaged per layer, Join, the updates, each loss into its ring, the
  // counters' increment. Capturable.
  absl::Status EnqueueStep();
  // Captures EnqueueStep into graph_ (the step is not run).
  absl::Status Capture();
  // Reads the rings and appends the pending steps' losses (mean over towers) to losses_.
  absl::Status DrainLosses();

  Towers* towers_;
  ps::ParameterServer* ps_;
  const ResidentStepsOptions options_;
  std::vector<kernels::Device*> devices_;
  std::unique_ptr<DeviceState> state_;
  std::vector<float*> rings_;  // per tower: loss_ring floats on its device
  std::vector<std::unique_ptr<kernels::AsyncReadback>> ring_readers_;
  std::unique_ptr<kernels::Event> replayed_;                   // tower 0: after the last graph launch
  std::vector<std::unique_ptr<kernels::Event>> inputs_ready_;  // per tower > 0: its inputs are staged
  std::unique_ptr<kernels::Graph> graph_;
  bool try_graph_ = false;
  int64_t step_ = 0;  // the global step (of the next step to run)
  int64_t local_steps_ = 0;
  int64_t pending_ = 0;  // steps whose losses are still only in the rings
  std::vector<float> losses_;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_RESIDENT_STEPS_H_
