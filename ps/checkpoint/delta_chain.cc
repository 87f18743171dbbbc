#include "ps/checkpoint/delta_chain.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps {
namespace {

std::vector<DeltaFile> Mine(const std::vector<DeltaFile>& all, int task, int num_ps) {
  std::vector<DeltaFile> mine;
  for (const DeltaFile& f : all) {
    if (f.task == task && f.num_ps == num_ps) mine.push_back(f);
  }
  return mine;  // sorted by step (ListDeltaFiles)
}

// Applies to *state (at step `state->global_step`, -1: empty) the deltas of `mine` that chain from it, up to step
// `limit`; returns how many.
int ExtendChain(Env* env, const std::vector<DeltaFile>& mine, int64_t limit, CheckpointData* state) {
  int applied = 0;
  for (const DeltaFile& f : mine) {
    if (f.step <= state->global_step) continue;
    if (f.step > limit) break;
    absl::StatusOr<DeltaData> d = ReadDelta(env, f.path);
    if (!d.ok()) {
      LOG(WARNING) << "delta " << f.path << " cannot be read (" << d.status().message()
                   << "): the chain of deltas ends at step " << state->global_step;
      break;
    }
    if (d->prev_step > state->global_step) {
      LOG(WARNING) << "delta " << f.path << " applies after step " << d->prev_step << ", but the deltas before it end at step "
                   << state->global_step << " (one is missing): the chain ends there";
      break;
    }
    if (absl::Status s = ApplyDelta(*d, state); !s.ok()) {
      LOG(WARNING) << f.path << ": " << s.message() << "; the chain of deltas ends at step " << state->global_step;
      break;
    }
    ++applied;
  }
  return applied;
}

// The first delta of a fresh start among `mine` (prev_step -1), read; nullopt when there is none.
std::optional<DeltaData> FreshStart(Env* env, const std::vector<DeltaFile>& mine) {
  for (const DeltaFile& f : mine) {
    absl::StatusOr<DeltaHeader> h = ReadDeltaHeader(env, f.path);
    if (!h.ok() || h->prev_step != -1) continue;
    absl::StatusOr<DeltaData> d = ReadDelta(env, f.path);
    if (d.ok()) return *std::move(d);
  }
  return std::nullopt;
}

// The state of `base` extended up to `limit`, as a RestorableCheckpoint named after what was read.
std::optional<RestorableCheckpoint> Extend(Env* env, const std::string& delta_dir, const std::vector<DeltaFile>& mine,
                                           std::optional<RestorableCheckpoint> base, int64_t limit) {
  if (!base.has_value()) {
    std::optional<DeltaData> first = FreshStart(env, mine);
    if (!first.has_value()) return std::nullopt;
    RestorableCheckpoint fresh{"", EmptyStateFor(*first)};
    const int n = ExtendChain(env, mine, limit, &fresh.data);
    if (n == 0) return std::nullopt;
    fresh.path = absl::StrCat(delta_dir, ": ", n, n == 1 ? " delta" : " deltas", " from a fresh start to step ",
                              fresh.data.global_step);
    return fresh;
  }
  const int n = ExtendChain(env, mine, limit, &base->data);
  if (n > 0) {
    absl::StrAppend(&base->path, " + ", n, n == 1 ? " delta" : " deltas", " to step ", base->data.global_step);
  }
  return base;
}

// The newest valid checkpoint of the task with a step below `below`, checked against the config; nullopt if none.
absl::StatusOr<std::optional<RestorableCheckpoint>> NewestCheckpointBelow(Env* env, const std::string& dir,
                                                                         const TrainConfig& config, int task,
                                                                         int num_ps, int64_t below) {
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(env, dir));
  for (auto it = files.rbegin(); it != files.rend(); ++it) {
    if (it->task != task || it->num_ps != num_ps || it->step >= below) continue;
    absl::StatusOr<CheckpointData> data = ReadCheckpoint(env, it->path);
    if (!data.ok() || data->global_step != it->step) continue;
    RETURN_IF_ERROR(CheckCompatible(*data, it->path, config, task, num_ps));
    return RestorableCheckpoint{it->path, *std::move(data)};
  }
  return std::nullopt;
}

}  // namespace

