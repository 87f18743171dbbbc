#include "worker/ps_group.h"

#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::worker {

PsGroup::PsGroup(std::vector<ps::PsInterface*> tasks, std::vector<std::vector<ps::SliceSpec>> placement,
                 int worker_id, bool is_chief)
    : tasks_(std::move(tasks)),
      placement_(std::move(placement)),
      worker_id_(worker_id),
      is_chief_(is_chief) {
  // Request ids must not repeat across restarts of this worker: start from a random base.
  std::random_device rd;
  next_request_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

std::vector<ps::SliceData> PsGroup::Gather(int task, const float* flat) const {
  std::vector<ps::SliceData> out;
  out.reserve(placement_[task].size());
  for (const ps::SliceSpec& s : placement_[task]) {
    out.push_back(ps::SliceData{s.key, std::vector<float>(flat + s.flat_offset, flat + s.flat_offset + s.length)});
  }
  return out;
}

absl::Status PsGroup::Connect(const ps::TrainConfig& config, const float* initial_params, absl::Duration wait) {
  sync_ = config.mode == "sync";
  const absl::Time give_up = absl::Now() + wait;
  absl::Duration backoff = absl::Milliseconds(100);
  absl::Time next_log = absl::Now();
  // Every task must resume from the same checkpoint: task 0 (registered first) decides, the others restore
  // exactly its step (or start fresh when it did).
  int64_t restore_step = ps::kRestoreNewest;
  for (int t = 0; t < num_tasks(); ++t) {
    ps::RegisterRequest req;
    req.restore_step = restore_step;
    req.worker_id = worker_id_;
    req.is_chief = is_chief_;
    req.config = config;
    req.config.slices = placement_[t];
    while (true) {
      absl::StatusOr<ps::RegisterResponse> r = tasks_[t]->Register(req);
      std::string waiting_for;
      if (r.ok()) {
        if (is_chief_ && t == 0) restore_step = r->initialized ? r->global_step : ps::kRestoreNone;
        if (r->initialized) {
          if (is_chief_ && r->global_step > 0) {
            LOG(INFO) << "ps task " << t << " resumed from a checkpoint at step " << r->global_step;
          }
          break;
        }
        if (is_chief_) {
          ps::InitializeRequest init;
          init.worker_id = worker_id_;
          init.slices = Gather(t, initial_params);
          RETURN_IF_ERROR(tasks_[t]->Initialize(init));
          LOG(INFO) << "initialized ps task " << t << " (" << placement_[t].size() << " slices)";
          break;
        }
        waiting_for = absl::StrCat("the chief to initialize ps task ", t);
      } else if (r.status().code() == absl::StatusCode::kUnavailable ||
                 r.status().code() == absl::StatusCode::kDeadlineExceeded) {
        waiting_for = absl::StrCat("ps task ", t, " (", r.status().message(), ")");
      } else {
        return r.status();
      }
      if (absl::Now() > give_up) {
        return absl::DeadlineExceededError(absl::StrCat("worker ", worker_id_, " gave up waiting for ",
                                                        waiting_for, " after ", absl::FormatDuration(wait)));
      }
      if (absl::Now() >= next_log) {
        LOG(INFO) << "worker " << worker_id_ << " waiting for " << waiting_for;
        next_log = absl::Now() + absl::Seconds(5);
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ps::PushResponse> PsGroup::Push(int64_t step, const float* grads) {
  const uint64_t request_id = next_request_id_++;
  auto push_to = [&](int t, bool commit) -> absl::StatusOr<ps::PushResponse> {
    ps::PushRequest req;
    req.worker_id = worker_id_;
    req.step = step;
    req.request_id = request_id;
    req.commit = commit;
    req.flat_gradients = grads;
    return tasks_[t]->Push(req);
  };
  // Other tasks first (in parallel), then the commit on task 0: a committed push is complete everywhere.
  std::vector<std::future<absl::StatusOr<ps::PushResponse>>> others;
  for (int t = 1; t < num_tasks(); ++t) others.push_back(std::async(std::launch::async, push_to, t, false));
  for (auto& f : others) {
    absl::StatusOr<ps::PushResponse> r = f.get();
    if (!r.ok()) return r.status();
  }
  return push_to(0, true);
}

absl::StatusOr<PullResult> PsGroup::Pull(int64_t min_step, int64_t since_step, float* params,
                                         absl::Duration timeout, bool moving_averages) {
  ps::PullRequest req;
  req.moving_averages = moving_averages;
  req.worker_id = worker_id_;
  req.min_step = min_step;
  req.since_step = since_step;
  req.timeout_ms = absl::ToInt64Milliseconds(timeout);
  req.flat_out = params;
  ASSIGN_OR_RETURN(ps::PullResponse r0, tasks_[0]->Pull(req));
  PullResult result{r0.step, r0.training_done};
  if (num_tasks() == 1) return result;

  // The other tasks apply the decisions relayed from task 0, then answer at (at least) the same step.
  ps::PullRequest others = req;
  // In async mode the other tasks apply pushes on arrival and keep no step of their own to wait for.
  others.min_step = sync_ ? r0.step : 0;
  others.decisions = std::move(r0.decisions);
  std::vector<std::future<absl::Status>> futures;
  for (int t = 1; t < num_tasks(); ++t) {
    futures.push_back(std::async(std::launch::async, [&, t]() -> absl::Status {
      return tasks_[t]->Pull(others).status();
    }));
  }
  absl::Status status;
  for (auto& f : futures) {
    absl::Status s = f.get();
    if (status.ok()) status = s;
  }
  if (!status.ok()) return status;
  return result;
}

absl::Status PsGroup::Done() {
  absl::Status status;
  // Task 0 last, so that its "finished" means every task has been told.
  for (int t = num_tasks() - 1; t >= 0; --t) {
    absl::Status s = tasks_[t]->Done(worker_id_);
    if (status.ok()) status = s;
  }
  return status;
}

absl::StatusOr<ps::TrainingStats> PsGroup::Stats(int task) { return tasks_[task]->GetStats(); }

}  // namespace dtrain::worker
