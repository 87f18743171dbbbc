// One worker's training steps against its ps tasks, overlapped: a step's forward pass waits for each layer's
// parameters only as it reaches the layer (the pull streams them in forward order), its backward pass pushes
// each layer's gradients as soon as they are final (last layer first), and the next pull starts right after
// the commit. The training steps of a cluster worker, and of local mode with CPU towers (against the
// in-process ps); see worker/train/training_steps.h for the interface.
//
// Usage:
//   StepRunner runner(towers, client, /*sync=*/true);
//   ASSIGN_OR_RETURN(ps::PullResult at, runner.Start());
//   while (at.step < end && !at.training_done) {
//     RETURN_IF_ERROR(runner.Step(batches, at.step));
//     ASSIGN_OR_RETURN(at, runner.NextStep());
//   }
//   ASSIGN_OR_RETURN(at, runner.Settle());  // every parameter of step at.step is in towers->host_params()
//
// Thread-safety: one thread drives a StepRunner.
#ifndef DTRAIN_WORKER_TRAIN_STEP_RUNNER_H_
#define DTRAIN_WORKER_TRAIN_STEP_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ps/client/worker_client.h"
#include "worker/models/model.h"
#include "worker/batch/row_cache.h"
#include "worker/batch/sparse_batch.h"
#include "worker/towers/towers.h"
#include "worker/train/apply_early_tuner.h"
#include "common/trace_recorder.h"
#include "worker/train/profile_recorder.h"
#include "worker/train/step_metrics.h"
#include "worker/train/training_steps.h"

namespace dtrain::worker {

class StepRunner : public TrainingSteps {
 public:
  // `towers` and `client` must outlive the runner; the client's flat buffers are the towers' host buffers.
  // row_cache_rows > 0: a row cache (worker/batch/row_cache.h) of that many rows per table serves rows at most
  // row_cache_staleness steps old without pulling them. `kill_mid_push_at_step` >= 0: a test hook
  // (TrainingStepsOptions::kill_mid_push_at_step). `tune_apply_early`: measure whether the pushes should ask for
  // the early apply and switch the client accordingly (worker/train/apply_early_tuner.h).
  StepRunner(Towers* towers, ps::WorkerClient* client, bool sync, int64_t row_cache_rows = 0,
             int row_cache_staleness = 0, int64_t kill_mid_push_at_step = -1, bool tune_apply_early = false);

  // Pulls the current parameters (blocking): the step training starts from.
  absl::StatusOr<ps::PullResult> Start() override;
  absl::Status SetUpcomingBatches(const std::vector<models::HostBatch>& batches) override;
  absl::Status LoadSparseRows(const models::HostBatch& batch) override;
  absl::StatusOr<std::vector<std::vector<float>>> PullTables() override;
  int64_t last_step_unique_ids() const override { return last_step_unique_ids_; }
  SparseTraffic sparse_traffic() const override { return traffic_; }
  // Waits for every parameter and row of the pull in flight, then tower 0 predicts on the batch (the step that
  // follows overlaps nothing with this pull then: the chief's price for scoring).
  absl::Status ScoreBatch(const models::HostBatch& batch, float* logits) override;
  // Computes one step on the parameters of `step` (the step of the pull in flight): forward, backward with
  // layer-by-layer pushes, commit; then starts the next pull. InternalError when the loss is not finite
  // (nothing of the step is committed then).
  absl::Status Step(const std::vector<models::HostBatch>& batches, int64_t step) override;
  // Step over batches.size() / towers rounds (models without sparse tables): the parameters are waited for in
  // the first round, each earlier round's gradients are summed aside, and the last round's pushes go out as
  // backward produces them, with the sum and `scale` folded in (InvalidArgument for a count that is not a
  // positive multiple of the towers).
  absl::Status StepRounds(const std::vector<models::HostBatch>& batches, int64_t step, float scale) override;
  // Without a row cache (the elastic jobs that redraw refuse one): its plans are made once per pull.
  absl::StatusOr<ps::PullResult> RedrawCurrent(const std::vector<models::HostBatch>& batches) override;
  // Waits for the answer of the pull in flight: the step of the next parameters, and whether training is over.
  absl::StatusOr<ps::PullResult> NextStep() override;
  absl::StatusOr<std::vector<float>> TakeLosses() override;
  // Waits until the pull in flight has delivered every parameter and the last push has completed.
  absl::StatusOr<ps::PullResult> Settle() override;
  absl::StatusOr<ps::PullResult> PullNewest() override;
  // Tower 0 (every tower) computes with towers->host_params(), after pulling the moving averages into them
  // when asked.
  absl::Status LoadParameters(bool moving_averages) override;
  absl::StatusOr<std::vector<float>> Parameters() override;
  absl::Status Finish() override { return absl::OkStatus(); }
  // Report every step's timings to `profile` (not owned; null: none).
  void set_profile(ProfileRecorder* profile) { profile_ = profile; }
  // Count steps and examples and time each step's parts (not owned; null: none; worker/train/step_metrics.h).
  void set_metrics(StepMetrics* metrics) { metrics_ = metrics; }
  // Record the steps in `trace`'s window on its timeline (not owned; null: none; worker/train/step_trace.h).
  void set_trace(TraceRecorder* trace) {
    trace_ = trace;
    if (trace_ != nullptr) trace_->NameThread("training loop");  // the caller's thread drives the steps
  }

