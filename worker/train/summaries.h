// TensorBoard summaries of a training run beyond loss and accuracy, written by the chief every
// --summary_every local steps: what each worker buys shows as
//   learning_rate                          the decayed learning rate at that step (scalar)
//   ps/task_<t>/received_bytes_per_sec     bytes task t received (gradients) per second since the last summary
//   ps/task_<t>/sent_bytes_per_sec         bytes task t sent (parameters) per second since the last summary
//   staleness                              async: histogram of the staleness of the pushes ps 0 applied
//   weights/<variable>, gradients/<variable>   histograms of every variable's values and of this step's gradient
// and, for a model with sparse embedding tables,
//   sparse/<table>/rows                    rows of the table held, summed over the ps tasks
//   sparse/<table>/rows_created_per_sec    rows the ps tasks created (first lookups) per second since the last summary
//   sparse/<table>/rows_evicted_per_sec    rows evicted by max_rows per second since the last summary
//   sparse/<table>/rows_expired_per_sec    rows the ps removed by expiry (--row_ttl) per second since then
//   sparse/<table>/lookups_not_admitted_per_sec  lookups of ids refused a row (--admit_after, --admit_probability)
//   sparse/unique_ids_per_step             this worker's unique ids over all tables in its last step
//
//   ASSIGN_OR_RETURN(std::unique_ptr<TrainingSummaries> summaries,
//                    TrainingSummaries::Create(events.get(), model->variables(), config.optimizer,
//                                              group.num_tasks(), [&](int t) { return group.Stats(t); },
//                                              absl::Now(), [&] { return steps->last_step_unique_ids(); }));
//   ... every summary step:  RETURN_IF_ERROR(summaries->Write(step, params, grads));
//
// Thread-safety: one training thread calls Write; not thread-safe.
// Errors: Create fails with InvalidArgument on a bad optimizer config or missing writer; Write returns the
// writer's I/O error or the first failing task's Stats error.
#ifndef DTRAIN_WORKER_TRAIN_SUMMARIES_H_
#define DTRAIN_WORKER_TRAIN_SUMMARIES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/event_writer.h"
#include "ps/core/optimizer.h"
#include "ps/api/ps_types.h"
#include "worker/models/model.h"

namespace dtrain::worker {

class TrainingSummaries {
 public:
  // Statistics of ps task `task` (0 = coordinator); called at summary steps only.
  using TaskStatsFn = std::function<absl::StatusOr<ps::TrainingStats>(int task)>;
  // The unique ids of this worker's last step over all tables (TrainingSteps::last_step_unique_ids).
  using UniqueIdsFn = std::function<int64_t()>;

  // `writer` is not owned and must outlive this object. `variables` lay out the flat parameter and gradient
  // buffers (models::Offsets order). Traffic rates at the first Write are measured from `start`. Tables come
  // from the tasks' statistics; `unique_ids` (null: no sparse/unique_ids_per_step) from the training steps.
  static absl::StatusOr<std::unique_ptr<TrainingSummaries>> Create(
      EventWriter* writer, const std::vector<models::VariableInfo>& variables,
      const ps::OptimizerConfig& optimizer, int num_tasks, TaskStatsFn task_stats, absl::Time start,
      UniqueIdsFn unique_ids = nullptr);

  // Writes every summary above for global step `step` (params: the flat parameters; grads: this step's
  // flat gradient, or null: no gradient histograms) and flushes the writer. `now` is when the step ended (tests
  // pass their own clock).
  absl::Status Write(int64_t step, const float* params, const float* grads, absl::Time now = absl::Now());

 private:
  struct Variable {
    std::string name;
    int64_t offset, size;
  };
  // One table summed over the tasks since the last summary.
  struct TableTotals {
    std::string name;
    int64_t rows = 0, created = 0, evicted = 0, expired = 0, not_admitted = 0;
  };
  TrainingSummaries(EventWriter* writer, std::vector<Variable> variables, ps::Optimizer optimizer, int num_tasks,
                    TaskStatsFn task_stats, absl::Time start, UniqueIdsFn unique_ids);
  // Adds task t's tables to `totals`: rows held, and rows created and evicted since its last statistics (a task
  // that restarted counts from zero again).
  void AddTables(size_t t, const ps::TrainingStats& stats, std::vector<TableTotals>* totals);

  EventWriter* writer_;
  std::vector<Variable> variables_;
  ps::Optimizer optimizer_;
  TaskStatsFn task_stats_;
  UniqueIdsFn unique_ids_;
  absl::Time last_time_;
  std::vector<int64_t> last_received_, last_sent_;  // per task, at last_time_
  // Per task and table, at last_time_.
  std::vector<std::vector<int64_t>> last_created_, last_evicted_, last_expired_, last_not_admitted_;
};

// The staleness histogram of ps::TrainingStats (bucket k = pushes applied with staleness k) as a Histogram of
// values k weighted by their counts.
Histogram StalenessHistogram(const std::vector<int64_t>& counts);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_SUMMARIES_H_
