#include "ps/client/push_journal.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps {

absl::StatusOr<std::unique_ptr<PushJournal>> PushJournal::Open(Env* env, const std::string& dir, int worker) {
  RETURN_IF_ERROR(env->CreateDirs(dir));
  const int64_t start_us = absl::ToUnixMicros(absl::Now());
  const std::string path = absl::StrFormat("%s%spushes.w%d.%020d-%d.journal", dir,
                                           dir.empty() || dir.back() == '/' ? "" : "/", worker, start_us,
                                           static_cast<int>(getpid()));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(path));
  std::unique_ptr<PushJournal> journal(new PushJournal(path, std::move(file)));
  journal->Write(
      absl::StrCat("# dtrain push journal v1 worker=", worker, " pid=", getpid(), " start_us=", start_us, "\n"));
  RETURN_IF_ERROR(journal->status());
  return journal;
}

absl::string_view PushJournal::OutcomeName(PushResponse::Outcome outcome) {
  switch (outcome) {
    case PushResponse::Outcome::kAccepted:
      return "accepted";
    case PushResponse::Outcome::kDuplicate:
      return "duplicate";
    case PushResponse::Outcome::kDroppedStale:
      return "dropped_stale";
    case PushResponse::Outcome::kDroppedBackup:
      return "dropped_backup";
    case PushResponse::Outcome::kSkippedNonFinite:
      return "skipped_nonfinite";
  }
  return "unknown";
}

void PushJournal::Acknowledged(int worker, int64_t step, uint64_t request_id, const PushResponse& response) {
  Write(absl::StrCat("P ", worker, " ", step, " ", request_id, " ", OutcomeName(response.outcome), " ",
                     response.global_step, "\n"));
}

void PushJournal::Write(const std::string& line) {
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return;
  status_ = file_->Append(line);
  if (!status_.ok()) {
    LOG(ERROR) << "push journal " << path_ << ": " << status_.message() << "; it stops here (training goes on)";
  }
}

absl::Status PushJournal::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace dtrain::ps
