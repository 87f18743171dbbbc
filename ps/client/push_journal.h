// PushJournal: the pushes one worker process saw acknowledged by ps task 0, one line each, for a checker that
// proves each of them was applied exactly once on every ps task, or undone by a restore (scripts/check_updates.py,
// with the ps tasks' ps/checkpoint/applied_journal.h files). dtrain_worker --push_journal_dir=DIR keeps one.
//
// One file per process (a restarted worker writes a new one):
//
//   <dir>/pushes.w<worker>.<start micros, 20 digits>-<pid>.journal
//
//   # dtrain push journal v1 worker=W pid=P start_us=U            the first line
//   P <worker> <step> <request id> <outcome> <global step>        a push ps 0 acknowledged: accepted, duplicate,
//                                                                  dropped_stale, dropped_backup,
//                                                                  skipped_nonfinite; and ps 0's step after it
//
// Each line is written with one write(2) (nothing written is lost when the process is killed; a last line
// without its newline is torn and ignored by readers).
//
// Errors: Open fails like Env::NewWritableFile; a line that cannot be written is logged once (LOG(ERROR)) and the
// journal stops there (status() says why): the worker trains on.
//
// Thread-safety: every method may be called from any thread.
#ifndef DTRAIN_PS_CLIENT_PUSH_JOURNAL_H_
#define DTRAIN_PS_CLIENT_PUSH_JOURNAL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

class PushJournal {
 public:
  // Creates `dir` if needed and a new journal file in it for worker `worker` (named as above).
  static absl::StatusOr<std::unique_ptr<PushJournal>> Open(Env* env, const std::string& dir, int worker);

  // Ps 0 answered `response` to this worker's push of `step` with `request_id`.
  void Acknowledged(int worker, int64_t step, uint64_t request_id, const PushResponse& response);
  // "accepted", "duplicate", "dropped_stale", "dropped_backup", "skipped_nonfinite".
  static absl::string_view OutcomeName(PushResponse::Outcome outcome);

  absl::Status status() const;
  const std::string& path() const { return path_; }

 private:
  PushJournal(std::string path, std::unique_ptr<WritableFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  void Write(const std::string& line);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CLIENT_PUSH_JOURNAL_H_
