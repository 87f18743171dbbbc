// Metrics of binary classifiers (click-through-rate models): mean log loss from logits, ROC AUC from scores.
//
// Labels are 0 or 1 as floats (Batch::labels); AUC counts a label >= 0.5 as positive.
//
// Example (evaluation over batches):
//   BinaryMetrics m;
//   for (const Batch& b : batches) m.Add(logits_of(b), b.labels);
//   LOG(INFO) << "log loss " << m.log_loss() << " AUC " << m.auc();
//
// Thread-safety: the functions are stateless; a BinaryMetrics is used by one thread at a time.
#ifndef DTRAIN_WORKER_DATA_METRICS_H_
#define DTRAIN_WORKER_DATA_METRICS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace dtrain::data {

// The mean over examples of the sigmoid cross-entropy -y log(p) - (1 - y) log(1 - p), p = sigmoid(logit),
// computed stably as max(z, 0) - z y + log1p(exp(-|z|)). 0 for no examples; NaN if a logit is NaN.
// Precondition (CHECKed): equal sizes.
double MeanLogLoss(absl::Span<const float> logits, absl::Span<const float> labels);

// The area under the ROC curve: the probability that a random positive scores above a random negative, a tie
// counting one half (the Mann-Whitney statistic with average ranks). Any increasing function of the scores
// (logits or probabilities) gives the same value. O(n log n). NaN without positives or without negatives, or if
// a score is NaN. Precondition (CHECKed): equal sizes.
double RocAuc(absl::Span<const float> scores, absl::Span<const float> labels);

// Accumulates logits and labels over batches; keeps them (8 bytes an example) for the AUC.
class BinaryMetrics {
 public:
  // Precondition (CHECKed): equal sizes.
  void Add(absl::Span<const float> logits, absl::Span<const float> labels);
  int64_t count() const { return static_cast<int64_t>(logits_.size()); }
  double positive_rate() const;  // mean label (the click-through rate); 0 for no examples
  double log_loss() const { return MeanLogLoss(logits_, labels_); }
  double auc() const { return RocAuc(logits_, labels_); }
  void Clear();

 private:
  std::vector<float> logits_, labels_;
};

}  // namespace dtrain::data

#endif  // DTRAIN_WORKER_DATA_METRICS_H_
