// Resharding: restoring a checkpoint written by N ps tasks onto a cluster of M (growing 1 -> 3, shrinking 3 -> 2).
// TensorFlow's checkpoints are by variable name, so its users may change the number of ps tasks between runs;
// dtrain's files are one per task (checkpoint_format.h), and this reassembles them for the new placement:
//
// - dense variables by name: each slice the new task holds takes its floats (values, every optimizer slot, the
//   moving average) from the old slices of the same variable over the same range of the model's flat buffer (a
//   model's layout is fixed by its signature, which must match; the names are checked too). BatchNorm's running
//   statistics are slices like any other (state, not trained) and move the same way;
// - sparse tables by id: every row of every old task's shard goes, with its optimizer slots, to the task that
//   ShardOfId(id, M) names;
// - the global step stays; every task's own step (its learning-rate schedule) becomes the global step (in sync
//   mode they are equal anyway; in async mode a task's count of its own updates does not survive a reshard); the
//   workers' input positions go from old task 0 to new task 0.
// In sync mode a run resumed on M tasks therefore trains exactly as one that kept N (tests: checkpoint_reshard_test
// and tests/reshard_test.sh, 1 -> 3 and 3 -> 2 against an unchanged run).
//
// Which checkpoint a task restores (FindCheckpointToRestore in checkpoint_dir.h, and the ParameterServer's Probe
// and Restore): for each step, newest first, the task's own file of that step if there is one, else a complete
// checkpoint of that step by another number of ps tasks (every task's file present), resharded.
//
// Errors: FailedPrecondition when the parts do not fit `config` (another model, optimizer or tables: the message
// names the difference, as CheckCompatible's) or do not hold some range of a variable the new task needs;
// DataLoss when the parts contradict each other (other steps, a row on a task that does not own its id, an id
// twice); the readers' errors (DataLoss, NotFound...) for missing or corrupt files.
//
// Thread-safety: free functions without shared state, safe from any thread.
#ifndef DTRAIN_PS_CHECKPOINT_CHECKPOINT_RESHARD_H_
#define DTRAIN_PS_CHECKPOINT_CHECKPOINT_RESHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "ps/api/ps_types.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_format.h"

namespace dtrain::ps {

// The state ps task `task` of `num_ps`, configured with `config` (its slices), restores from `parts`: every task's
// file of one checkpoint, ordered by task (ReadCheckpointSet's result). `name` prefixes the messages.
absl::StatusOr<CheckpointData> ReshardCheckpoint(const std::vector<CheckpointData>& parts, const std::string& name,
                                                 const TrainConfig& config, int task, int num_ps);

// The checkpoint of `step` in `dir` for ps task `task` of `num_ps`: its own file, else the complete checkpoint of
// that step by another number of tasks, resharded (RestorableCheckpoint::resharded_from says by how many). Checked
// with CheckCompatible. NotFound when `dir` holds neither.
absl::StatusOr<RestorableCheckpoint> ReadCheckpointForTask(Env* env, const std::string& dir, int64_t step,
                                                           const TrainConfig& config, int task, int num_ps);

// The steps of `dir` that ReadCheckpointForTask can restore (each read and checked; a corrupt or incompatible
// one is left out), ascending.
absl::StatusOr<std::vector<int64_t>> RestorableSteps(Env* env, const std::string& dir, const TrainConfig& config,
                                                     int task, int num_ps);

// The steps of `dir` with a checkpoint for task `task` of `num_ps` (its own file) or a complete one by another
// number of tasks, newest first (by name only; nothing is read).
absl::StatusOr<std::vector<int64_t>> CandidateSteps(Env* env, const std::string& dir, int task, int num_ps);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_RESHARD_H_
