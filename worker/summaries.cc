#include "worker/summaries.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::worker {

absl::StatusOr<std::unique_ptr<TrainingSummaries>> TrainingSummaries::Create(
    EventWriter* writer, const std::vector<models::VariableInfo>& variables, const ps::OptimizerConfig& optimizer,
    int num_tasks, TaskStatsFn task_stats, absl::Time start) {
  if (writer == nullptr) return absl::InvalidArgumentError("TrainingSummaries: no event writer");
  if (num_tasks < 1 || !task_stats) return absl::InvalidArgumentError("TrainingSummaries: no ps tasks");
  ASSIGN_OR_RETURN(ps::Optimizer opt, ps::Optimizer::Create(optimizer));
  std::vector<Variable> vars;
  const std::vector<int64_t> offsets = models::Offsets(variables);
  for (size_t i = 0; i < variables.size(); ++i) vars.push_back({variables[i].name, offsets[i], variables[i].size()});
  return std::unique_ptr<TrainingSummaries>(
      new TrainingSummaries(writer, std::move(vars), std::move(opt), num_tasks, std::move(task_stats), start));
}

TrainingSummaries::TrainingSummaries(EventWriter* writer, std::vector<Variable> variables, ps::Optimizer optimizer,
                                     int num_tasks, TaskStatsFn task_stats, absl::Time start)
    : writer_(writer),
      variables_(std::move(variables)),
      optimizer_(std::move(optimizer)),
      task_stats_(std::move(task_stats)),
      last_time_(start),
      last_received_(num_tasks, 0),
      last_sent_(num_tasks, 0) {}

Histogram StalenessHistogram(const std::vector<int64_t>& counts) {
  Histogram h;
  for (size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] > 0) h.Add(static_cast<double>(k), static_cast<double>(counts[k]));
  }
  return h;
}

absl::Status TrainingSummaries::Write(int64_t step, const float* params, const float* grads, absl::Time now) {
  RETURN_IF_ERROR(writer_->AddScalar("learning_rate", step, optimizer_.LearningRate(step)));

  const double secs = std::max(absl::ToDoubleSeconds(now - last_time_), 1e-9);
  for (size_t t = 0; t < last_received_.size(); ++t) {
    ASSIGN_OR_RETURN(ps::TrainingStats stats, task_stats_(static_cast<int>(t)));
    const std::string prefix = absl::StrCat("ps/task_", t, "/");
    RETURN_IF_ERROR(writer_->AddScalar(prefix + "received_bytes_per_sec", step,
                                       (stats.bytes_received - last_received_[t]) / secs));
    RETURN_IF_ERROR(writer_->AddScalar(prefix + "sent_bytes_per_sec", step, (stats.bytes_sent - last_sent_[t]) / secs));
    last_received_[t] = stats.bytes_received;
    last_sent_[t] = stats.bytes_sent;
    if (t == 0) {
      // Only ps 0 (the coordinator) keeps the staleness of applied pushes; empty in sync mode.
      Histogram staleness = StalenessHistogram(stats.staleness_histogram);
      if (staleness.num() > 0) RETURN_IF_ERROR(writer_->AddHistogram("staleness", step, staleness));
    }
  }
  last_time_ = now;

  for (const Variable& v : variables_) {
    Histogram weights;
    weights.AddAll(params + v.offset, v.size);
    RETURN_IF_ERROR(writer_->AddHistogram("weights/" + v.name, step, weights));
    if (grads == nullptr) continue;
    Histogram gradients;
    gradients.AddAll(grads + v.offset, v.size);
    RETURN_IF_ERROR(writer_->AddHistogram("gradients/" + v.name, step, gradients));
  }
  return writer_->Flush();
}

}  // namespace dtrain::worker
