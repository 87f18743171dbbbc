#include "worker/train/summaries.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::worker {

absl::StatusOr<std::unique_ptr<TrainingSummaries>> TrainingSummaries::Create(
    EventWriter* writer, const std::vector<models::VariableInfo>& variables, const ps::OptimizerConfig& optimizer,
    int num_tasks, TaskStatsFn task_stats, absl::Time start, UniqueIdsFn unique_ids) {
  if (writer == nullptr) return absl::InvalidArgumentError("TrainingSummaries: no event writer");
  if (num_tasks < 1 || !task_stats) return absl::InvalidArgumentError("TrainingSummaries: no ps tasks");
  ASSIGN_OR_RETURN(ps::Optimizer opt, ps::Optimizer::Create(optimizer));
  std::vector<Variable> vars;
  const std::vector<int64_t> offsets = models::Offsets(variables);
  for (size_t i = 0; i < variables.size(); ++i) vars.push_back({variables[i].name, offsets[i], variables[i].size()});
  return std::unique_ptr<TrainingSummaries>(
      new TrainingSummaries(writer, std::move(vars), std::move(opt), num_tasks, std::move(task_stats), start,
                            std::move(unique_ids)));
}

TrainingSummaries::TrainingSummaries(EventWriter* writer, std::vector<Variable> variables, ps::Optimizer optimizer,
                                     int num_tasks, TaskStatsFn task_stats, absl::Time start,
                                     UniqueIdsFn unique_ids)
    : writer_(writer),
      variables_(std::move(variables)),
      optimizer_(std::move(optimizer)),
      task_stats_(std::move(task_stats)),
      unique_ids_(std::move(unique_ids)),
      last_time_(start),
      last_received_(num_tasks, 0),
      last_sent_(num_tasks, 0),
      last_created_(num_tasks),
      last_evicted_(num_tasks),
      last_expired_(num_tasks),
      last_not_admitted_(num_tasks) {}

void TrainingSummaries::AddTables(size_t t, const ps::TrainingStats& stats, std::vector<TableTotals>* totals) {
  // Counters since the task started: one below its last value means the task restarted (or was restored).
  auto since_last = [](int64_t now, int64_t* last) {
    const int64_t delta = now >= *last ? now - *last : now;
    *last = now;
    return delta;
  };
  if (totals->size() < stats.tables.size()) totals->resize(stats.tables.size());
  last_created_[t].resize(stats.tables.size(), 0);
  last_evicted_[t].resize(stats.tables.size(), 0);
  last_expired_[t].resize(stats.tables.size(), 0);
  last_not_admitted_[t].resize(stats.tables.size(), 0);
  for (size_t k = 0; k < stats.tables.size(); ++k) {
    const ps::SparseTableStats& s = stats.tables[k];
    TableTotals& total = (*totals)[k];
    total.name = s.name;
    total.rows += s.rows;
    total.created += since_last(s.created, &last_created_[t][k]);
    total.evicted += since_last(s.evicted, &last_evicted_[t][k]);
    total.expired += since_last(s.expired, &last_expired_[t][k]);
    total.not_admitted += since_last(s.not_admitted, &last_not_admitted_[t][k]);
  }
}

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
  std::vector<TableTotals> tables;
  for (size_t t = 0; t < last_received_.size(); ++t) {
    ASSIGN_OR_RETURN(ps::TrainingStats stats, task_stats_(static_cast<int>(t)));
    AddTables(t, stats, &tables);
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
  for (const TableTotals& table : tables) {
    const std::string prefix = "sparse/" + table.name + "/";
    RETURN_IF_ERROR(writer_->AddScalar(prefix + "rows", step, static_cast<double>(table.rows)));
    RETURN_IF_ERROR(writer_->AddScalar(prefix + "rows_created_per_sec", step, table.created / secs));
    RETURN_IF_ERROR(writer_->AddScalar(prefix + "rows_evicted_per_sec", step, table.evicted / secs));
    RETURN_IF_ERROR(writer_->AddScalar(prefix + "rows_expired_per_sec", step, table.expired / secs));
    RETURN_IF_ERROR(writer_->AddScalar(prefix + "lookups_not_admitted_per_sec", step, table.not_admitted / secs));
  }
  if (unique_ids_) {
    RETURN_IF_ERROR(writer_->AddScalar("sparse/unique_ids_per_step", step, static_cast<double>(unique_ids_())));
  }

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
