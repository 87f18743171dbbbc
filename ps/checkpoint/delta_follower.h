// DeltaFollower: a reader's copy of a model while a cluster trains it (serving, dtrain_eval --follow_deltas):
// every ps task's newest complete snapshot (a checkpoint of one step on all tasks, checkpoint_set.h), or a fresh
// start, and the deltas written after it (delta_format.h), advanced as new deltas arrive. The copy is exactly
// the tasks' state at the step of its last delta: the ps writes the values it holds, bit for bit.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<DeltaFollower> f, DeltaFollower::Open({env, "/ckpt", "/ckpt"}));
//   ... evaluate f->parts() (AssembleFlatBuffer, ReadSparseTables, as for a checkpoint) ...
//   while (...) { ASSIGN_OR_RETURN(bool moved, f->Advance()); if (moved) evaluate again; sleep; }
//
// Steps: in sync mode every task writes its delta of the same steps; the copy moves to the newest step every task
// has reached. In async mode the tasks' steps differ: each task moves to its newest delta, and the copy's step is
// ps task 0's. A chain that breaks (a delta pruned before it was read, a task that restarted and restored an older
// step) is picked up again from the newest snapshot.
//
// Thread-safety: one thread uses a follower.
#ifndef DTRAIN_PS_CHECKPOINT_DELTA_FOLLOWER_H_
#define DTRAIN_PS_CHECKPOINT_DELTA_FOLLOWER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "ps/checkpoint/checkpoint_format.h"

namespace dtrain::ps {

struct DeltaFollowerOptions {
  Env* env = Env::Default();
  std::string checkpoint_dir;  // the snapshots (may be empty: deltas from a fresh start only)
  std::string delta_dir;       // the deltas (empty: the checkpoint directory's)
  // >= 0: stop at this step (the state of exactly that step when the deltas reach it; sync mode).
  int64_t until_step = -1;
};

class DeltaFollower {
 public:
  // NotFound when there is neither a complete snapshot nor deltas of a fresh start; the readers' errors.
  static absl::StatusOr<std::unique_ptr<DeltaFollower>> Open(const DeltaFollowerOptions& o);

  // Applies the deltas (or a newer snapshot) that arrived since; returns whether the copy moved.
  absl::StatusOr<bool> Advance();

  int64_t step() const { return parts_[0].global_step; }
  // One state per ps task, ordered by task, all labelled with step() (what ReadCheckpointSet gives).
  const std::vector<CheckpointData>& parts() const { return parts_; }
  // What the copy is made of: "model.ckpt-100 + 4 deltas", "5 deltas from a fresh start".
  std::string description() const;
  int64_t deltas_applied() const { return deltas_; }

 private:
  explicit DeltaFollower(DeltaFollowerOptions o) : o_(std::move(o)) {}
  // From scratch: the newest complete snapshot or a fresh start, then every delta.
  absl::Status Reload();
  // Extends every task to the newest step all of them reach (capped by until_step).
  absl::StatusOr<bool> Extend();
  // The newest step with a complete, readable snapshot (at most until_step); -1: none.
  absl::StatusOr<int64_t> NewestSnapshot();

  DeltaFollowerOptions o_;
  std::vector<CheckpointData> parts_;  // per task, labelled with ps 0's step
  std::vector<int64_t> task_steps_;    // per task: the step its state is at (its chain's position)
  int64_t snapshot_step_ = -1;  // -1: a fresh start
  int64_t deltas_ = 0;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_DELTA_FOLLOWER_H_
