#include "ps/checkpoint/delta_follower.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_set.h"
#include "ps/checkpoint/delta_chain.h"

namespace dtrain::ps {

absl::StatusOr<std::unique_ptr<DeltaFollower>> DeltaFollower::Open(const DeltaFollowerOptions& o) {
  DeltaFollowerOptions resolved = o;
  if (resolved.delta_dir.empty()) resolved.delta_dir = resolved.checkpoint_dir;
  std::unique_ptr<DeltaFollower> f(new DeltaFollower(std::move(resolved)));
  RETURN_IF_ERROR(f->Reload());
  return f;
}

absl::StatusOr<int64_t> DeltaFollower::NewestSnapshot() {
  if (o_.checkpoint_dir.empty()) return -1;
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(o_.env, o_.checkpoint_dir));
  std::map<std::pair<int64_t, int>, int> counts;
  for (const CheckpointFile& f : files) ++counts[{f.step, f.num_ps}];
  for (auto it = counts.rbegin(); it != counts.rend(); ++it) {
    if (it->second == it->first.second && (o_.until_step < 0 || it->first.first <= o_.until_step)) {
      return it->first.first;
    }
  }
  return -1;
}

absl::Status DeltaFollower::Reload() {
  parts_.clear();
  task_steps_.clear();
  deltas_ = 0;
  snapshot_step_ = -1;
  ASSIGN_OR_RETURN(int64_t snapshot, NewestSnapshot());
  if (snapshot >= 0) {
    absl::StatusOr<std::vector<CheckpointData>> parts =
        ReadCheckpointSet(o_.env, CheckpointPrefix(o_.checkpoint_dir, snapshot));
    if (parts.ok()) {
      parts_ = *std::move(parts);
      snapshot_step_ = snapshot;
    } else {
      LOG(WARNING) << "snapshot " << CheckpointPrefix(o_.checkpoint_dir, snapshot) << " cannot be read ("
                   << parts.status().message() << "): following the deltas of a fresh start instead";
    }
  }
  if (parts_.empty()) {
    // A fresh start: every task's chain of deltas from empty tables, to the first step they all reach.
    ASSIGN_OR_RETURN(std::vector<DeltaFile> files, ListDeltaFiles(o_.env, o_.delta_dir));
    std::set<int> num_ps;
    for (const DeltaFile& f : files) num_ps.insert(f.num_ps);
    if (num_ps.empty()) {
      return absl::NotFoundError(absl::StrCat("neither a complete snapshot in '", o_.checkpoint_dir,
                                              "' nor deltas in '", o_.delta_dir, "'"));
    }
    const int n = *num_ps.rbegin();
    int64_t first = -1;
    for (int t = 0; t < n; ++t) {
      int64_t mine = -1;
      for (const DeltaFile& f : files) {
        if (f.task != t || f.num_ps != n) continue;
        absl::StatusOr<DeltaHeader> h = ReadDeltaHeader(o_.env, f.path);
        if (h.ok() && h->prev_step == -1) {
          mine = f.step;
          break;
        }
      }
      if (mine < 0) {
        return absl::NotFoundError(absl::StrCat("ps task ", t, " of ", n, " has no snapshot in '", o_.checkpoint_dir,
                                                "' and no deltas of a fresh start in '", o_.delta_dir, "'"));
      }
      first = std::max(first, mine);
    }
    if (o_.until_step >= 0 && first > o_.until_step) {
      return absl::NotFoundError(absl::StrCat("the deltas start at step ", first, ", after --until_step"));
    }
    for (int t = 0; t < n; ++t) {
      ASSIGN_OR_RETURN(std::optional<CheckpointData> s, StateFromDeltasAlone(o_.env, o_.delta_dir, t, n, first));
      if (!s.has_value()) return absl::NotFoundError(absl::StrCat("the deltas of ps task ", t, " do not chain"));
      parts_.push_back(*std::move(s));
      ++deltas_;  // the first one (the chain to step `first` is that delta alone)
    }
  }
  for (const CheckpointData& p : parts_) task_steps_.push_back(p.global_step);
  ASSIGN_OR_RETURN(bool moved, Extend());
  (void)moved;
  return absl::OkStatus();
}

absl::StatusOr<bool> DeltaFollower::Extend() {
  const int n = static_cast<int>(parts_.size());
  int64_t target = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> reach(n);
  for (int t = 0; t < n; ++t) {
    ASSIGN_OR_RETURN(reach[t], NewestStepReachable(o_.env, o_.delta_dir, t, n, task_steps_[t]));
    target = std::min(target, reach[t]);
  }
  if (o_.until_step >= 0) target = std::min(target, o_.until_step);
  bool moved = false;
  for (int t = 0; t < n; ++t) {
    if (target <= task_steps_[t]) continue;
    CheckpointData& p = parts_[t];
    p.global_step = task_steps_[t];  // the chain's position, not the label
    ASSIGN_OR_RETURN(const int applied, ExtendWithDeltas(o_.env, o_.delta_dir, target, &p));
    task_steps_[t] = p.global_step;
    deltas_ += applied;
    moved = moved || applied > 0;
  }
  // Labelled with ps 0's step (sync: every task's), as the readers of a checkpoint's parts expect.
  for (CheckpointData& p : parts_) p.global_step = task_steps_[0];
  return moved;
}

absl::StatusOr<bool> DeltaFollower::Advance() {
  ASSIGN_OR_RETURN(const int64_t snapshot, NewestSnapshot());
  if (snapshot > step()) {
    // A newer snapshot (the end of training, or one written while the chain broke): start from it.
    RETURN_IF_ERROR(Reload());
    return true;
  }
  return Extend();
}

std::string DeltaFollower::description() const {
  const std::string deltas = absl::StrCat(deltas_, deltas_ == 1 ? " delta" : " deltas");
  if (snapshot_step_ < 0) return absl::StrCat(deltas, " from a fresh start");
  return absl::StrCat("model.ckpt-", snapshot_step_, deltas_ > 0 ? " + " + deltas : "");
}

}  // namespace dtrain::ps