CheckpointData EmptyStateFor(const DeltaData& delta) {
  CheckpointData s;
  const CheckpointData& d = delta.state;
  s.task_index = d.task_index;
  s.num_ps = d.num_ps;
  s.global_step = -1;
  s.task_step = 0;
  s.model_signature = d.model_signature;
  s.optimizer = d.optimizer;
  s.num_slots = d.num_slots;
  s.has_moving_averages = d.has_moving_averages;
  s.sparse_optimizer = d.sparse_optimizer;
  s.sparse_num_slots = d.sparse_num_slots;
  for (const SparseTableState& t : d.tables) {
    SparseTableState empty;
    empty.spec = t.spec;
    empty.slots.resize(t.slots.size());
    s.tables.push_back(std::move(empty));
  }
  return s;
}

absl::StatusOr<std::optional<RestorableCheckpoint>> FindStateToRestore(Env* env, const std::string& checkpoint_dir,
                                                                      const std::string& delta_dir,
                                                                      const TrainConfig& config, int task, int num_ps,
                                                                      int64_t restore_step) {
  if (delta_dir.empty() || restore_step == kRestoreNone) {
    return FindCheckpointToRestore(env, checkpoint_dir, config, task, num_ps, restore_step);
  }
  ASSIGN_OR_RETURN(std::vector<DeltaFile> all, ListDeltaFiles(env, delta_dir));
  const std::vector<DeltaFile> mine = Mine(all, task, num_ps);
  auto checked = [&](std::optional<RestorableCheckpoint> r) -> absl::StatusOr<std::optional<RestorableCheckpoint>> {
    if (r.has_value()) RETURN_IF_ERROR(CheckCompatible(r->data, r->path, config, task, num_ps));
    return r;
  };
  if (restore_step >= 0) {
    bool checkpoint_there = false;
    if (!checkpoint_dir.empty()) {
      ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(env, checkpoint_dir));
      for (const CheckpointFile& f : files) {
        checkpoint_there = checkpoint_there || (f.task == task && f.num_ps == num_ps && f.step == restore_step);
      }
    }
    if (checkpoint_there || mine.empty()) {
      return FindCheckpointToRestore(env, checkpoint_dir, config, task, num_ps, restore_step);
    }
    std::optional<RestorableCheckpoint> base;
    if (!checkpoint_dir.empty()) {
      ASSIGN_OR_RETURN(base, NewestCheckpointBelow(env, checkpoint_dir, config, task, num_ps, restore_step));
    }
    std::optional<RestorableCheckpoint> r = Extend(env, delta_dir, mine, std::move(base), restore_step);
    if (r.has_value() && r->data.global_step == restore_step) return checked(std::move(r));
    const absl::Status problem = absl::FailedPreconditionError(absl::StrCat(
        "ps task ", task, " has no checkpoint for step ", restore_step, " and no chain of deltas in '", delta_dir,
        "' reaches it", r.has_value() ? absl::StrCat(" (they reach step ", r->data.global_step, ")") : std::string(),
        ": the ps tasks' files are out of step; restore them together or start afresh"));
    if (config.mode == "sync") return problem;
    LOG(WARNING) << "ps task " << task << ": " << problem.message()
                 << "; async mode: restoring this task's newest state instead";
  }
  ASSIGN_OR_RETURN(std::optional<RestorableCheckpoint> base,
                   FindCheckpointToRestore(env, checkpoint_dir, config, task, num_ps, kRestoreNewest));
  return checked(Extend(env, delta_dir, mine, std::move(base), std::numeric_limits<int64_t>::max()));
}

