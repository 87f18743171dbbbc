#include "ps/checkpoint/applied_journal.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps {

absl::StatusOr<std::unique_ptr<AppliedJournal>> AppliedJournal::Open(Env* env, const std::string& dir, int task,
                                                                     int num_ps) {
  RETURN_IF_ERROR(env->CreateDirs(dir));
  return std::unique_ptr<AppliedJournal>(new AppliedJournal(env, dir, task, num_ps));
}

absl::Status AppliedJournal::CreateLocked() {
  const int64_t start_us = absl::ToUnixMicros(absl::Now());
  const std::string path = absl::StrFormat("%s%sapplied.ps%d-of-%d.%020d-%d.journal", dir_,
                                           dir_.empty() || dir_.back() == '/' ? "" : "/", task_, num_ps_, start_us,
                                           static_cast<int>(getpid()));
  ASSIGN_OR_RETURN(file_, env_->NewWritableFile(path));
  path_ = path;
  return file_->Append(absl::StrCat("# dtrain applied journal v1 task=", task_, " num_ps=", num_ps_, " pid=",
                                    getpid(), " start_us=", start_us, "\n"));
}

bool AppliedJournal::ParseFileName(absl::string_view name, int* task, int* num_ps) {
  if (!absl::ConsumePrefix(&name, "applied.ps") || !absl::ConsumeSuffix(&name, ".journal")) return false;
  const size_t of = name.find("-of-");
  const size_t dot = name.find('.');
  if (of == absl::string_view::npos || dot == absl::string_view::npos || dot < of) return false;
  const size_t dash = name.find('-', dot);
  if (dash == absl::string_view::npos) return false;
  int64_t start = 0, pid = 0;
  return absl::SimpleAtoi(name.substr(0, of), task) && absl::SimpleAtoi(name.substr(of + 4, dot - of - 4), num_ps) &&
         absl::SimpleAtoi(name.substr(dot + 1, dash - dot - 1), &start) &&
         absl::SimpleAtoi(name.substr(dash + 1), &pid) && *task >= 0 && *num_ps > *task;
}

void AppliedJournal::Write(const std::string& line) {
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return;
  if (file_ == nullptr) status_ = CreateLocked();
  if (status_.ok()) status_ = file_->Append(line);
  if (!status_.ok()) {
    LOG(ERROR) << "applied journal " << (path_.empty() ? dir_ : path_) << ": " << status_.message()
               << "; it stops here (training goes on, but a checker will find it incomplete)";
  }
}

void AppliedJournal::Accepted(int worker, int64_t step, uint64_t request_id) {
  Write(absl::StrCat("K ", worker, " ", step, " ", request_id, "\n"));
}
void AppliedJournal::Applied(int worker, int64_t step, uint64_t request_id, int64_t at) {
  Write(absl::StrCat("A ", worker, " ", step, " ", request_id, " ", at, "\n"));
}
void AppliedJournal::Voided(int worker, int64_t step, uint64_t request_id) {
  Write(absl::StrCat("V ", worker, " ", step, " ", request_id, "\n"));
}
void AppliedJournal::PartlyApplied(int worker, int64_t step, uint64_t request_id, int slices, int of) {
  Write(absl::StrCat("P ", worker, " ", step, " ", request_id, " ", slices, " ", of, "\n"));
}
void AppliedJournal::DroppedAfterEnd(int worker, int64_t step, uint64_t request_id) {
  Write(absl::StrCat("E ", worker, " ", step, " ", request_id, "\n"));
}
void AppliedJournal::Checkpointed(int64_t label) { Write(absl::StrCat("C ", label, "\n")); }
void AppliedJournal::Restored(int64_t label) { Write(absl::StrCat("R ", label, "\n")); }
void AppliedJournal::Resharded(int64_t label, int from_num_ps) {
  Write(absl::StrCat("X ", label, " ", from_num_ps, "\n"));
}
void AppliedJournal::Initialized() { Write("I\n"); }

absl::Status AppliedJournal::Sync() {
  absl::MutexLock lock(&mu_);
  if (!status_.ok()) return status_;
  return file_ != nullptr ? file_->Sync() : absl::OkStatus();
}

}  // namespace dtrain::ps
