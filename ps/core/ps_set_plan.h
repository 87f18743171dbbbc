// PsSetPlan: ps 0's record of the job's ps tasks and of a change of them asked for while the job runs (dtrain_ctl
// add-ps / remove-ps, dtrain_ps --join). The change happens at a step boundary: the next step ps 0 decides is
// saved by every task (its decision is marked checkpoint), ps 0 decides nothing past it until the chief has moved
// the job onto the new set (every task restores that checkpoint resharded onto the new number of tasks:
// ParameterServer::Restore with a config for another num_ps), and every pull's header from that step on names
// the new set (PullHeader::ps_set), so each worker finishes its pull and connects to it.
//
// An async job has no decisions: the step is fixed when the change is asked for (the pulls announce it from then
// on), and moved to where ps 0 cut the job once every worker stopped pushing (Cut; parameter_server_control.cc).
//
// Any task but ps 0 (which holds the global step and decides the steps) leaves: the last task takes the leaving
// one's index (the chief's config names the new order, and a task finds its index by its address there), every
// other task keeps its own.
//
// Thread-safety: none; ps 0 calls it under its mutex.
#ifndef DTRAIN_PS_CORE_PS_SET_PLAN_H_
#define DTRAIN_PS_CORE_PS_SET_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

class PsSetPlan {
 public:
  // `hosts`: the cluster spec's ps tasks (empty where ps 0 was not told them: a change is then refused).
  explicit PsSetPlan(std::vector<std::string> hosts) : hosts_(std::move(hosts)) {}

  // A change asked for. Returns the line that says what happens; FailedPrecondition (one line: why not) when
  // another change is under way, the address is one of the job's already, the task is ps 0 or the only one, or
  // the hosts are not known; InvalidArgument for an address that is no host:port. The task of the pending
  // change asking to join again gets its line with " (asked before)" and changes nothing.
  absl::StatusOr<std::string> Add(const std::string& address);
  absl::StatusOr<std::string> Remove(int ps);

  bool pending() const { return !next_.empty(); }
  bool changed() const { return version_ > 0; }  // the job left the spec's set at some point
  size_t pending_size() const { return next_.size(); }
  // The step the pending change happens at: fixed by the first decision after it was asked for (-1 before).
  int64_t move_step() const { return move_step_; }
  // ps 0 decided a step that ends at `step` (its global step after the decision): the first one after a change
  // was asked for fixes the change's step. Returns whether it did (the decision must then be saved by every task).
  bool Decided(int64_t step);
  // Async: the workers stopped pushing and ps 0 cut the job at `step` (every task saves its part there): the move
  // happens at that step rather than the one fixed when it was asked for.
  void Cut(int64_t step) {
    if (pending()) move_step_ = step;
  }
  // Whether ps 0 must not decide the step that starts at `step`: a change waits for the chief there.
  bool Frozen(int64_t step) const { return pending() && move_step_ >= 0 && step >= move_step_; }
  // What pull headers carry at ps 0's step `step`: the pending set once its step is reached; else the current one
  // when it ever changed (version > 0); else nothing (version 0).
  PsSet View(int64_t step) const;
  // The chief restored ps 0 onto `num_ps` tasks at `step`: the pending set is the job's now. FailedPrecondition when
  // no change of that size is pending at that step (the restore is then refused).
  absl::Status Moved(int num_ps, int64_t step);
  // A ps 0 that restarted after a change (it knows only the spec's set) takes the job's set from the chief's
  // config as the chief restores it. FailedPrecondition while a change is pending or for a set of another size.
  absl::Status Adopt(const std::vector<std::string>& hosts, int64_t version, int num_ps);
  int num_ps() const { return static_cast<int>(hosts_.size()); }
  const std::vector<std::string>& hosts() const { return hosts_; }
  int64_t version() const { return version_; }

 private:
  std::vector<std::string> hosts_;    // the job's tasks now
  std::vector<std::string> next_;     // a pending change's set (empty: none)
  std::vector<std::string> leaving_;  // a pending change's leaving addresses
  int64_t move_step_ = -1;
  int64_t version_ = 0;  // of hosts_; a pending change is version_ + 1
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_PS_SET_PLAN_H_
