#include "worker/train/step_loss_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain::worker {

StepLossLog::StepLossLog(std::string metrics_file, bool keep, Env* env)
    : path_(std::move(metrics_file)), keep_(keep), env_(env) {}

absl::Status StepLossLog::Open() {
  if (path_.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<WritableFile>> f = env_->NewWritableFile(path_ + ".tmp");
  if (!f.ok()) return f.status();
  file_ = std::move(*f);
  return file_->Append("local_step,loss,learning_rate\n");
}

absl::Status StepLossLog::Collect(TrainingResult* result) {
  std::vector<float>& losses = result->losses;
  std::vector<float>& rates = result->learning_rates;
  if (!losses.empty()) result->last_loss = losses.back();
  if (file_ != nullptr && next_ < losses.size()) {
    std::string csv;
    for (size_t i = next_; i < losses.size(); ++i) {
      absl::StrAppendFormat(&csv, "%d,%.9g,", ++written_, losses[i]);
      if (i < rates.size()) absl::StrAppendFormat(&csv, "%.9g", rates[i]);
      csv += '\n';
    }
    absl::Status appended = file_->Append(csv);
    if (!appended.ok()) return appended;
  }
  next_ = losses.size();
  if (!keep_) {
    // The rates of steps whose losses have not come back yet stay, in order.
    rates.erase(rates.begin(), rates.begin() + static_cast<std::ptrdiff_t>(std::min(rates.size(), losses.size())));
    losses.clear();  // its capacity stays: one window's worth is all a long run holds
    next_ = 0;
  }
  return absl::OkStatus();
}

absl::Status StepLossLog::Finish() {
  if (file_ == nullptr) return absl::OkStatus();
  std::unique_ptr<WritableFile> f = std::move(file_);
  absl::Status s = f->Close();
  if (s.ok()) s = env_->RenameFile(path_ + ".tmp", path_);
  return s;
}

}  // namespace dtrain::worker
