// A ps task's state from its snapshots (the checkpoints, checkpoint_dir.h) and the deltas written after them
// (delta_format.h): what a restarted task restores, which steps it could restore (for the chief's Probe), and
// which deltas are no longer needed.
//
// A chain: a base (a checkpoint of step S, or the empty tables of a fresh start) and the deltas after it, each
// applying to the state its predecessor left (prev_step <= the state's step < its step). A delta that cannot be
// read (corrupt, truncated) ends the chain there, with a warning: the state of the delta before it is the newest
// restorable.
//
// Thread-safety: free functions without shared state.
#ifndef DTRAIN_PS_CHECKPOINT_DELTA_CHAIN_H_
#define DTRAIN_PS_CHECKPOINT_DELTA_CHAIN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "ps/api/ps_types.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/delta_format.h"

namespace dtrain::ps {

// FindCheckpointToRestore (checkpoint_dir.h) extended by the deltas of `delta_dir` (empty: none, exactly
// FindCheckpointToRestore):
//   kRestoreNewest  the newest valid checkpoint and every delta after it that chains (without a checkpoint: a
//                   chain from a fresh start, when there is one).
//   k >= 0          the checkpoint of step k if there is one; else the newest checkpoint before k (or a fresh
//                   start) and the deltas up to step k exactly. Sync mode: FailedPrecondition when no chain
//                   reaches k; async mode: the newest instead, with a warning.
// The result's path says what was read ("<checkpoint> + 3 deltas to step 130", or "<delta dir>: 5 deltas from a
// fresh start to step 130"). Errors as FindCheckpointToRestore.
absl::StatusOr<std::optional<RestorableCheckpoint>> FindStateToRestore(Env* env, const std::string& checkpoint_dir,
                                                                      const std::string& delta_dir,
                                                                      const TrainConfig& config, int task, int num_ps,
                                                                      int64_t restore_step);

// The steps of task `task`'s deltas that a chain from one of `bases` (restorable checkpoint steps) reaches, or
// from a fresh start; ascending. Deltas are read whole (so that a step listed is one that restores).
absl::StatusOr<std::vector<int64_t>> DeltaStepsReachable(Env* env, const std::string& delta_dir, int task, int num_ps,
                                                         const std::vector<int64_t>& bases);

// Removes task `task`'s deltas of steps after `step` (a task restored to `step` abandons them: they belong to a
// future that will not happen). Returns the first removal error after trying them all.
absl::Status RemoveDeltasAfter(Env* env, const std::string& delta_dir, int task, int num_ps, int64_t step);
// Removes task `task`'s deltas of steps up to `step` (no chain from a newer snapshot needs them).
absl::Status RemoveDeltasUpTo(Env* env, const std::string& delta_dir, int task, int num_ps, int64_t step);

// Applies to `state` (a checkpoint or an earlier chain's end of task state->task_index of state->num_ps) the deltas
// of `delta_dir` that chain from it, up to step `limit`; returns how many (0: none reaches past it).
absl::StatusOr<int> ExtendWithDeltas(Env* env, const std::string& delta_dir, int64_t limit, CheckpointData* state);
// The state the deltas of a fresh start of task `task` rebuild, up to step `limit`; nullopt when there is no
// chain from a fresh start.
absl::StatusOr<std::optional<CheckpointData>> StateFromDeltasAlone(Env* env, const std::string& delta_dir, int task,
                                                                   int num_ps, int64_t limit);
// The newest step the deltas of task `task` reach from a state of step `from` (-1: a fresh start): `from` itself
// when none chains. Reads only the deltas' headers.
absl::StatusOr<int64_t> NewestStepReachable(Env* env, const std::string& delta_dir, int task, int num_ps,
                                            int64_t from);

// The state a first delta of a fresh start (prev_step -1) applies to: `delta`'s task, model and tables, without
// rows, at step -1.
CheckpointData EmptyStateFor(const DeltaData& delta);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_DELTA_CHAIN_H_
