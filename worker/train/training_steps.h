// The steps of a training run as the training loop (trainer.cc) and dtrain_bench drive them, whichever side
// holds the training state:
//   - the parameter servers (worker/train/step_runner.h): each step pushes gradients and pulls parameters, layer by
//     layer, overlapped with compute; the in-process ps of local mode with CPU towers too;
//   - the devices of a local run with GPU towers (worker/train/resident_steps.h): the optimizer runs on the devices
//     and a step crosses to the host only for a checkpoint; the in-process ps keeps checkpoint policy and
//     files.
//
//   ASSIGN_OR_RETURN(ps::PullResult at, steps->Start());
//   while (at.step < end && !at.training_done) {
//     RETURN_IF_ERROR(steps->Step(batches, at.step));
//     ASSIGN_OR_RETURN(at, steps->NextStep());
//     if (logging) ASSIGN_OR_RETURN(std::vector<float> losses, steps->TakeLosses());
//   }
//   ASSIGN_OR_RETURN(at, steps->Settle());
//   RETURN_IF_ERROR(steps->LoadParameters(/*moving_averages=*/false));   // evaluate tower 0
//
// Thread-safety: one thread drives a TrainingSteps.
#ifndef DTRAIN_WORKER_TRAIN_TRAINING_STEPS_H_
#define DTRAIN_WORKER_TRAIN_TRAINING_STEPS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/client/worker_client.h"
#include "worker/models/model.h"
#include "worker/towers/towers.h"

namespace dtrain::worker {

class TrainingSteps {
 public:
  virtual ~TrainingSteps() = default;

  // The step training starts from (blocking: the first pull, or the ps's state loaded onto the devices).
  virtual absl::StatusOr<ps::PullResult> Start() = 0;
  // Models with sparse tables: the batches (one per tower) of the step whose parameters the next pull brings —
  // before Start, the first step's; before Step, the following step's — so that the pull brings the rows of
  // their ids with the parameters. The views must stay valid until that step has run. Nothing for models
  // without tables.
  virtual absl::Status SetUpcomingBatches(const std::vector<models::HostBatch>& batches) {
    return absl::OkStatus();
  }
  // Models with sparse tables, after Settle: pulls the rows of `batch`'s ids for tower 0 (evaluation on that
  // batch), at the current step.
  virtual absl::Status LoadSparseRows(const models::HostBatch& batch) { return absl::OkStatus(); }
  // Models with sparse tables, after Settle (the chief, at the end, for export): every row of each fixed-size
  // table, rows * dim floats per table in Graph::tables order (empty for a hash table), at the current step.
  virtual absl::StatusOr<std::vector<std::vector<float>>> PullTables() {
    return std::vector<std::vector<float>>();
  }
  // Models with sparse tables: the unique ids over all tables of the last step that pushed its row gradients
  // (the rows it pulled and pushed); 0 before then and for models without tables.
  virtual int64_t last_step_unique_ids() const { return 0; }
  // Models with sparse tables: the rows' traffic of the steps so far (ids and rows this worker pulled and pushed;
  // a row cache serves some ids without a pull).
  struct SparseTraffic {
    int64_t steps = 0;
    int64_t ids_pulled = 0, ids_pushed = 0, ids_from_cache = 0;
    int64_t bytes_pulled = 0, bytes_pushed = 0;  // ids (8 bytes) and rows (fp32), as the wire carries them
  };
  virtual SparseTraffic sparse_traffic() const { return {}; }
  // Progressive validation (the chief of an online run): tower 0's logits on `batch` (its tower-0 batch of the
  // step about to run: the rows of its ids come with the pull in flight) with the parameters that step will train
  // on, into `logits` (batch.batch * outputs floats), before the step learns from it. Call between Start /
  // NextStep and Step. Unimplemented where the steps cannot (device-resident steps).
  virtual absl::Status ScoreBatch(const models::HostBatch& batch, float* logits) {
    return absl::UnimplementedError("progressive validation needs steps that push and pull (not device-resident)");
  }
  // Runs one step on `batches` (one per tower) with the parameters of `step`, the step Start / NextStep last
  // returned. Device-resident steps only enqueue it on the devices.
  virtual absl::Status Step(const std::vector<models::HostBatch>& batches, int64_t step) = 0;
  // Models with sparse tables in an elastic job: the current step's batches (one per tower and round) replace
  // the ones given to SetUpcomingBatches, whose rows the pull in flight brings (the step's view placed this worker
  // elsewhere: the workers changed). Lets that pull finish, then pulls the step's parameters again with the rows
  // of these batches' ids (blocking); returns that pull's result.
  virtual absl::StatusOr<ps::PullResult> RedrawCurrent(const std::vector<models::HostBatch>& batches) {
    return absl::UnimplementedError("drawing a step's batches again needs steps that push and pull");
  }
  // An elastic job with a global batch: one step on `batches`, rounds of one batch per tower (batches.size() a
  // multiple of the towers), whose gradients (each round's the towers' average) are summed and multiplied by
  // `scale` before they are pushed as the step's; the loss is the rounds' mean. Unimplemented where the steps
  // cannot (device-resident steps, models with sparse tables).
  virtual absl::Status StepRounds(const std::vector<models::HostBatch>& batches, int64_t step, float scale) {
    return absl::UnimplementedError("a step over several rounds of the towers needs steps that push and pull");
  }
  // The step of the next parameters, and whether training is over.
  virtual absl::StatusOr<ps::PullResult> NextStep() = 0;
  // The losses of the steps run since the last call, in order. Device-resident steps read them back from the
  // devices here (one host synchronization): call it at logging steps. A loss that is not finite is
  // InternalError "loss is X at step N: training diverged ..." (steps that push report it from Step, before
  // anything of the step is sent; device-resident steps here, when the update of that step has been applied).
  virtual absl::StatusOr<std::vector<float>> TakeLosses() = 0;
  // Waits until every step so far is complete and its parameters are in place; returns the current step.
  virtual absl::StatusOr<ps::PullResult> Settle() = 0;
  // After Settle (the chief, at the end): the newest parameters, which other workers may have moved since
  // the last pull; returns their step.
  virtual absl::StatusOr<ps::PullResult> PullNewest() = 0;
  // After Settle: tower 0 computes with the current parameters, or with their moving averages (for
  // evaluation; FailedPrecondition when none are kept).
  virtual absl::Status LoadParameters(bool moving_averages) = 0;
  // After Settle: the current parameters (flat) on the host.
  virtual absl::StatusOr<std::vector<float>> Parameters() = 0;
  // After the last step, before the worker reports done: hands the final state to whoever saves it (the
  // device-resident steps: to the in-process ps, whose final checkpoint then holds it).
  virtual absl::Status Finish() = 0;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_TRAINING_STEPS_H_
