// Which TrainingSteps a run uses (worker/train/training_steps.h): the steps that push to and pull from the ps
// tasks (worker/train/step_runner.h), or, in local mode with device-owned towers, the device-resident steps
// (worker/train/resident_steps.h). Kept apart from the interface so that the interface knows neither.
#ifndef DTRAIN_WORKER_TRAIN_MAKE_TRAINING_STEPS_H_
#define DTRAIN_WORKER_TRAIN_MAKE_TRAINING_STEPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "ps/client/worker_client.h"
#include "ps/core/parameter_server.h"
#include "worker/towers/towers.h"
#include "common/trace_recorder.h"
#include "worker/train/profile_recorder.h"
#include "worker/train/step_metrics.h"
#include "worker/train/training_steps.h"

namespace dtrain::worker {

struct TrainingStepsOptions {
  bool sync = true;  // the cluster's mode (local mode is sync)
  // Local mode with device-owned towers (made with TowersOptions::replicated): the in-process ps the client
  // is connected to. Non-null selects the device-resident steps; null the steps that push and pull.
  ps::ParameterServer* local_ps = nullptr;
  ps::TrainConfig config;   // the registered config (the device optimizer's hyperparameters)
  bool cuda_graphs = true;  // device-resident steps on GPUs: capture the step as a CUDA graph
  // Test hook of the steps that push: SIGKILL this process at this step, right after the first range of
  // gradients was handed to the client (a worker killed in the middle of a push). -1: never.
  int64_t kill_mid_push_at_step = -1;
  // Steps that push and pull, models with tables: the worker's row cache (worker/batch/row_cache.h; 0 rows: none).
  int64_t row_cache_rows = 0;
  int row_cache_staleness = 0;
  // Steps that push and pull: measure whether pushes should ask for the early apply (--apply_early=auto).
  bool tune_apply_early = false;
  // Steps that push and pull: report each step's timings here (worker/train/profile_recorder.h; null: none).
  ProfileRecorder* profile = nullptr;
  // Steps that push and pull: record the steps of the trace's window on its timeline (common/trace_recorder.h;
  // null: none).
  TraceRecorder* trace = nullptr;
  // Steps that push and pull: count steps and examples and time each step's parts here (dtrain_worker
  // --metrics_port; worker/train/step_metrics.h; null: none).
  StepMetrics* metrics = nullptr;
};

// The steps for `towers` (both must outlive them): ResidentSteps with options.local_ps, else a StepRunner.
absl::StatusOr<std::unique_ptr<TrainingSteps>> MakeTrainingSteps(Towers* towers, ps::WorkerClient* client,
                                                                 const TrainingStepsOptions& options);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_MAKE_TRAINING_STEPS_H_
