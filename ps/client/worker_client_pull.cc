#include "ps/client/worker_client.h"

#include <algorithm>
#include <limits>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

#include "ps/client/worker_client_internal.h"

namespace dtrain::ps {

// ---- pull -------------------------------------------------------------------------------------------------------

absl::Status WorkerClient::SetSparsePull(std::vector<SparsePullRequest> requests, bool read_only) {
  std::vector<SparsePull> next;
  std::vector<char> named(config_.tables.size(), 0);
  for (const SparsePullRequest& r : requests) {
    if (r.table >= config_.tables.size()) {
      return absl::InvalidArgumentError(absl::StrCat("SetSparsePull: no sparse table ", r.table, " (the config has ",
                                                     config_.tables.size(), ")"));
    }
    if (named[r.table]++) return absl::InvalidArgumentError(absl::StrCat("SetSparsePull: table ", r.table, " twice"));
    if (r.n < 0 || (r.n > 0 && (r.ids == nullptr || r.rows == nullptr))) {
      return absl::InvalidArgumentError(absl::StrCat("SetSparsePull: ", r.n, " rows without ids or room"));
    }
    SparsePull sp;
    sp.table = r.table;
    sp.dim = config_.tables[r.table].dim;
    sp.rows = r.rows;
    sp.ids.resize(num_tasks());
    sp.position.resize(num_tasks());
    for (int64_t i = 0; i < r.n; ++i) {
      const int t = ShardOfId(r.ids[i], num_tasks());
      sp.ids[t].push_back(r.ids[i]);
      sp.position[t].push_back(i);
    }
    if (num_tasks() > 1) {
      sp.scratch.resize(num_tasks());
      for (int t = 0; t < num_tasks(); ++t) sp.scratch[t].resize(sp.ids[t].size() * sp.dim);
    }
    next.push_back(std::move(sp));
  }
  next_sparse_ = std::move(next);
  next_sparse_read_only_ = read_only;
  return absl::OkStatus();
}

std::vector<SparseIds> WorkerClient::SparseRequest(int task) const {
  std::vector<SparseIds> out;
  for (const SparsePull& sp : sparse_) {
    if (!sp.ids[task].empty()) out.push_back(SparseIds{sp.table, sp.ids[task]});
  }
  return out;
}

void WorkerClient::SparseArrived(int index) {
  absl::MutexLock lock(&mu_);
  --sparse_pending_[index];
  cv_.SignalAll();
}

absl::Status WorkerClient::WaitForSparse(uint32_t table) {
  const int index = table < sparse_index_.size() ? sparse_index_[table] : -1;
  if (index < 0) return absl::OkStatus();
  struct Args {
    WorkerClient* client;
    int index;
    static bool Ready(Args* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->client->mu_) {
      return !a->client->pull_status_.ok() || !a->client->push_status_.ok() ||
             a->client->sparse_pending_[a->index] == 0;
    }
  } args{this, index};
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(AwaitWithDeadline(absl::Condition(&Args::Ready, &args), "waiting for sparse rows"));
  if (!pull_status_.ok()) return Explain(pull_status_);
  return Explain(push_status_);
}

void WorkerClient::StartPull(int64_t min_step, int64_t since_step, float* params, bool moving_averages) {
  // The sparse rows SetSparsePull asked for (no lane job of an earlier pull runs any more: FinishPull waited).
  sparse_ = std::move(next_sparse_);
  next_sparse_.clear();
  sparse_read_only_ = std::exchange(next_sparse_read_only_, false);
  sparse_index_.assign(config_.tables.size(), -1);
  for (size_t i = 0; i < sparse_.size(); ++i) sparse_index_[sparse_[i].table] = static_cast<int>(i);
  {
    absl::MutexLock lock(&mu_);
    pull_active_ = true;
    have_header_ = false;
    tentative_pull_ = false;
    header_ = PullHeader{};
    arrived_.assign(slices_.size(), 0);
    pulls_pending_ = num_tasks();
    pull_status_ = absl::OkStatus();
    sparse_pending_.assign(sparse_.size(), 0);
    for (size_t i = 0; i < sparse_.size(); ++i) {
      for (const std::vector<int64_t>& ids : sparse_[i].ids) sparse_pending_[i] += ids.empty() ? 0 : 1;
    }
  }
  pull_params_ = params;
  pull_moving_averages_ = moving_averages;
  pull_min_step_ = min_step;
  pull_since_step_ = since_step;
  for (auto& r : receivers_) r->Reset();
  PullRequest request;
  request.worker_id = worker_id_;
  request.min_step = min_step;
  request.since_step = since_step;
  request.timeout_ms = absl::ToInt64Milliseconds(options_.step_timeout);
  request.moving_averages = moving_averages;
  request.wire_dtype = options_.wire_dtype;
  request.sparse = SparseRequest(0);
  request.sparse_read_only = sparse_read_only_;
  request.elastic_read_ahead = elastic_read_ahead_.load(std::memory_order_relaxed);
  request.cancel = &inflight_;
  // ps 0 holds the pull until our push (if one is in flight) has been handled: it may still be on its way.
  {
    absl::MutexLock lock(&mu_);
    if (push_active_) request.after_push = push_request_id_;
    request.beside_push = push_active_ && apply_early_.load();
  }
  if (commit_started_) {
    // The commit is sent, its outcome not read: the pull goes right behind it on this thread, and the outcome,
    // there by then, is read once the pull's first try has ended (before any retry: a retried pull would wait
    // for a push whose retry had not been sent).
    pull_lanes_[0]->RunInline([this, request = std::move(request)]() mutable {
      RunTaskPull(0, std::move(request), /*complete_commit=*/true);
    });
    return;
  }
  RunOn(pull_lanes_[0].get(), 0, [this, request = std::move(request)]() mutable { RunTaskPull(0, std::move(request)); });
}

absl::StatusOr<bool> WorkerClient::StartPullBesidePush(int64_t min_step, int64_t since_step, float* params) {
  // Only on a lane of its own (a task reached inline would run the pull on this thread, and wait there), and
  // only where it can stream: ps 0 grants the early apply to one worker of a sync run with one ps task.
  if (!sync_ || num_tasks() != 1 || !options_.background || tasks_[0]->PrefersInlineCalls() ||
      !apply_early_.load() || !next_sparse_.empty() || push_finishing_) {
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    // The pull before streamed behind its push: ps 0 grants this worker the early apply (the pull stays a
    // plain one, waiting for the commit, on a step where it does not after all).
    if (!push_active_ || !have_header_ || !tentative_pull_ || !pull_status_.ok()) return false;
  }
  RETURN_IF_ERROR(FinishPull().status());
  if (!pulled_beside_push_) {
    pulled_beside_push_ = true;
    LOG(INFO) << "worker " << worker_id_ << ": ps task 0 applies the pushes as they arrive; each pull now goes out "
              << "beside its push, at the step's first gradients";
  }
  pull_writes_held_.store(true);
  StartPull(min_step, since_step, params);
  return true;
}

absl::Status WorkerClient::AwaitPullWritable() {
  if (!pull_writes_held_.load()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return AwaitWithDeadline(
      absl::Condition(
          +[](WorkerClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
            return !c->pull_writes_held_.load() || c->inflight_.cancelled();
          },
          this),
      "holding the pulled values until backward is over");
}

void WorkerClient::ReleasePullWrites() {
  if (!pull_writes_held_.load()) return;
  absl::MutexLock lock(&mu_);
  pull_writes_held_.store(false);
  cv_.SignalAll();
}

void WorkerClient::OnPullHeader(const PullHeader& header) {
  {
    absl::MutexLock lock(&mu_);
    header_ = header;
    have_header_ = true;
    tentative_pull_ = header.tentative;
    cv_.SignalAll();
  }
  // The other tasks apply the decisions relayed from task 0, then answer at (at least) the same step. In async
  // mode they apply pushes on arrival and keep no step of their own to wait for.
  for (int t = 1; t < num_tasks(); ++t) {
    PullRequest request;
    request.worker_id = worker_id_;
    request.min_step = sync_ ? header.step : 0;
    request.since_step = pull_since_step_;
    request.decisions = header.decisions;
    request.timeout_ms = absl::ToInt64Milliseconds(options_.step_timeout);
    request.moving_averages = pull_moving_averages_;
    request.wire_dtype = options_.wire_dtype;
    request.sparse = SparseRequest(t);
    request.sparse_read_only = sparse_read_only_;
    request.cancel = &inflight_;
    RunOn(pull_lanes_[t].get(), t, [this, t, request = std::move(request)]() mutable { RunTaskPull(t, std::move(request)); });
  }
}

void WorkerClient::RunTaskPull(int task, PullRequest request, bool complete_commit) {
  Receiver* receiver = receivers_[task].get();
  TraceSpan span(options_.trace, tracing() ? absl::StrCat("pull ps ", task) : std::string(), "transport");
  request.session = session(task);
  absl::Status s = WithRetries("pull", task, [&](bool retry) -> absl::Status {
    if (retry) receiver->Restart();
    absl::Status pulled = tasks_[task]->Pull(request, receiver);
    if (complete_commit) {
      complete_commit = false;
      CompleteStartedCommit();
    }
    RETURN_IF_ERROR(pulled);
    if (!receiver->complete()) {
      return absl::DataLossError(absl::StrCat("ps task ", task, " ended the pull before sending every slice"));
    }
    return absl::OkStatus();
  });
  TaskPullDone(task, s);
}

void WorkerClient::SliceArrived(int slice) {
  absl::MutexLock lock(&mu_);
  if (tentative_pull_) return;  // TaskPullDone, once the pull ended OK
  arrived_[slice] = 1;
  cv_.SignalAll();
}

void WorkerClient::TaskPullDone(int task, absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (!status.ok() && pull_status_.ok()) pull_status_ = status;
  if (status.ok() && tentative_pull_) {
    for (int s : task_slices_[task]) arrived_[s] = 1;
  }
  // Task 0 failing before its header means the others will never start.
  if (task == 0 && !have_header_) pulls_pending_ = 1;
  --pulls_pending_;
  cv_.SignalAll();
}

absl::StatusOr<PullResult> WorkerClient::WaitPullHeader() {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(AwaitWithDeadline(
      absl::Condition(
          +[](WorkerClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
            return c->have_header_ || !c->pull_status_.ok() || c->pulls_pending_ == 0 || !c->push_status_.ok();
          },
          this),
      "waiting for ps task 0 to answer the pull"));
  if (!have_header_ && !push_status_.ok()) return Explain(push_status_);  // the pull waits for a push that failed
  if (!have_header_) {
    return pull_status_.ok() ? absl::InternalError("pull ended without a header") : Explain(pull_status_);
  }
  return PullResult{header_.step, header_.training_done, header_.elastic, header_.ps_set};
}

absl::Status WorkerClient::WaitForRange(int64_t begin, int64_t end) {
  const std::vector<int> needed = SlicesIn(begin, end);
  struct Args {
    WorkerClient* client;
    const std::vector<int>* needed;
    static bool Ready(Args* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->client->mu_) {
      if (!a->client->pull_status_.ok() || !a->client->push_status_.ok()) return true;
      for (int s : *a->needed) {
        if (!a->client->arrived_[s]) return false;
      }
      return true;
    }
  } args{this, &needed};
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(AwaitWithDeadline(absl::Condition(&Args::Ready, &args), "waiting for parameters"));
  if (!pull_status_.ok()) return Explain(pull_status_);
  return Explain(push_status_);
}

absl::StatusOr<PullResult> WorkerClient::FinishPull() {
  absl::MutexLock lock(&mu_);
  if (pull_active_) {
    RETURN_IF_ERROR(AwaitWithDeadline(
        absl::Condition(
            +[](WorkerClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) { return c->pulls_pending_ == 0; }, this),
        "waiting for the pull to complete"));
    pull_active_ = false;
  }
  if (!pull_status_.ok()) return Explain(pull_status_);
  return PullResult{header_.step, header_.training_done, header_.elastic, header_.ps_set};
}

absl::StatusOr<PullResult> WorkerClient::Pull(int64_t min_step, int64_t since_step, float* params,
                                              bool moving_averages) {
  StartPull(min_step, since_step, params, moving_averages);
  return FinishPull();
}

absl::StatusOr<PullResult> WorkerClient::Pull(int64_t min_step, int64_t since_step, float* params,
                                              std::vector<SparsePullRequest> sparse, bool read_only) {
  RETURN_IF_ERROR(SetSparsePull(std::move(sparse), read_only));
  StartPull(min_step, since_step, params);
  return FinishPull();
}

}  // namespace dtrain::ps
