#include "worker/train/make_training_steps.h"

#include <utility>

#include "common/status_macros.h"
#include "worker/train/device_state.h"
#include "worker/train/resident_steps.h"
#include "worker/train/step_runner.h"

namespace dtrain::worker {

absl::StatusOr<std::unique_ptr<TrainingSteps>> MakeTrainingSteps(Towers* towers, ps::WorkerClient* client,
                                                                 const TrainingStepsOptions& options) {
  if (options.local_ps == nullptr) {
    auto runner = std::make_unique<StepRunner>(towers, client, options.sync, options.row_cache_rows,
                                               options.row_cache_staleness, options.kill_mid_push_at_step,
                                               options.tune_apply_early);
    runner->set_profile(options.profile);
    runner->set_trace(options.trace);
    runner->set_metrics(options.metrics);
    return std::unique_ptr<TrainingSteps>(std::move(runner));
  }
  ASSIGN_OR_RETURN(kernels::OptimizerParams params, DeviceOptimizerParams(options.config));
  ResidentStepsOptions ro;
  ro.cuda_graphs = options.cuda_graphs;
  ASSIGN_OR_RETURN(std::unique_ptr<ResidentSteps> steps,
                   ResidentSteps::Create(towers, options.local_ps, params, ro));
  return std::unique_ptr<TrainingSteps>(std::move(steps));
}

}  // namespace dtrain::worker
