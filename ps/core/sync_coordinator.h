// ps task 0 in sync mode: collects the commits for the current step, decides the step once min(R, active
// workers) have committed (the first R, in commit order), and keeps a log of recent decisions for the workers
// to relay to the other ps tasks.
//
// Thread-safety: thread-compatible; the ParameterServer guards it with its lock.
#ifndef DTRAIN_PS_CORE_SYNC_COORDINATOR_H_
#define DTRAIN_PS_CORE_SYNC_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "ps/api/ps_types.h"

namespace dtrain::ps {

class SyncCoordinator {
 public:
  // Decisions kept for lagging pulls; older ones are forgotten (a task that needs them reports "missing").
  static constexpr size_t kMaxLog = 100000;

  explicit SyncCoordinator(int replicas_to_aggregate) : replicas_to_aggregate_(replicas_to_aggregate) {}

  // The log starts at `step` (after a restore: nothing before it can be relayed).
  void StartAt(int64_t step) { first_logged_step_ = step; }
  bool HasCommitted(int worker) const;
  void AddCommit(int worker) { pending_.push_back(worker); }
  // Sets aside the commits for the current step (it is computed again: ElasticPlan::Replan); returns them.
  std::vector<int> TakePending() { return std::exchange(pending_, {}); }
  // Decides `step` when there are at least min(R, active_workers) commits (and at least one): returns the
  // decision (the pending commits, in order) and logs it; else nullopt.
  std::optional<StepDecision> MaybeDecide(int64_t step, int active_workers);
  // Replaces the logged decision of d.step (if still logged) with `d` (its checkpoint flag and signature are
  // added after it is decided).
  void Replace(const StepDecision& d);
  // Logged decisions for steps [max(since, first logged), until).
  std::vector<StepDecision> DecisionsSince(int64_t since, int64_t until) const;
  // The oldest step whose decision is logged (a task at any step from it up to `current`, the global step, can
  // catch up from the log); `current` when none is.
  int64_t FirstRelayableStep(int64_t current) const { return log_.empty() ? current : first_logged_step_; }

 private:
  int replicas_to_aggregate_;
  std::vector<int> pending_;              // committed workers for the current step, in order
  std::deque<StepDecision> log_;          // [i] decides step first_logged_step_ + i
  int64_t first_logged_step_ = 0;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_SYNC_COORDINATOR_H_
