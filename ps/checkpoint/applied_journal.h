// AppliedJournal: what one ps task accepted and applied, push by push, written beside its checkpoints so that a
// checker can prove, after a run with faults, that every push a worker saw acknowledged was applied exactly once,
// except those that a restore to an older checkpoint undid (scripts/check_updates.py reads these files with the
// workers' ps/client/push_journal.h files; tests/chaos.sh runs it after every trial).
//
// One file per process and layout (a restarted task writes a new one, and so does a task the job moved onto
// another number of ps tasks), in the checkpoint directory, created with its first record (so the files order as
// their first records do, and a process that records nothing under a layout leaves no file: a --join task
// waiting to be moved in, a ps 0 started again with the spec's set and restored into the job's):
//
//   <dir>/applied.ps<task>-of-<num_ps>.<micros of the first record, 20 digits>-<pid>.journal
//
// Text, one record a line, written with one write(2) each (so a process killed with SIGKILL loses nothing it
// wrote; only its last line may be torn, and readers ignore a last line without its newline). Sync() makes
// everything written durable (fsync); the ParameterServer calls it before it writes each checkpoint file, so
// a checkpoint on disk always has the records of what it holds on disk too.
//
//   # dtrain applied journal v1 task=T num_ps=N pid=P start_us=U     the first line
//   K <worker> <step> <request id>           the task accepted the push (answered kAccepted: sync, its gradient
//                                            is buffered for the step's decision; async, it is being applied)
//   A <worker> <step> <request id> <at>      the push's gradient went into the parameters (and rows), making the
//                                            task's step `at` (sync: step + 1; async ps 0: the global step after
//                                            it; async other tasks: their checkpoint label after it)
//   V <worker> <step> <request id>           ps 0 set the accepted push aside before any update: its step was
//                                            planned again (an elastic job with a global batch lost a worker of
//                                            it) and the worker computes it again; it must be applied nowhere
//   P <worker> <step> <request id> <k> <n>   an async upload under --nonfinite=apply was cut off with k of the
//                                            task's n slices applied (each as it arrived whole); never acknowledged
//   C <label>                                the state was copied for checkpoint <label> right here: the
//                                            checkpoint holds exactly the A records before this line (since the
//                                            last R/X/I)
//   R <label>                                the state was replaced by the task's checkpoint <label>
//   X <label> <num_ps>                       ... by checkpoint <label> written by <num_ps> tasks (resharded)
//   I                                        the state was replaced by the chief's initial values
//
// Errors: Open fails like Env::CreateDirs. A file that cannot be created, or a record that cannot be written
// (full disk), is logged once
// (LOG(ERROR)) and the journal stops there; Sync() returns that error from then on. Training goes on: the
// journal is evidence for a checker, not state.
//
// Thread-safety: every method may be called from any thread (one internal lock orders the records).
#ifndef DTRAIN_PS_CHECKPOINT_APPLIED_JOURNAL_H_
#define DTRAIN_PS_CHECKPOINT_APPLIED_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"

namespace dtrain::ps {

class AppliedJournal {
 public:
  // Creates `dir` if needed; the journal of ps task `task` of `num_ps` (its file comes with the first record).
  static absl::StatusOr<std::unique_ptr<AppliedJournal>> Open(Env* env, const std::string& dir, int task,
                                                              int num_ps);
  // Whether `name` (without directory) is a journal file name of this form, and for which task and num_ps.
  static bool ParseFileName(absl::string_view name, int* task, int* num_ps);

  void Accepted(int worker, int64_t step, uint64_t request_id);
  void Applied(int worker, int64_t step, uint64_t request_id, int64_t at);
  void Voided(int worker, int64_t step, uint64_t request_id);
  void PartlyApplied(int worker, int64_t step, uint64_t request_id, int slices, int of);
  // Async, ps 0: the push arrived after the run reached its last step and was dropped; the other tasks, which apply a
  // push on their own as it arrives, may have applied their parts of it.
  void DroppedAfterEnd(int worker, int64_t step, uint64_t request_id);
  void Checkpointed(int64_t label);
  void Restored(int64_t label);
  void Resharded(int64_t label, int from_num_ps);
  void Initialized();
  // Everything written so far on stable storage.
  absl::Status Sync();

  // The file's path ("" before the first record).
  std::string path() const {
    absl::MutexLock lock(&mu_);
    return path_;
  }

 private:
  AppliedJournal(Env* env, std::string dir, int task, int num_ps)
      : env_(env), dir_(std::move(dir)), task_(task), num_ps_(num_ps) {}
  void Write(const std::string& line);
  absl::Status CreateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // the file and its first line

  Env* const env_;
  const std::string dir_;
  const int task_, num_ps_;
  mutable absl::Mutex mu_;
  std::string path_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_APPLIED_JOURNAL_H_