 private:
  const int64_t kill_mid_push_at_step_;
  // Sparse tables: SetSparsePull for the rows of the batch's ids (in slot `slot` of sparse_), for the step
  // `step` (with a row cache: only those it does not hold fresh for that step).
  absl::Status RequestRows(int slot, int64_t step);
  // Binds the rows of the current step (arrived with the pull in flight, of step `step`) to every tower (round 0).
  absl::Status BindRows(int64_t step);
  // Round `round` of a step: each tower k reads the rows of batch round * towers + k of the step's SparseBatch.
  absl::Status BindRound(int round);
  // After round `round`: its towers' row gradients added to the step's (the first round's replace them).
  absl::Status AddRowGradients(int round);
  // After the last round: the summed row gradients, over the towers and times `scale`, added to the push.
  absl::Status PushRows(float scale);

  Towers* towers_;
  ps::WorkerClient* client_;
  const bool sync_;
  int64_t step_ = 0;  // of the newest answer: the parameters in (or arriving into) host_params()
  std::vector<float> losses_;
  // Models with tables: two steps' ids and rows (the current step's, and the upcoming one's the pull in flight
  // brings), swapped at each step; and one for evaluation batches.
  bool sparse_model_ = false;
  std::unique_ptr<SparseBatch> sparse_[2], eval_sparse_;
  int current_ = 0;
  bool upcoming_set_ = false;  // SetUpcomingBatches since the last pull started
  int64_t last_step_unique_ids_ = 0;
  std::vector<float> scratch_params_;  // where an evaluation pull's parameters go
  std::vector<float> round_sum_;       // StepRounds: the gradients of the rounds before the last, summed
  // The row cache, and per slot of sparse_ and table: what it served and what the pull brings.
  std::unique_ptr<RowCache> cache_;
  std::vector<RowCache::Plan> plans_[2];
  std::vector<std::vector<float>> pulled_[2];
  std::vector<int64_t> push_ids_;
  std::vector<float> push_grads_;
  SparseTraffic traffic_;
  // --apply_early=auto: the tuner, and when the previous step started.
  std::unique_ptr<ApplyEarlyTuner> tuner_;
  absl::Time last_step_start_ = absl::InfinitePast();
  ProfileRecorder* profile_ = nullptr;
  TraceRecorder* trace_ = nullptr;
  // --metrics_port: the step in flight (from Step to NextStep): its start, its examples, and the time its hooks
  // spent in the transport's calls during the compute (not compute).
  StepMetrics* metrics_ = nullptr;
  std::chrono::steady_clock::time_point metrics_step_start_;
  int64_t metrics_examples_ = -1;  // -1: no step in flight
  double hook_pull_ = 0, hook_push_ = 0;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_STEP_RUNNER_H_
