// Who takes part in training, as one ps task sees it: each worker's session (issued when it registers), its
// lease (renewed by its calls and heartbeats), whether it is active, done or lost, its statistics and the ids of
// its recent pushes (so a retried push is recognised).
//
// Sessions: Register gives a worker a fresh random session, which every later call must carry. A worker without
// a session here (this task restarted or rolled back, or declared the worker lost) must register again
// (Aborted); a session other than the worker's current one is refused (PermissionDenied: another process
// registered as this worker since). So only the worker a call names can push or pull; reporting done needs the
// current session only while there is one (a refused worker leaves without ever having had one).
//
// Leases: a registered worker silent for longer than the lease is declared lost (ExpireLeases): it no longer
// counts as active (sync mode stops waiting for it) until it registers again. A worker that never registered
// has a lease from the moment the task was configured.
//
// Elastic jobs: the task keeps `slots` workers (dtrain_ps --max_workers), of which the first `initial` (the cluster
// spec's) are expected from the start; a worker of a later slot is absent (not active, no lease, not in the
// statistics) until it registers: it joins. Once it has joined it is a worker like the others (it may leave,
// be lost, come back).
//
// Thread-safety: thread-compatible; the ParameterServer guards it with its lock.
#ifndef DTRAIN_PS_CORE_MEMBERSHIP_H_
#define DTRAIN_PS_CORE_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ps/api/ps_types.h"
#include "ps/core/recent_request_ids.h"

namespace dtrain::ps {

class Membership {
 public:
  // `task` names this ps task in messages; `initial` workers of `slots` (initial <= slots; 0: all) are expected.
  Membership(int slots, int task, int initial = 0);

  int num_workers() const { return static_cast<int>(workers_.size()); }  // the slots
  int initial_workers() const { return initial_; }
  // InvalidArgument unless 0 <= worker < num_workers() (naming --max_workers when the slots are more than the
  // cluster spec's workers, or the worker is beyond them).
  absl::Status CheckWorker(int worker) const;
  // Whether `worker` has been part of the job: one of the initial workers, or one that joined.
  bool present(int worker) const { return workers_[worker].present; }
  // The present workers, ascending.
  std::vector<int> present_workers() const;

  // The leases start now (for workers that have not registered yet), the task at global step `step`.
  void StartLeases(absl::Time now, int64_t step);
  // Issues a new session for `worker` (the previous one is void), revives it if it was lost, renews its lease;
  // `step`: the task's global step (WorkerStats::present_at_step).
  uint64_t Register(int worker, absl::Time now, int64_t step);
  // OK if `session` is the worker's current session (and renews its lease); Aborted "register again" if the
  // worker has none here; PermissionDenied if it has another.
  absl::Status CheckSession(int worker, uint64_t session, absl::Time now);
  // Whether `worker` may report done with `session`: OK if it is the worker's current session, or if the worker
  // has none here (it never registered, e.g. it was refused, or its session was voided): leaving needs no
  // session. PermissionDenied if another process holds the worker's current session.
  absl::Status CheckLeave(int worker, uint64_t session) const;
  // Every session is void (a rollback to global step `step`): every worker registers again. Leases restart now.
  void ResetSessions(absl::Time now, int64_t step);
  // Declares lost, and returns, the active workers whose lease ran out (silent for longer than `lease`); `step`:
  // this task's step, recorded as where they left.
  std::vector<int> ExpireLeases(absl::Time now, absl::Duration lease, int64_t step);
  // An operator removed `worker` (dtrain_ctl): its later calls get RemovedError(why) until it leaves (Done).
  void Remove(int worker, std::string why) { workers_[worker].removed = std::move(why); }
  const std::string& removed(int worker) const { return workers_[worker].removed; }
  // Declares lost every active worker (the run ended and they went silent); `why` is recorded as their reason.
  std::vector<int> ExpireAll(int64_t step, const std::string& why);
  // Every active worker's lease starts again now (the task itself was not running, so its silence proves nothing).
  void RenewLeases(absl::Time now);

  bool done(int worker) const { return workers_[worker].stats.done; }
  bool lost(int worker) const { return workers_[worker].stats.lost; }
  bool active(int worker) const { return present(worker) && !done(worker) && !lost(worker); }
  // The active workers, ascending.
  std::vector<int> active_workers() const;
  // An elastic job: a worker that left before the end (stopped, removed, failed) and registers again takes part
  // again: it is no longer done. Returns whether it was such a worker.
  bool Rejoin(int worker);
  // Marks the worker done, leaving as `leaving` says (WorkerStats::failed unless kCompleted) at `step` for
  // `reason`; returns false if it already was done.
  bool MarkDone(int worker, Leaving leaving, int64_t step, std::string reason);
  // Some worker completed its training.
  bool any_completed() const;
  int num_active() const;
  int num_done() const;
  // Every worker is done or lost: nobody is left to move training.
  bool all_ended() const { return num_active() == 0; }
  // Whether a worker other than `worker` is still active (someone who could move the step).
  bool AnotherActive(int worker) const;
  std::vector<int> lost_workers() const;


  // Input positions (ps task 0): where each worker's input stream is after the batches of a step
  // (BatchStream::SaveState()), for checkpoints, so a resumed run reads what an uninterrupted one would.
  // Records the position a worker's commit for `step` carried; the worker then has no restored position.
  void RecordInputPosition(int worker, int64_t step, std::string position);
  // For a checkpoint of global step `label`: each worker's newest position of a step before `label`.
  std::map<int, std::string> InputPositionsBefore(int64_t label) const;
  // A checkpoint of step `label` was restored: its positions are each worker's until it commits again.
  void RestoreInputPositions(const std::map<int, std::string>& positions, int64_t label);
  // Where `worker`'s input resumes when it registers: the restored checkpoint's position until it commits again,
  // else the position its newest commit carried (a worker process started again reads on from there, as the
  // killed one would have; a worker that registers again after it was declared lost draws again the batches
  // whose gradients never made it into a commit); empty when there is neither (keep reading where you are).
  std::string ResumeInputPosition(int worker) const;

  WorkerStats& stats(int worker) { return workers_[worker].stats; }
  // The statistics of the present workers (an absent slot is left out).
  std::vector<WorkerStats> AllStats() const;
  RecentRequestIds& recent_ids(int worker) { return workers_[worker].recent_ids; }
  const RecentRequestIds& recent_ids(int worker) const { return workers_[worker].recent_ids; }

 private:
  struct Worker {
    WorkerStats stats;
    RecentRequestIds recent_ids{1024};  // retries arrive within a few calls of their original
    uint64_t session = 0;               // 0: none
    absl::Time last_contact = absl::InfinitePast();
    std::map<int64_t, std::string> positions;  // step -> input position after it; the newest few
    std::string restored_position;              // from the restored checkpoint, until the next commit
    bool present = true;                        // see present()
    std::string removed;                        // why an operator removed it (empty: not removed)
  };
  const int task_;
  const int initial_;
  std::vector<Worker> workers_;
  std::mt19937_64 random_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_MEMBERSHIP_H_
