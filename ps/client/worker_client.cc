#include "ps/client/worker_client.h"

#include <algorithm>
#include <random>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/mutex_config.h"

#include "ps/client/worker_client_internal.h"

namespace dtrain::ps {

WorkerClient::WorkerClient(std::vector<PsInterface*> tasks, std::vector<std::vector<SliceSpec>> placement,
                           int worker_id, bool is_chief, WorkerClientOptions options)
    : tasks_(std::move(tasks)),
      placement_(std::move(placement)),
      worker_id_(worker_id),
      is_chief_(is_chief),
      options_(options),
      apply_early_(options.apply_early) {
  DisableMutexDeadlockDetection();  // see common/mutex_config.h
  SetUpTasks();
  // Request ids must not repeat across restarts of this worker: start from a random base.
  std::random_device rd;
  next_request_id_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  cancel_.Register([this] {
    inflight_.Cancel();
    absl::MutexLock lock(&mu_);
    cv_.SignalAll();
    heartbeat_cv_.SignalAll();
  });
}

void WorkerClient::SetUpTasks() {
  CHECK_EQ(tasks_.size(), placement_.size());
  slices_.clear();
  slice_of_key_.clear();
  task_slices_.clear();
  pushes_.clear();
  receivers_.clear();
  sparse_parts_.clear();
  for (int t = 0; t < num_tasks(); ++t) {
    for (const SliceSpec& s : placement_[t]) slices_.push_back(Slice{s, t});
  }
  std::sort(slices_.begin(), slices_.end(),
            [](const Slice& a, const Slice& b) { return a.spec.flat_offset < b.spec.flat_offset; });
  task_slices_.resize(num_tasks());
  for (int i = 0; i < static_cast<int>(slices_.size()); ++i) {
    const uint32_t key = slices_[i].spec.key;
    if (key >= slice_of_key_.size()) slice_of_key_.resize(key + 1, -1);
    slice_of_key_[key] = i;
    task_slices_[slices_[i].task].push_back(i);
  }
  slice_queued_.assign(slices_.size(), 0);
  absl::MutexLock lock(&mu_);
  sessions_.assign(num_tasks(), 0);
  sparse_parts_.resize(num_tasks());
  for (int t = 0; t < num_tasks(); ++t) {
    pushes_.push_back(std::make_unique<TaskPush>());
    receivers_.push_back(std::make_unique<Receiver>(this, t));
    push_lanes_.push_back(std::make_unique<SerialExecutor>(options_.background, absl::StrCat("ps", t, "-push")));
    pull_lanes_.push_back(std::make_unique<SerialExecutor>(options_.background, absl::StrCat("ps", t, "-pull")));
  }
}

WorkerClient::~WorkerClient() {
  cancel_.Cancel();
  if (heartbeat_.joinable()) heartbeat_.join();
  // Lanes finish (quickly: everything blocking is cancelled) and join before the state they use goes away.
  push_lanes_.clear();
  pull_lanes_.clear();
}

// ---- helpers ----------------------------------------------------------------------------------------------------

std::vector<int> WorkerClient::SlicesIn(int64_t begin, int64_t end) const {
  // First slice ending after `begin`, then every slice starting before `end`.
  auto it = std::partition_point(slices_.begin(), slices_.end(), [&](const Slice& s) {
    return s.spec.flat_offset + s.spec.length <= begin;
  });
  std::vector<int> out;
  for (; it != slices_.end() && it->spec.flat_offset < end; ++it) out.push_back(static_cast<int>(it - slices_.begin()));
  return out;
}

absl::Status WorkerClient::AwaitWithDeadline(const absl::Condition& condition, const char* what) {
  absl::Time deadline = absl::Now() + options_.step_timeout + options_.retry_window;
  bool extended = false;
  while (!condition.Eval()) {
    if (cancel_.cancelled()) return absl::CancelledError(absl::StrCat("worker ", worker_id_, ": ", what, " cancelled"));
    if (cv_.WaitWithDeadline(&mu_, deadline) && !condition.Eval()) {
      // Woken long after the deadline: the process was paused (SIGSTOP). The calls it waits for try once more
      // on waking (WithRetries): wait for them once more rather than fail on the clock alone.
      if (!extended && absl::Now() - deadline > absl::Seconds(1)) {
        extended = true;
        deadline = absl::Now() + options_.step_timeout + options_.retry_window;
        continue;
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "worker ", worker_id_, " timed out ", what, " after ",
          absl::FormatDuration(options_.step_timeout + options_.retry_window), " (the step timeout, ",
          absl::FormatDuration(options_.step_timeout), ", and ", absl::FormatDuration(options_.retry_window),
          " of retries)"));
    }
  }
  return absl::OkStatus();
}

void WorkerClient::RunOn(SerialExecutor* lane, int task, std::function<void()> job) {
  if (tracing() && !tasks_[task]->PrefersInlineCalls()) {  // the lane's track on the timeline gets its name
    std::string name = absl::StrCat(lane == push_lanes_[task].get() ? "push" : "pull", " lane ps ", task);
    job = [this, name = std::move(name), job = std::move(job)] {
      options_.trace->NameThread(name);
      job();
    };
  }
  // A task reached without a network (shared memory) answers within microseconds: its calls run in this thread,
  // after whatever its lane still holds, instead of costing two thread hand-offs each.
  if (tasks_[task]->PrefersInlineCalls()) {
    lane->RunInline(std::move(job));
  } else {
    lane->Run(std::move(job));
  }
}

// ---- the rest ---------------------------------------------------------------------------------------------------

absl::Status WorkerClient::Done(Leaving leaving, int64_t global_step, std::string reason, absl::Duration retry) {
  absl::Status status;
  // Task 0 last, so that its "finished" means every task has been told. A task that forgot this worker's session
  // (it restarted, rolled back or declared the worker lost) takes the report without one.
  DoneRequest request;
  request.worker_id = worker_id_;
  request.leaving = leaving;
  request.global_step = global_step;
  request.reason = std::move(reason);
  request.retry_ms = retry > absl::ZeroDuration() ? std::max<int64_t>(1, absl::ToInt64Milliseconds(retry)) : 0;
  for (int t = num_tasks() - 1; t >= 0; --t) {
    request.session = session(t);
    absl::Status s = tasks_[t]->Done(request);
    if (status.ok()) status = s;
  }
  return status;
}

absl::StatusOr<TrainingStats> WorkerClient::Stats(int task) { return tasks_[task]->GetStats(); }

absl::Duration WorkerClient::lease() const {
  absl::MutexLock lock(&mu_);
  return lease_;
}

}  // namespace dtrain::ps
