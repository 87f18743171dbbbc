// Internal to dtrain_worker_lib: the parts of the training loop (trainer.h) that its source files share:
// the set-up of the data (trainer_data.cc), the loop itself (trainer_loop.cc) and the end of a run
// (trainer_finish.cc), which trainer.cc's Train strings together. Not for use outside them.
//
// Thread-safety: like Train, each runs on the thread that trains.
#ifndef DTRAIN_WORKER_TRAIN_TRAINER_INTERNAL_H_
#define DTRAIN_WORKER_TRAIN_TRAINER_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/event_writer.h"
#include "worker/data/batch_stream_follow.h"
#include "worker/data/dataset.h"
#include "worker/data/metrics.h"
#include "worker/eval/evaluation.h"
#include "worker/models/model.h"
#include "worker/train/ps_connection.h"
#include "worker/train/step_loss_log.h"
#include "worker/train/summaries.h"
#include "worker/train/trainer.h"
#include "worker/train/training_steps.h"
#include "worker/towers/towers.h"

namespace dtrain::worker::trainer_internal {

inline constexpr int kMaxReconnects = 1000;  // a ps that restarts for ever stops the worker eventually

// What the data set gives a run: the model's input geometry, this worker's training stream and (chief) the
// test batches. Filled in place: the stream refers to the data set it reads.
struct TrainingData {
  data::DatasetPair loaded;  // when read from data_dir
  const data::DatasetPair* dataset = nullptr;
  models::ModelDefaults defaults;  // input pipeline, default schedule
  models::ModelOptions model_options;
  std::unique_ptr<data::BatchStream> stream;
  std::unique_ptr<data::EvalBatchSet> eval_set;  // chief: the test set's batches
  data::SetAsideCounts set_aside;                // --follow: the files the stream set aside
};

// The newest examples the chief of an online run scored before training on them (progressive validation): a
// ring of (logit, label) pairs.
class ScoreWindow {
 public:
  explicit ScoreWindow(int64_t capacity) : capacity_(static_cast<size_t>(std::max<int64_t>(capacity, 0))) {}
  void Add(const float* logits, const std::vector<float>& labels) {
    for (size_t i = 0; i < labels.size() && capacity_ > 0; ++i) {
      if (logits_.size() < capacity_) {
        logits_.push_back(logits[i]);
        labels_.push_back(labels[i]);
      } else {
        logits_[next_] = logits[i];
        labels_[next_] = labels[i];
        next_ = (next_ + 1) % capacity_;
      }
    }
  }
  int64_t size() const { return static_cast<int64_t>(logits_.size()); }
  double LogLoss() const { return data::MeanLogLoss(logits_, labels_); }
  double Auc() const { return data::RocAuc(logits_, labels_); }

 private:
  size_t capacity_;
  size_t next_ = 0;
  std::vector<float> logits_, labels_;
};

// ---- data (trainer_data.cc) ----
// The data set, this worker's stream and (chief) the test batches; fills in the model defaults of `o`.
absl::Status SetUpData(WorkerOptions* o, bool local, bool chief, TrainingData* d);

// ---- evaluation (trainer_loop.cc) ----
// The test metrics of `e` as TensorBoard scalars at `step`.
absl::Status AddEvaluationScalars(EventWriter* events, int64_t step, const Evaluation& e);
// Test accuracy of tower 0 with the current parameters (or their moving averages).
absl::StatusOr<Evaluation> EvaluateNow(TrainingSteps* steps, models::Model* model0, const TrainingData& d,
                                       bool moving_averages);
// Appends the losses known so far to the result and hands them to `log` (StepLossLog::Collect).
absl::Status CollectLosses(TrainingSteps* steps, StepLossLog* log, TrainingResult* result);

// ---- the loop (trainer_loop.cc) ----
// Steps until the global step reaches train_steps (trainer_loop.cc says how).
absl::Status TrainLoop(const WorkerOptions& o, bool chief, TrainingData* d, Towers* towers, Connection* c,
                       TrainingSteps* steps, EventWriter* events, TrainingSummaries* summaries, ScoreWindow* window,
                       StepLossLog* losses, TrainingResult* result);

// ---- the end (trainer_finish.cc) ----
// The final parameters, the chief's evaluation, this worker's rate and the ps statistics. Before the worker
// reports done.
absl::Status FinishTraining(const WorkerOptions& o, bool chief, bool local, const TrainingData& d,
                            Towers* towers, Connection* c, TrainingSteps* steps, EventWriter* events,
                            TrainingResult* result);
// The chief's last lines, after the worker reported done.
void PrintAccuracy(const WorkerOptions& o, const TrainingData& d, const TrainingResult& result);

}  // namespace dtrain::worker::trainer_internal

#endif  // DTRAIN_WORKER_TRAIN_TRAINER_INTERNAL_H_
