// The checkpoint directory and the restore policy: how checkpoint files are named, found, chosen for a restore,
// read back and pruned. One file per ps task and step, TensorFlow-style:
//
//   <dir>/model.ckpt-<step>.ps<task>-of-<num_ps>
//
// The files of one step across all tasks form the checkpoint `<dir>/model.ckpt-<step>` (its "prefix"). The
// bytes inside are checkpoint_format.h; writing is checkpoint_writer.h; checkpoint_set.h reads a whole
// prefix for evaluation. Every function reaches the disk through the given Env (common/env.h).
//
// Errors: as ParseCheckpoint (DataLoss, FailedPrecondition), the Env's (NotFound, PermissionDenied...), and
// FailedPrecondition from CheckCompatible / FindCheckpointToRestore with a hint how to fix it.
//
// Thread-safety: free functions without shared state, safe from any thread.
#ifndef DTRAIN_PS_CHECKPOINT_CHECKPOINT_DIR_H_
#define DTRAIN_PS_CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "ps/checkpoint/checkpoint_format.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

// "<dir>/model.ckpt-<step>" and "<prefix>.ps<task>-of-<num_ps>".
std::string CheckpointPrefix(const std::string& dir, int64_t step);
std::string CheckpointPath(const std::string& dir, int64_t step, int task, int num_ps);

// One file found in a checkpoint directory (by name only; the content is not read).
struct CheckpointFile {
  int64_t step = 0;
  int task = 0;
  int num_ps = 0;
  std::string path;
};
// Parses a file name (without directory) of the form above; false for anything else (including the
// temporary files of an unfinished write).
bool ParseCheckpointFileName(absl::string_view name, CheckpointFile* out);
// Every checkpoint file in `dir`, sorted by (step, task). A missing directory is an empty list; other
// file-system errors are returned.
absl::StatusOr<std::vector<CheckpointFile>> ListCheckpointFiles(Env* env, const std::string& dir);

// Reads and parses one file (ParseCheckpoint's errors, named by `path`, or the Env's).
absl::StatusOr<CheckpointData> ReadCheckpoint(Env* env, const std::string& path);

// Whether `data` (read from `path`) can be restored into ps task `task` of `num_ps` configured with `config`:
// same task and number of ps tasks, model signature, optimizer and exactly the slices of config.slices, and the
// same sparse tables (name, dim, rows, init_scale, init_seed; max_rows and admit_after may change) trained with
// the same sparse optimizer.
// FailedPrecondition naming the difference and how to fix it (use another --checkpoint_dir, or the same
// model/flags as the run that wrote it).
absl::Status CheckCompatible(const CheckpointData& data, const std::string& path, const TrainConfig& config,
                             int task, int num_ps);
// CheckCompatible without the task, the number of tasks and the slices: the model signature, the optimizer and
// the sparse tables (what a checkpoint of another number of ps tasks must share to be resharded).
absl::Status CheckModelCompatible(const CheckpointData& data, const std::string& path, const TrainConfig& config);

// The checkpoint ps task `task` of `num_ps` (configured with `config`) restores from `dir`, read, validated
// and checked with CheckCompatible; nullopt when there is none to restore (or `dir` is empty). `restore_step`
// as in RegisterRequest (ps/api/ps_types.h):
//   kRestoreNone    nullopt.
//   kRestoreNewest  the newest file of this task that reads back valid. A corrupt or truncated file is skipped
//                   with LOG(WARNING) "skipping corrupt checkpoint X: ...; trying the previous one"; if every
//                   file is corrupt, nullopt (with a warning). The newest valid file must be compatible: a
//                   checkpoint of another model/layout is refused (FailedPrecondition), never skipped, so two
//                   runs never mix their files in one directory.
//   k >= 0          the file of step k. Sync mode (config.mode): FailedPrecondition if it is missing, its
//                   read error (DataLoss) if it is corrupt. Async mode: falls back to kRestoreNewest with a
//                   warning.
// A step of which this task has no file of its own but `dir` holds a complete checkpoint written by another number
// of ps tasks is restored from that one, resharded (checkpoint_reshard.h): for each step, newest first, the task's
// own file, else such a checkpoint. FailedPrecondition when `dir` holds checkpoints of another number of ps tasks
// but none complete; InvalidArgument for a negative restore_step that is neither constant.
struct RestorableCheckpoint {
  std::string path;  // the file, or "<prefix>.ps*-of-<N>" for a resharded checkpoint
  CheckpointData data;
  int resharded_from = 0;  // the number of ps tasks that wrote it, when resharded; 0: the task's own file
};
absl::StatusOr<std::optional<RestorableCheckpoint>> FindCheckpointToRestore(Env* env, const std::string& dir,
                                                                           const TrainConfig& config, int task,
                                                                           int num_ps, int64_t restore_step);

// Deletes all but the newest `keep` files of (task, num_ps) in `dir` (keep <= 0: deletes nothing). Returns
// the first deletion error, after trying them all.
absl::Status PruneCheckpoints(Env* env, const std::string& dir, int task, int num_ps, int keep);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_DIR_H_
