#include "worker/data/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "glog/logging.h"

namespace dtrain::data {

double MeanLogLoss(absl::Span<const float> logits, absl::Span<const float> labels) {
  CHECK_EQ(logits.size(), labels.size()) << "MeanLogLoss: logits and labels";
  if (logits.empty()) return 0.0;
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i], y = labels[i];
    sum += std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::abs(z)));
  }
  return sum / static_cast<double>(logits.size());
}

double RocAuc(absl::Span<const float> scores, absl::Span<const float> labels) {
  CHECK_EQ(scores.size(), labels.size()) << "RocAuc: scores and labels";
  constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<float, bool>> v(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i])) return kNan;  // no order to rank by (and std::sort would be undefined)
    v[i] = {scores[i], labels[i] >= 0.5f};
  }
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  // Ascending through groups of equal scores: each positive beats the negatives below its group and ties with
  // half of those in it.
  double wins = 0.0;
  int64_t negatives_below = 0, positives = 0;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    int64_t pos = 0, neg = 0;
    for (; j < v.size() && v[j].first == v[i].first; ++j) (v[j].second ? pos : neg)++;
    wins += static_cast<double>(pos) * (static_cast<double>(negatives_below) + 0.5 * static_cast<double>(neg));
    negatives_below += neg;
    positives += pos;
    i = j;
  }
  if (positives == 0 || negatives_below == 0) return kNan;
  return wins / (static_cast<double>(positives) * static_cast<double>(negatives_below));
}

void BinaryMetrics::Add(absl::Span<const float> logits, absl::Span<const float> labels) {
  CHECK_EQ(logits.size(), labels.size()) << "BinaryMetrics::Add: logits and labels";
  logits_.insert(logits_.end(), logits.begin(), logits.end());
  labels_.insert(labels_.end(), labels.begin(), labels.end());
}

double BinaryMetrics::positive_rate() const {
  if (labels_.empty()) return 0.0;
  double sum = 0.0;
  for (float y : labels_) sum += y;
  return sum / static_cast<double>(labels_.size());
}

void BinaryMetrics::Clear() {
  logits_.clear();
  labels_.clear();
}

}  // namespace dtrain::data
