#include "worker/step_runner.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::worker {

absl::StatusOr<ps::PullResult> StepRunner::Start() {
  return client_->Pull(/*min_step=*/0, /*since_step=*/0, towers_->host_params());
}

absl::StatusOr<float> StepRunner::Step(const std::vector<models::HostBatch>& batches, int64_t step) {
  // The previous push reads host_grads() until it is done: wait for it before backward overwrites them.
  RETURN_IF_ERROR(client_->BeginPush(step, towers_->host_grads()));
  models::StepHooks hooks;
  hooks.before_forward = [this](int64_t begin, int64_t end) { return client_->WaitForRange(begin, end); };
  hooks.after_forward = [step](float loss) -> absl::Status {
    if (std::isfinite(loss)) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("loss is ", loss, " at step ", step, ": training diverged (try a smaller --learning_rate)"));
  };
  hooks.gradients_ready = [this](int64_t begin, int64_t end) {
    client_->PushRange(begin, end);
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(float loss, towers_->ComputeGradients(batches, step, &hooks));
  // Every parameter has been read; the pull that brought them is over.
  RETURN_IF_ERROR(client_->FinishPull().status());
  client_->FinishPush();
  client_->StartPull(sync_ ? step + 1 : 0, step, towers_->host_params());
  return loss;
}

absl::StatusOr<ps::PullResult> StepRunner::NextStep() { return client_->WaitPullHeader(); }

absl::StatusOr<ps::PullResult> StepRunner::Settle() {
  ASSIGN_OR_RETURN(ps::PullResult at, client_->FinishPull());
  RETURN_IF_ERROR(client_->WaitPush().status());
  return at;
}

}  // namespace dtrain::worker
