#include "worker/step_runner.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::worker {

absl::StatusOr<ps::PullResult> StepRunner::Start() {
  ASSIGN_OR_RETURN(ps::PullResult at,
                   client_->Pull(/*min_step=*/0, /*since_step=*/0, towers_->host_params()));
  step_ = at.step;
  return at;
}

absl::Status StepRunner::Step(const std::vector<models::HostBatch>& batches, int64_t step) {
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
  absl::StatusOr<float> loss = towers_->ComputeGradients(batches, step, &hooks);
  // Every parameter has been read; the pull that brought them is over.
  absl::Status pulled = loss.ok() ? client_->FinishPull().status() : loss.status();
  if (!pulled.ok()) {
    // The gradients are not all final (a pull failed, say, because a ps task restarted): the push must not
    // commit, and must complete, or the next WaitPush (Reconnect's) would wait for it until it times out.
    client_->AbandonPush(pulled);
    return pulled;
  }
  client_->FinishPush();
  client_->StartPull(sync_ ? step + 1 : 0, step, towers_->host_params());
  losses_.push_back(*loss);
  return absl::OkStatus();
}

absl::StatusOr<ps::PullResult> StepRunner::NextStep() {
  ASSIGN_OR_RETURN(ps::PullResult at, client_->WaitPullHeader());
  step_ = at.step;
  return at;
}

absl::StatusOr<std::vector<float>> StepRunner::TakeLosses() { return std::exchange(losses_, {}); }

absl::StatusOr<ps::PullResult> StepRunner::Settle() {
  ASSIGN_OR_RETURN(ps::PullResult at, client_->FinishPull());
  RETURN_IF_ERROR(client_->WaitPush().status());
  step_ = at.step;
  return at;
}

absl::StatusOr<ps::PullResult> StepRunner::PullNewest() {
  ASSIGN_OR_RETURN(ps::PullResult at, client_->Pull(0, step_, towers_->host_params()));
  step_ = at.step;
  return at;
}

absl::Status StepRunner::LoadParameters(bool moving_averages) {
  if (moving_averages) {
    RETURN_IF_ERROR(client_->Pull(0, step_, towers_->host_params(), /*moving_averages=*/true).status());
  }
  return towers_->SetParameters(towers_->host_params());
}

absl::StatusOr<std::vector<float>> StepRunner::Parameters() {
  const float* p = towers_->host_params();
  return std::vector<float>(p, p + towers_->num_parameters());
}

}  // namespace dtrain::worker
