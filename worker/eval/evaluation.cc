#include "worker/eval/evaluation.h"

#include "absl/types/span.h"
#include "common/status_macros.h"
#include "worker/batch/batch_view.h"
#include "worker/data/metrics.h"
#include "worker/models/graph.h"

namespace dtrain::worker {

namespace {

using VisitFn = std::function<absl::Status(const std::function<absl::Status(const data::Batch&)>&)>;

// The metrics over every batch `visit` gives.
absl::StatusOr<Evaluation> Evaluate(models::Model* model, const VisitFn& visit, const LoadRowsFn& load_rows) {
  const bool sigmoid = model->graph().loss == models::Loss::kSigmoidCrossEntropy;
  int64_t correct = 0, total = 0;
  data::BinaryMetrics metrics;
  std::vector<float> logits;
  RETURN_IF_ERROR(visit([&](const data::Batch& b) -> absl::Status {
    const models::HostBatch view = View(b);
    if (load_rows) RETURN_IF_ERROR(load_rows(view));
    if (sigmoid) {
      logits.resize(b.batch);
      RETURN_IF_ERROR(model->Predict(view, logits.data()));
      metrics.Add(absl::MakeConstSpan(logits.data(), b.batch), absl::MakeConstSpan(b.labels.data(), b.batch));
      for (int i = 0; i < b.batch; ++i) correct += (logits[i] > 0.0f) == (b.labels[i] > 0.5f);
    } else {
      ASSIGN_OR_RETURN(int c, model->CountCorrect(view));
      correct += c;
    }
    total += b.batch;
    return absl::OkStatus();
  }));
  if (total == 0) return absl::FailedPreconditionError("empty test set");
  Evaluation e;
  e.examples = total;
  e.accuracy = static_cast<double>(correct) / total;
  e.binary = sigmoid;
  if (sigmoid) {
    e.log_loss = metrics.log_loss();
    e.auc = metrics.auc();
  }
  return e;
}

}  // namespace

absl::StatusOr<Evaluation> EvaluateBatches(models::Model* model, const std::vector<data::Batch>& batches,
                                           const LoadRowsFn& load_rows) {
  return Evaluate(
      model,
      [&batches](const std::function<absl::Status(const data::Batch&)>& fn) {
        for (const data::Batch& b : batches) RETURN_IF_ERROR(fn(b));
        return absl::OkStatus();
      },
      load_rows);
}

absl::StatusOr<Evaluation> EvaluateBatches(models::Model* model, const data::EvalBatchSet& batches,
                                           const LoadRowsFn& load_rows) {
  return Evaluate(
      model, [&batches](const std::function<absl::Status(const data::Batch&)>& fn) { return batches.ForEach(fn); },
      load_rows);
}

}  // namespace dtrain::worker
