// A model's test-set metrics, as the chief computes them during training and dtrain_eval from a checkpoint:
// the accuracy, and for models with one logit (sigmoid cross-entropy, e.g. dlrm) the log loss and ROC AUC, the
// accuracy then being the share of examples on the right side of 0.5.
//
//   ASSIGN_OR_RETURN(Evaluation e, EvaluateBatches(model, batches, [&](const models::HostBatch& b) {
//     return steps->LoadSparseRows(b);  // a sparse model's rows of the batch's ids (null for dense models)
//   }));
//
// Thread-safety: uses the model from the calling thread only.
#ifndef DTRAIN_WORKER_EVAL_EVALUATION_H_
#define DTRAIN_WORKER_EVAL_EVALUATION_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/models/model.h"

namespace dtrain::worker {

struct Evaluation {
  double accuracy = -1, log_loss = -1, auc = -1;  // log loss and AUC: models with one logit, else -1
  // One logit: log_loss and auc are set (auc is NaN for a test set of one class, so test this, not auc >= 0).
  bool binary = false;
  int64_t examples = 0;
};

// Gives a model with sparse tables the rows of a batch's ids (SetSparseInputs) before it is evaluated.
using LoadRowsFn = std::function<absl::Status(const models::HostBatch& batch)>;

// `model` (its parameters set) on every batch; `load_rows` runs before each (may be null for models without
// tables). FailedPrecondition for no examples; the model's and load_rows' errors as they come.
absl::StatusOr<Evaluation> EvaluateBatches(models::Model* model, const std::vector<data::Batch>& batches,
                                           const LoadRowsFn& load_rows);
// The same over a test set's batches as an EvalBatchSet reads them (image folders, arrays: batch by batch); its
// read errors as they come.
absl::StatusOr<Evaluation> EvaluateBatches(models::Model* model, const data::EvalBatchSet& batches,
                                           const LoadRowsFn& load_rows);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_EVAL_EVALUATION_H_
