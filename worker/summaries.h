// TensorBoard summaries of a training run beyond loss and accuracy, written by the chief every
// --summary_every local steps: what each worker buys shows as
//   learning_rate                          the decayed learning rate at that step (scalar)
//   ps/task_<t>/received_bytes_per_sec     bytes task t received (gradients) per second since the last summary
//   ps/task_<t>/sent_bytes_per_sec         bytes task t sent (parameters) per second since the last summary
//   staleness                              async: histogram of the staleness of the pushes ps 0 applied
//   weights/<variable>, gradients/<variable>   histograms of every variable's values and of this step's gradient
//
//   ASSIGN_OR_RETURN(std::unique_ptr<TrainingSummaries> summaries,
//                    TrainingSummaries::Create(events.get(), model->variables(), config.optimizer,
//                                              group.num_tasks(), [&](int t) { return group.Stats(t); },
//                                              absl::Now()));
//   ... every summary step:  RETURN_IF_ERROR(summaries->Write(step, params, grads));
//
// Thread-safety: one training thread calls Write; not thread-safe.
// Errors: Create fails with InvalidArgument on a bad optimizer config or missing writer; Write returns the
// writer's I/O error or the first failing task's Stats error.
#ifndef DTRAIN_WORKER_SUMMARIES_H_
#define DTRAIN_WORKER_SUMMARIES_H_

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

  // `writer` is not owned and must outlive this object. `variables` lay out the flat parameter and gradient
  // buffers (models::Offsets order). Traffic rates at the first Write are measured from `start`.
  static absl::StatusOr<std::unique_ptr<TrainingSummaries>> Create(
      EventWriter* writer, const std::vector<models::VariableInfo>& variables,
      const ps::OptimizerConfig& optimizer, int num_tasks, TaskStatsFn task_stats, absl::Time start);

  // Writes every summary above for global step `step` (params: the flat parameters; grads: this step's
  // flat gradient, or null: no gradient histograms) and flushes the writer. `now` is when the step ended (tests
  // pass their own clock).
  absl::Status Write(int64_t step, const float* params, const float* grads, absl::Time now = absl::Now());

 private:
  struct Variable {
    std::string name;
    int64_t offset, size;
  };
  TrainingSummaries(EventWriter* writer, std::vector<Variable> variables, ps::Optimizer optimizer, int num_tasks,
                    TaskStatsFn task_stats, absl::Time start);

  EventWriter* writer_;
  std::vector<Variable> variables_;
  ps::Optimizer optimizer_;
  TaskStatsFn task_stats_;
  absl::Time last_time_;
  std::vector<int64_t> last_received_, last_sent_;  // per task, at last_time_
};

// The staleness histogram of ps::TrainingStats (bucket k = pushes applied with staleness k) as a Histogram of
// values k weighted by their counts.
Histogram StalenessHistogram(const std::vector<int64_t>& counts);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_SUMMARIES_H_
