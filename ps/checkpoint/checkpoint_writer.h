// CheckpointWriter: saves one ps task's checkpoint files (checkpoint_format.h, named as
// checkpoint_dir.h says) so that a failure is retried, reported and never costs the checkpoint saved
// before it.
//
// Save(data):
//   1. writes <dir>/model.ckpt-<data.global_step>.ps<task>-of-<num_ps> atomically (temporary file, fsync,
//      rename, fsync of the directory; WriteFileAtomically in common/env.h), creating <dir> if missing;
//   2. on failure (full disk, failed rename or fsync, ...) removes the temporary file, logs a WARNING and
//   tries
//      again after a backoff (options.initial_backoff, doubling, at most options.max_backoff), up to
//      options.max_attempts writes in all; InvalidArgument is not retried;
//   3. if every attempt failed: LOG(ERROR) "ps task T: cannot save checkpoint P after N attempts: ..." and
//      returns that error (the last attempt's code: ResourceExhausted for a full disk, Internal for EIO...,
//      with a message naming the file and the attempts). Older checkpoints are untouched and still
//      restorable, and no temporary file is left (unless removing it failed too, which the message says);
//   4. after a successful write, LOG(INFO) and deletes all but the newest options.keep files of this task
//      (a deletion that fails is logged as a WARNING and kept in last_prune_status(); the save still
//      succeeded).
//
// last_status() keeps the outcome of the most recent Save, so an owner that saves from many threads (the
// ParameterServer saves from its RPC threads) can report it later, e.g. make a process whose final save
// failed exit non-zero.
//
// Example:
//   CheckpointOptions o;  o.dir = "/ckpt";  o.keep = 3;
//   CheckpointWriter writer(o, /*task=*/0, /*num_ps=*/1);
//   absl::Status s = writer.Save(data);   // data.global_step names the file
//
// Thread-safety: every method may be called from any thread; Saves are serialized (one at a time, in the
// order they take the internal lock), so pruning never races a write.
#ifndef DTRAIN_PS_CHECKPOINT_CHECKPOINT_WRITER_H_
#define DTRAIN_PS_CHECKPOINT_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "ps/checkpoint/checkpoint_format.h"
#include "ps/checkpoint/checkpoint_options.h"

namespace dtrain::ps {

class CheckpointWriter {
 public:
  // Preconditions (CHECKed, programmer errors): options.enabled(), ValidateCheckpointOptions(options) is OK,
  // 0 <= task < num_ps.
  CheckpointWriter(const CheckpointOptions& options, int task, int num_ps);

  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // See the file comment. The file is named by `data.task_index` and `data.num_ps` (the constructor's, or others
  // after a live change of the job's ps tasks; 0 <= task_index < num_ps, CHECKed).
  absl::Status Save(const CheckpointData& data) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status last_status() const ABSL_LOCKS_EXCLUDED(mu_);        // of the newest Save; OK before any
  absl::Status last_prune_status() const ABSL_LOCKS_EXCLUDED(mu_);  // of the newest pruning; OK before any
  int64_t failed_saves() const ABSL_LOCKS_EXCLUDED(mu_);            // Saves that returned an error
  const CheckpointOptions& options() const { return options_; }

 private:
  absl::Status WriteOnce(const std::string& path, const std::string& bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CheckpointOptions options_;

  mutable absl::Mutex mu_;
  absl::Status last_status_ ABSL_GUARDED_BY(mu_);
  absl::Status last_prune_status_ ABSL_GUARDED_BY(mu_);
  int64_t failed_saves_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_WRITER_H_
