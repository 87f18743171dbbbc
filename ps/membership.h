// Who takes part in training, as one ps task sees it: each worker's state (active or done), its statistics and
// the ids of its recent pushes (so a retried push is recognised).
//
// Thread-safety: thread-compatible; the ParameterServer guards it with its lock.
#ifndef DTRAIN_PS_MEMBERSHIP_H_
#define DTRAIN_PS_MEMBERSHIP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "ps/ps_types.h"
#include "ps/recent_request_ids.h"

namespace dtrain::ps {

class Membership {
 public:
  explicit Membership(int num_workers);

  int num_workers() const { return static_cast<int>(workers_.size()); }
  // InvalidArgument unless 0 <= worker < num_workers().
  absl::Status CheckWorker(int worker) const;

  bool done(int worker) const { return workers_[worker].stats.done; }
  // Marks the worker done; returns false if it already was.
  bool MarkDone(int worker);
  int num_active() const { return num_workers() - num_done_; }
  bool all_done() const { return num_done_ == num_workers(); }
  // Whether a worker other than `worker` is still active (someone who could move the step).
  bool AnotherActive(int worker) const;

  WorkerStats& stats(int worker) { return workers_[worker].stats; }
  std::vector<WorkerStats> AllStats() const;
  RecentRequestIds& recent_ids(int worker) { return workers_[worker].recent_ids; }
  const RecentRequestIds& recent_ids(int worker) const { return workers_[worker].recent_ids; }

 private:
  struct Worker {
    WorkerStats stats;
    RecentRequestIds recent_ids{1024};  // retries arrive within a few calls of their original
  };
  std::vector<Worker> workers_;
  int num_done_ = 0;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_MEMBERSHIP_H_
