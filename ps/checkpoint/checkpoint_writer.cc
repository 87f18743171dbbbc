#include "ps/checkpoint/checkpoint_writer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/env.h"
#include "glog/logging.h"
#include "ps/checkpoint/checkpoint_dir.h"

namespace dtrain::ps {

CheckpointWriter::CheckpointWriter(const CheckpointOptions& options, int task, int num_ps)
    : options_(options) {
  CHECK(options_.enabled()) << "CheckpointWriter without a checkpoint directory";
  const absl::Status valid = ValidateCheckpointOptions(options_);
  CHECK(valid.ok()) << valid;
  CHECK(task >= 0 && task < num_ps) << "task " << task << " of " << num_ps;
}

absl::Status CheckpointWriter::WriteOnce(const std::string& path, const std::string& bytes) {
  Env* env = options_.env;
  if (!env->IsDirectory(options_.dir)) {
    absl::Status s = env->CreateDirs(options_.dir);
    if (!s.ok()) return s;
  }
  return WriteFileAtomically(env, path, bytes);
}

absl::Status CheckpointWriter::Save(const CheckpointData& data) {
  // A live change of the job's ps tasks (ps/core/ps_set_plan.h) changes the number the task runs among, and its
  // index when a task before it left (the last one takes its place).
  const int task = data.task_index;
  CHECK(task >= 0 && data.num_ps > task) << "task " << task << " of " << data.num_ps;
  const int num_ps = data.num_ps;
  const std::string path = CheckpointPath(options_.dir, data.global_step, task, num_ps);
  // Encoded before taking the lock: a large model's encoding need not wait for another Save's disk writes.
  const std::string bytes = SerializeCheckpoint(data);
  absl::MutexLock lock(&mu_);
  const absl::Time start = absl::Now();
  absl::Duration backoff = options_.initial_backoff;
  absl::Status status;
  int attempt = 1;
  for (;; ++attempt) {
    status = WriteOnce(path, bytes);
    if (status.ok() || absl::IsInvalidArgument(status) || attempt >= options_.max_attempts) break;
    LOG(WARNING) << "ps task " << task << ": saving checkpoint " << path << ": attempt " << attempt << " of "
                 << options_.max_attempts << " failed (" << status << "); trying again in "
                 << absl::FormatDuration(backoff);
    options_.env->SleepFor(backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  if (!status.ok()) {
    ++failed_saves_;
    last_status_ = absl::Status(
        status.code(), absl::StrCat("ps task ", task, ": cannot save checkpoint ", path, " after ", attempt,
                                    " attempt", attempt == 1 ? "" : "s", ": ", status.message()));
    LOG(ERROR) << last_status_.message() << " (older checkpoints in " << options_.dir << " are kept)";
    return last_status_;
  }
  last_status_ = absl::OkStatus();
  LOG(INFO) << "ps task " << task << ": saved checkpoint " << path << " in "
            << absl::FormatDuration(absl::Now() - start)
            << (attempt > 1 ? absl::StrCat(" (attempt ", attempt, ")") : "");
  last_prune_status_ = PruneCheckpoints(options_.env, options_.dir, task, num_ps, options_.keep);
  if (!last_prune_status_.ok()) {
    LOG(WARNING) << "ps task " << task << ": pruning old checkpoints: " << last_prune_status_;
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::last_status() const {
  absl::MutexLock lock(&mu_);
  return last_status_;
}

absl::Status CheckpointWriter::last_prune_status() const {
  absl::MutexLock lock(&mu_);
  return last_prune_status_;
}

int64_t CheckpointWriter::failed_saves() const {
  absl::MutexLock lock(&mu_);
  return failed_saves_;
}

}  // namespace dtrain::ps