absl::StatusOr<std::vector<int64_t>> DeltaStepsReachable(Env* env, const std::string& delta_dir, int task, int num_ps,
                                                         const std::vector<int64_t>& bases) {
  std::vector<int64_t> steps;
  if (delta_dir.empty()) return steps;
  ASSIGN_OR_RETURN(std::vector<DeltaFile> all, ListDeltaFiles(env, delta_dir));
  const std::vector<DeltaFile> mine = Mine(all, task, num_ps);
  if (mine.empty()) return steps;
  // Each delta read once: its header decides the chains, its body whether it restores.
  std::vector<std::optional<DeltaHeader>> header(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    absl::StatusOr<DeltaData> d = ReadDelta(env, mine[i].path);
    if (d.ok()) header[i] = DeltaHeader{d->state.global_step, d->prev_step};
  }
  std::vector<int64_t> starts = bases;
  starts.push_back(-1);  // a fresh start
  for (int64_t start : starts) {
    int64_t at = start;
    for (size_t i = 0; i < mine.size(); ++i) {
      if (mine[i].step <= at) continue;
      if (!header[i].has_value() || header[i]->prev_step > at || (start == -1 && at == -1 && header[i]->prev_step != -1)) {
        break;
      }
      at = mine[i].step;
      steps.push_back(at);
    }
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

namespace {

absl::Status RemoveDeltas(Env* env, const std::string& delta_dir, int task, int num_ps, bool after, int64_t step) {
  if (delta_dir.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<DeltaFile> all, ListDeltaFiles(env, delta_dir));
  absl::Status first;
  for (const DeltaFile& f : Mine(all, task, num_ps)) {
    if (after ? f.step <= step : f.step > step) continue;
    absl::Status s = env->RemoveFile(f.path);
    if (!s.ok() && !absl::IsNotFound(s)) {
      LOG(WARNING) << "cannot delete delta " << f.path << ": " << s.message();
      if (first.ok()) first = s;
    }
  }
  return first;
}

}  // namespace

absl::StatusOr<int> ExtendWithDeltas(Env* env, const std::string& delta_dir, int64_t limit, CheckpointData* state) {
  if (delta_dir.empty()) return 0;
  ASSIGN_OR_RETURN(std::vector<DeltaFile> all, ListDeltaFiles(env, delta_dir));
  return ExtendChain(env, Mine(all, state->task_index, state->num_ps), limit, state);
}

absl::StatusOr<std::optional<CheckpointData>> StateFromDeltasAlone(Env* env, const std::string& delta_dir, int task,
                                                                   int num_ps, int64_t limit) {
  if (delta_dir.empty()) return std::nullopt;
  ASSIGN_OR_RETURN(std::vector<DeltaFile> all, ListDeltaFiles(env, delta_dir));
  const std::vector<DeltaFile> mine = Mine(all, task, num_ps);
  std::optional<DeltaData> first = FreshStart(env, mine);
  if (!first.has_value()) return std::nullopt;
  CheckpointData state = EmptyStateFor(*first);
  if (ExtendChain(env, mine, limit, &state) == 0) return std::nullopt;
  return state;
}

absl::StatusOr<int64_t> NewestStepReachable(Env* env, const std::string& delta_dir, int task, int num_ps,
                                            int64_t from) {
  if (delta_dir.empty()) return from;
  ASSIGN_OR_RETURN(std::vector<DeltaFile> all, ListDeltaFiles(env, delta_dir));
  int64_t at = from;
  for (const DeltaFile& f : Mine(all, task, num_ps)) {
    if (f.step <= at) continue;
    absl::StatusOr<DeltaHeader> h = ReadDeltaHeader(env, f.path);
    if (!h.ok() || h->prev_step > at || (at == -1 && h->prev_step != -1)) break;
    at = f.step;
  }
  return at;
}

absl::Status RemoveDeltasAfter(Env* env, const std::string& delta_dir, int task, int num_ps, int64_t step) {
  return RemoveDeltas(env, delta_dir, task, num_ps, /*after=*/true, step);
}

absl::Status RemoveDeltasUpTo(Env* env, const std::string& delta_dir, int task, int num_ps, int64_t step) {
  return RemoveDeltas(env, delta_dir, task, num_ps, /*after=*/false, step);
}

}  // namespace dtrain::ps
