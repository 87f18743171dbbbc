#include "ps/core/sync_coordinator.h"

#include <algorithm>
#include <utility>

namespace dtrain::ps {

bool SyncCoordinator::HasCommitted(int worker) const {
  return std::find(pending_.begin(), pending_.end(), worker) != pending_.end();
}

std::optional<StepDecision> SyncCoordinator::MaybeDecide(int64_t step, int active_workers) {
  const size_t needed = static_cast<size_t>(std::max(0, std::min(replicas_to_aggregate_, active_workers)));
  if (pending_.empty() || pending_.size() < needed) return std::nullopt;
  StepDecision decision{step, std::move(pending_), false, ""};
  pending_.clear();
  if (log_.empty()) first_logged_step_ = step;
  log_.push_back(decision);
  if (log_.size() > kMaxLog) {
    log_.pop_front();
    ++first_logged_step_;
  }
  return decision;
}

void SyncCoordinator::Replace(const StepDecision& d) {
  if (d.step >= first_logged_step_ && d.step < first_logged_step_ + static_cast<int64_t>(log_.size())) {
    log_[d.step - first_logged_step_] = d;
  }
}

std::vector<StepDecision> SyncCoordinator::DecisionsSince(int64_t since, int64_t until) const {
  std::vector<StepDecision> out;
  const int64_t end = std::min<int64_t>(until, first_logged_step_ + static_cast<int64_t>(log_.size()));
  for (int64_t s = std::max(since, first_logged_step_); s < end; ++s) out.push_back(log_[s - first_logged_step_]);
  return out;
}

}  // namespace dtrain::ps
