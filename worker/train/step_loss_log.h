// The loss of every local step and the learning rate its update was applied with, as the trainer collects them
// (a progress line's window at a time): kept in TrainingResult::losses / learning_rates when the caller wants the
// whole run there, and streamed to --metrics_file as CSV "local_step,loss,learning_rate" (exact floats). The file
// grows as PATH.tmp while the run goes and becomes PATH when it ends (Finish), so a reader never sees half a
// file under PATH; what is held in memory without `keep` is one window, however long the run (a streaming job's
// chief that kept every step grew by ~2 MiB an hour).
//
// Errors: Open and Collect name the file and the operation (common/env.h's codes). A log that was never
// finished leaves PATH.tmp with the steps so far.
// Thread-safety: none; the thread that trains uses it.
#ifndef DTRAIN_WORKER_TRAIN_STEP_LOSS_LOG_H_
#define DTRAIN_WORKER_TRAIN_STEP_LOSS_LOG_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/env.h"
#include "worker/train/trainer.h"

namespace dtrain::worker {

class StepLossLog {
 public:
  // `metrics_file` empty: no file. `keep`: the result holds every step's loss and rate; otherwise Collect drops
  // them once written (the result's last_loss still says the newest).
  StepLossLog(std::string metrics_file, bool keep, Env* env = Env::Default());
  StepLossLog(const StepLossLog&) = delete;
  StepLossLog& operator=(const StepLossLog&) = delete;

  // Creates PATH.tmp with the CSV header (nothing without a file).
  absl::Status Open();
  // The losses in `*result` that are new since the last call (the trainer appends them, and the rate of each
  // step's update, to result->losses and result->learning_rates) go to the file; without `keep` they (and their
  // rates) leave the result. Sets result->last_loss.
  absl::Status Collect(TrainingResult* result);
  // Flushes, closes and renames PATH.tmp to PATH. Once.
  absl::Status Finish();

  int64_t steps_written() const { return written_; }

 private:
  const std::string path_;
  const bool keep_;
  Env* const env_;
  std::unique_ptr<WritableFile> file_;
  size_t next_ = 0;       // the first loss in result->losses not yet written
  int64_t written_ = 0;   // lines written (the local step of the next is written_ + 1)
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_STEP_LOSS_LOG_H_
