#include "ps/client/worker_client.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <random>
#include <string_view>
#include <iterator>
#include <thread>
#include <utility>

#include <glog/logging.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/mutex_config.h"
#include "common/status_macros.h"

namespace dtrain::ps {

// One task's part of the push in flight. Owned by the task's push lane while the push runs.
struct WorkerClient::TaskPush {
  std::unique_ptr<SliceUpload> upload;
  std::vector<int> sent;  // slices written to this upload (a retried upload writes them again)
  std::vector<SparsePart*> sparse_sent;  // sparse parts written to it (likewise)
  absl::Status status;
};

// Writes one task's pulled slices into the flat parameter buffer; used by the task's pull lane only.
class WorkerClient::Receiver : public PullReceiver {
 public:
  Receiver(WorkerClient* client, int task)
      : client_(client), task_(task), received_(client->slices_.size(), 0), done_(client->slices_.size(), 0) {}

  // Before a new pull (after the client set its sparse_): nothing has arrived.
  void Reset() {
    std::fill(received_.begin(), received_.end(), 0);
    std::fill(done_.begin(), done_.end(), 0);
    header_seen_ = false;
    tentative_ = false;
    const size_t tables = client_->sparse_.size();
    rows_received_.assign(tables, 0);
    rows_done_.assign(tables, 0);
    for (size_t i = 0; i < tables; ++i) rows_done_[i] = client_->sparse_[i].ids[task_].empty();
  }
  // Before a retried attempt: slices and tables that arrived whole stay; partial ones start again.
  // After a tentative attempt nothing stays: its values were taken back.
  void Restart() {
    for (size_t s = 0; s < received_.size(); ++s) {
      if (tentative_) done_[s] = 0;
      if (!done_[s]) received_[s] = 0;
    }
    for (size_t i = 0; i < rows_received_.size(); ++i) {
      if (tentative_) rows_done_[i] = client_->sparse_[i].ids[task_].empty();
      if (!rows_done_[i]) rows_received_[i] = 0;
    }
    tentative_ = false;
  }
  bool complete() const {
    for (int s : client_->task_slices_[task_]) {
      if (!done_[s]) return false;
    }
    for (char d : rows_done_) {
      if (!d) return false;
    }
    return true;
  }

  absl::StatusOr<Buffer> SparseDestination(uint32_t table, int64_t first, int64_t n, int dim) override {
    const int i = table < client_->sparse_index_.size() ? client_->sparse_index_[table] : -1;
    if (i < 0) return absl::DataLossError(absl::StrCat("ps task ", task_, " sent rows of table ", table, " unasked"));
    SparsePull& sp = client_->sparse_[i];
    if (dim != sp.dim) {
      return absl::DataLossError(absl::StrCat("ps task ", task_, " sent rows of ", dim, " values for table ", table,
                                              " of dim ", sp.dim));
    }
    if (rows_done_[i]) return Buffer{};  // arrived whole in an earlier attempt
    RETURN_IF_ERROR(client_->AwaitPullWritable());
    if (first == 0) rows_received_[i] = 0;
    const int64_t want = static_cast<int64_t>(sp.ids[task_].size());
    if (first != rows_received_[i] || n < 0 || n > want - first) {
      return absl::DataLossError(absl::StrCat("ps task ", task_, " sent rows [", first, ", ", first + n,
                                              ") of table ", table, " after ", rows_received_[i], " of ", want));
    }
    float* dst = client_->num_tasks() == 1 ? sp.rows + first * dim : sp.scratch[task_].data() + first * dim;
    return Buffer{dst, WireDtype::kF32};
  }

  absl::Status SparseWritten(uint32_t table, int64_t first, int64_t n) override {
    const int i = client_->sparse_index_[table];
    if (rows_done_[i]) return absl::OkStatus();
    SparsePull& sp = client_->sparse_[i];
    if (client_->num_tasks() > 1) {  // back to the caller's order
      const int dim = sp.dim;
      const float* src = sp.scratch[task_].data();
      const int64_t* position = sp.position[task_].data();
      for (int64_t k = first; k < first + n; ++k) {
        std::copy_n(src + k * dim, dim, sp.rows + position[k] * dim);
      }
    }
    rows_received_[i] += n;
    if (rows_received_[i] == static_cast<int64_t>(sp.ids[task_].size())) {
      rows_done_[i] = 1;
      client_->SparseArrived(i);
    }
    return absl::OkStatus();
  }

  absl::Status OnHeader(const PullHeader& header) override {
    if (task_ == 0 && !header_seen_) client_->OnPullHeader(header);
    header_seen_ = true;
    tentative_ = header.tentative;
    return absl::OkStatus();
  }

  absl::StatusOr<Buffer> Destination(uint32_t key, int64_t offset, int64_t n) override {
    const int s = key < client_->slice_of_key_.size() ? client_->slice_of_key_[key] : -1;
    if (s < 0 || client_->slices_[s].task != task_) {
      return absl::DataLossError(absl::StrCat("ps task ", task_, " sent slice key ", key, ", which it does not hold"));
    }
    const SliceSpec& spec = client_->slices_[s].spec;
    if (done_[s]) return Buffer{};  // arrived whole in an earlier attempt
    RETURN_IF_ERROR(client_->AwaitPullWritable());
    if (offset == 0) received_[s] = 0;
    if (offset == 0 && client_->tracing()) began_ns_[s] = TraceRecorder::NowNs();
    if (offset != received_[s] || n < 0 || offset + n > spec.length) {
      return absl::DataLossError(absl::StrCat("ps task ", task_, " sent floats [", offset, ", ", offset + n,
                                              ") of '", spec.variable, "' after ", received_[s], " of ",
                                              spec.length));
    }
    return Buffer{client_->pull_params_ + spec.flat_offset + offset, WireDtype::kF32};
  }

  absl::Status Written(uint32_t key, int64_t offset, int64_t n) override {
    const int s = client_->slice_of_key_[key];
    if (done_[s]) return absl::OkStatus();
    received_[s] += n;
    if (received_[s] == client_->slices_[s].spec.length) {
      done_[s] = 1;
      if (client_->tracing() && began_ns_[s] != 0) {
        TraceRecorder* trace = client_->options_.trace;
        trace->Complete(absl::StrCat("receive ", client_->slices_[s].spec.variable), "transport", began_ns_[s],
                        TraceRecorder::NowNs(), trace->step(), absl::StrCat("ps ", task_));
        began_ns_[s] = 0;
      }
      client_->SliceArrived(s);
    }
    return absl::OkStatus();
  }

 private:
  WorkerClient* client_;
  const int task_;
  std::vector<int64_t> received_;  // floats per slice (global index)
  std::vector<int64_t> began_ns_ = std::vector<int64_t>(client_->slices_.size(), 0);  // tracing: its first floats
  std::vector<char> done_;
  std::vector<int64_t> rows_received_;  // per table of the pull (index in client_->sparse_)
  std::vector<char> rows_done_;
  bool header_seen_ = false;
  bool tentative_ = false;  // this attempt's header said so
};

namespace {

// Uploads are retried when the task is unreachable or too slow to answer; pulls only when it is unreachable
// (a pull that timed out waiting for its step has waited long enough).
bool Retryable(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kDeadlineExceeded;
}
bool RetryablePull(const absl::Status& s) { return s.code() == absl::StatusCode::kUnavailable; }

// "until 12:04:31 (at most 5m, 4m54s left)": the deadline of a wait, for its log lines.
// The pause before the next try: `backoff`, cut so that the last try starts just past the deadline (the limit a
// wait states is the limit it keeps, not a second more).
absl::Duration PauseBefore(absl::Time give_up, absl::Duration backoff) {
  return std::min(backoff, std::max(give_up - absl::Now() + absl::Milliseconds(1), absl::ZeroDuration()));
}

std::string Until(absl::Time give_up, absl::Duration wait) {
  const absl::Duration left = std::max(absl::ZeroDuration(), give_up - absl::Now());
  return absl::StrCat("until ", absl::FormatTime("%H:%M:%S", give_up, absl::LocalTimeZone()), " (at most ",
                      absl::FormatDuration(wait), ", ", absl::FormatDuration(absl::Trunc(left, absl::Seconds(1))),
                      " left)");
}

// g + residual rounded to `dtype` into `out`; the rounding error becomes the new residual.
void EncodeWithErrorFeedback(WireDtype dtype, const float* g, float* residual, int64_t n, char* out) {
  constexpr int64_t kBlock = 4096;
  float sum[kBlock], back[kBlock];
  const int bytes = DtypeBytes(dtype);
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; ++i) sum[i] = g[b + i] + residual[b + i];
    EncodeFloats(dtype, sum, m, out + b * bytes);
    DecodeFloats(dtype, out + b * bytes, m, back);
    for (int64_t i = 0; i < m; ++i) residual[b + i] = sum[i] - back[i];
  }
}

}  // namespace

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

// ---- connecting -----------------------------------------------------------------------------------------------

absl::Status WorkerClient::Connect(const TrainConfig& config, const float* initial_params, absl::Duration wait,
                                   std::vector<InitialRows> initial_rows) {
  config_ = config;
  sync_ = config.mode == "sync";
  if (initial_params != nullptr && is_chief_) {
    if (options_.keep_initial_values) {
      const int64_t n = slices_.empty() ? 0 : slices_.back().spec.flat_offset + slices_.back().spec.length;
      initial_.assign(initial_params, initial_params + n);
      initial_values_ = initial_.data();
    } else {
      initial_values_ = initial_params;  // valid for this call only
    }
  }
  if (!initial_rows.empty() && is_chief_) initial_rows_ = std::move(initial_rows);
  absl::Status connected = ConnectTasks(wait);
  if (!options_.keep_initial_values) {
    initial_values_ = nullptr;
    initial_rows_.clear();
  }
  return connected;
}

absl::Status WorkerClient::ConnectTasks(absl::Duration wait) {
  const absl::Time give_up = absl::Now() + wait;
  if (is_chief_) RETURN_IF_ERROR(PrepareTasks(give_up, wait));
  const absl::Duration backoff = absl::Milliseconds(100);
  absl::Time next_log = absl::Now();
  int64_t lease_ms = 0;
  for (int t = 0; t < num_tasks(); ++t) {
    RegisterRequest req;
    req.worker_id = worker_id_;
    req.is_chief = is_chief_;
    req.config = TaskConfig(t);
    // Timelines: the clock offset comes from the registration's round trip, whose first call on a new channel
    // would also carry the connection's set-up (one way only: milliseconds of error). A call whose answer does
    // not matter opens the connection first; of several registrations the shortest round trip is kept.
    int64_t best_rtt_ns = std::numeric_limits<int64_t>::max();
    if (options_.trace != nullptr) tasks_[t]->GetStats().IgnoreError();
    while (true) {
      if (cancel_.cancelled()) return absl::CancelledError("connecting: cancelled");
      // Given up only after a try that started past the deadline (a process paused meanwhile tries once more).
      const absl::Time tried = absl::Now();
      const int64_t sent_ns = TraceRecorder::NowNs();
      absl::StatusOr<RegisterResponse> r = tasks_[t]->Register(req);
      const int64_t answered_ns = TraceRecorder::NowNs();
      if (r.ok() && r->clock_ns != 0 && options_.trace != nullptr && answered_ns - sent_ns < best_rtt_ns) {
        // The task's clock when it answered, against the middle of the round trip (NTP's estimate: exact when
        // the request and the answer took equally long).
        best_rtt_ns = answered_ns - sent_ns;
        options_.trace->SetClockOffset(t, r->clock_ns - (sent_ns + answered_ns) / 2, best_rtt_ns);
      }
      std::string waiting_for;
      absl::Status failed;
      if (r.ok()) {
        {
          absl::MutexLock lock(&mu_);
          sessions_[t] = r->session;
          if (t == 0) {
            restored_position_ = r->input_position;
            join_step_ = r->join_step;
          }
        }
        lease_ms = std::max(lease_ms, r->lease_ms);
        if (r->initialized) {
          if (is_chief_ && t == 0 && r->global_step > 0) {
            LOG(INFO) << "ps task 0 is at step " << r->global_step << " (restored from a checkpoint or running)";
          }
          break;
        }
        if (is_chief_) {
          if (initial_values_ == nullptr && !slices_.empty()) {
            return absl::FailedPreconditionError(absl::StrCat("ps task ", t, " holds no values and the chief has no "
                                                              "initial values to give it"));
          }
          absl::StatusOr<std::unique_ptr<SliceUpload>> init = tasks_[t]->StartInitialize(worker_id_);
          if (init.ok()) {
            std::vector<std::vector<int64_t>> row_ids;
            std::vector<std::vector<float>> rows;
            absl::Status s = WriteSlices(init->get(), initial_values_, placement_[t]);
            if (s.ok()) s = WriteInitialRows(init->get(), t, &row_ids, &rows);
            if (s.ok()) s = (*init)->Finish().status();
            failed = s;
          } else {
            failed = init.status();
          }
          if (failed.ok()) {
            LOG(INFO) << "initialized ps task " << t << " (" << placement_[t].size() << " slices)";
            break;
          }
          if (!Retryable(failed)) return failed;
          waiting_for = absl::StrCat("ps task ", t, " to take the initial values (", failed.message(), ")");
        } else {
          waiting_for = absl::StrCat("the chief to initialize ps task ", t);
        }
      } else if (Retryable(r.status())) {
        waiting_for = absl::StrCat("ps task ", t, " (", r.status().message(), ")");
      } else {
        return r.status();
      }
      if (tried > give_up) {
        return absl::DeadlineExceededError(absl::StrCat("worker ", worker_id_, " gave up waiting for ", waiting_for,
                                                        " after ", absl::FormatDuration(wait)));
      }
      if (absl::Now() >= next_log) {
        LOG(INFO) << "worker " << worker_id_ << " waiting for " << waiting_for << " " << Until(give_up, wait);
        next_log = absl::Now() + absl::Seconds(5);
      }
      // Every 100 ms, not backing off further: a worker mostly waits here for the chief to initialize the tasks,
      // and each doubling let it start up to that long after the chief (a try costs the ps a fraction of a
      // millisecond; a task not up yet is waited for by the channel's own reconnect backoff).
      absl::SleepFor(PauseBefore(give_up, backoff));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    lease_ = absl::Milliseconds(lease_ms);
  }
  if (options_.background && lease_ms > 0 && !heartbeat_.joinable()) {
    const absl::Duration every = std::clamp(absl::Milliseconds(lease_ms) / 4, absl::Milliseconds(20), absl::Seconds(2));
    heartbeat_ = std::thread([this, every] { HeartbeatLoop(every); });
  }
  return absl::OkStatus();
}

absl::Status WorkerClient::WriteInitialRows(SliceUpload* upload, int task, std::vector<std::vector<int64_t>>* ids,
                                            std::vector<std::vector<float>>* rows) const {
  for (const SparseTableSpec& spec : config_.tables) {
    if (!spec.initial_values) continue;
    const InitialRows* given = nullptr;
    for (const InitialRows& r : initial_rows_) {
      if (r.table == spec.table) given = &r;
    }
    const size_t want = static_cast<size_t>(spec.rows) * spec.dim;
    if (given == nullptr || given->values == nullptr || given->values->size() != want) {
      return absl::FailedPreconditionError(absl::StrCat("sparse table '", spec.name, "' starts from initial values, "
                                                        "but the chief has no ", spec.rows, " x ", spec.dim,
                                                        " rows to give ps task ", task));
    }
    // The rows of the ids this task owns, in id order.
    std::vector<int64_t>& i = ids->emplace_back();
    std::vector<float>& r = rows->emplace_back();
    const float* values = given->values->data();
    for (int64_t id = 0; id < spec.rows; ++id) {
      if (ShardOfId(id, num_tasks()) != task) continue;
      i.push_back(id);
      r.insert(r.end(), values + id * spec.dim, values + (id + 1) * spec.dim);
    }
    RETURN_IF_ERROR(upload->WriteSparse(spec.table, i.data(), static_cast<int64_t>(i.size()), spec.dim,
                                        WireDtype::kF32, r.data()));
  }
  return absl::OkStatus();
}

TrainConfig WorkerClient::TaskConfig(int task) const {
  TrainConfig c = config_;
  c.slices = placement_[task];
  return c;
}

absl::Status WorkerClient::PrepareTasks(absl::Time give_up, absl::Duration wait) {
  int64_t move_step;
  {
    absl::MutexLock lock(&mu_);
    move_step = move_step_;
  }
  if (move_step >= 0) return MoveTasks(move_step, give_up, wait);
  // What every task holds and could restore (waiting for tasks that are not up yet).
  std::vector<CheckpointProbe> probes(num_tasks());
  for (int t = 0; t < num_tasks(); ++t) {
    absl::Duration backoff = absl::Milliseconds(100);
    absl::Time next_log = absl::Now();
    while (true) {
      if (cancel_.cancelled()) return absl::CancelledError("connecting: cancelled");
      const absl::Time tried = absl::Now();  // given up only after a try that started past the deadline
      absl::StatusOr<CheckpointProbe> p = tasks_[t]->Probe(TaskConfig(t));
      if (p.ok()) {
        probes[t] = *std::move(p);
        break;
      }
      if (!Retryable(p.status())) return p.status();
      if (tried > give_up) {
        return absl::DeadlineExceededError(absl::StrCat("the chief gave up waiting for ps task ", t, " after ",
                                                        absl::FormatDuration(wait), " (", p.status().message(), ")"));
      }
      if (absl::Now() >= next_log) {
        LOG(INFO) << "chief waiting for ps task " << t << " (" << p.status().message() << ") " << Until(give_up, wait);
        next_log = absl::Now() + absl::Seconds(5);
      }
      absl::SleepFor(PauseBefore(give_up, backoff));
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
  }
  // Sync: a task behind ps 0 only lacks decisions ps 0 still relays when its step lies in
  // [first_relayable_step, ps 0's step] (a worker was stopped, killed or restarted between ps 0 deciding a step and
  // its pull carrying the decision to the other tasks): not a lost state. The pulls relay them, in order (this
  // chief's first pull asks for every logged decision). Tasks at ps 0's step agree.
  bool all_initialized = true, none_initialized = true, caught_up_by_pulls = true, any_checkpoint = false;
  for (const CheckpointProbe& p : probes) {
    all_initialized = all_initialized && p.initialized;
    none_initialized = none_initialized && !p.initialized;
    caught_up_by_pulls = caught_up_by_pulls && p.step <= probes[0].step && p.step >= probes[0].first_relayable_step;
    any_checkpoint = any_checkpoint || !p.restorable_steps.empty();
  }
  // Every task runs and agrees, or will once the pulls relay ps 0's decisions (async tasks count their own
  // updates: they need not agree).
  if (all_initialized && (caught_up_by_pulls || !sync_)) {
    for (int t = 1; sync_ && t < num_tasks(); ++t) {
      if (probes[t].step == probes[0].step) continue;
      LOG(INFO) << "chief: ps task " << t << " is at step " << probes[t].step << ", behind ps task 0 (step "
                << probes[0].step << "): it takes the decisions it lacks from the next pull";
    }
    return absl::OkStatus();
  }
  // A fresh start: Register and Initialize do it (a checkpoint that does not fit is refused there).
  if (none_initialized && !any_checkpoint) return absl::OkStatus();
  // Some task lost its state (restarted), or the cluster restarts from its checkpoints: every task goes to the
  // newest step that every task can restore.
  std::vector<int64_t> common = probes[0].restorable_steps;
  for (const CheckpointProbe& p : probes) {
    std::vector<int64_t> both;
    std::set_intersection(common.begin(), common.end(), p.restorable_steps.begin(), p.restorable_steps.end(),
                          std::back_inserter(both));
    common = std::move(both);
  }
  if (common.empty()) {
    std::string have;
    for (int t = 0; t < num_tasks(); ++t) {
      absl::StrAppend(&have, t == 0 ? "" : "; ", "ps task ", t, ": ",
                      probes[t].initialized ? absl::StrCat("running at step ", probes[t].step) : "no values",
                      ", checkpoints [", absl::StrJoin(probes[t].restorable_steps, ","), "]");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the ps tasks cannot be brought to one step: no checkpoint step is restorable on every task (", have,
        "). Restart every ps task with a --checkpoint_dir that holds a complete checkpoint, or an empty one"));
  }
  const int64_t k = common.back();
  // ps 0 last: a worker registers again with every task once ps 0 runs the new epoch, and only then pushes, so
  // ps 0 decides a step of the new epoch only on uploads the other tasks made after their own rollback. Restored
  // first, ps 0 could take a worker's commit for an upload that a later rollback of another task voided, and that
  // task could never apply the decision.
  for (int i = 1; i <= num_tasks(); ++i) {
    const int t = i % num_tasks();
    absl::Status s = tasks_[t]->Restore(TaskConfig(t), worker_id_, k);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("restoring ps task ", t, " to step ", k, ": ", s.message()));
  }
  LOG(WARNING) << "chief: every ps task restored the checkpoint of step " << k
               << (none_initialized ? "" : " (a ps task had lost its state)");
  return absl::OkStatus();
}

absl::Status WorkerClient::MoveTasks(int64_t step, absl::Time give_up, absl::Duration wait) {
  // Every task restores its share of the checkpoint of `step`, which every task of the old set saved as it applied
  // the step's decision (ps 0 marked it): NotFound while a part is still being written (ps 0's may be), tried again
  // until `give_up`. The tasks other than ps 0 at once, side by side (each reads the old parts it needs); ps 0 last,
  // as in PrepareTasks: it takes the new set only once every other task holds its share. No probe: reading every
  // checkpoint a task could restore costs as much as the move itself.
  const absl::Time started = absl::Now();
  // ps 0 writes its part of the move's checkpoint after the step's values went out (the other tasks wrote theirs
  // before their pulls answered): the new tasks read it, so it is waited for first.
  for (absl::Duration backoff = absl::Milliseconds(5);; backoff = std::min(backoff * 2, absl::Milliseconds(200))) {
    absl::StatusOr<TrainingStats> stats = tasks_[0]->GetStats();
    if (stats.ok() && stats->checkpoint_step >= step) break;
    if (!stats.ok() && !Retryable(stats.status())) return stats.status();
    if (cancel_.cancelled()) return absl::CancelledError("moving onto other ps tasks: cancelled");
    if (absl::Now() > give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "ps task 0 did not save the checkpoint of step ", step, " the job moves at within ",
          absl::FormatDuration(wait), stats.ok() ? absl::StrCat(" (its newest: step ", stats->checkpoint_step, ")")
                                                 : absl::StrCat(" (", stats.status().message(), ")")));
    }
    absl::SleepFor(backoff);
  }
  auto restore = [&](int t) -> absl::Status {
    absl::Duration backoff = absl::Milliseconds(20);
    while (true) {
      if (cancel_.cancelled()) return absl::CancelledError("moving onto other ps tasks: cancelled");
      const absl::Time tried = absl::Now();
      absl::Status s = tasks_[t]->Restore(TaskConfig(t), worker_id_, step);
      if (s.ok()) return s;
      if (!Retryable(s) && !absl::IsNotFound(s)) {
        return absl::Status(s.code(), absl::StrCat("moving ps task ", t, " onto ", num_tasks(), " ps tasks at step ",
                                                   step, ": ", s.message()));
      }
      if (tried > give_up) {
        return absl::DeadlineExceededError(absl::StrCat(
            "ps task ", t, " could not restore the checkpoint of step ", step, " the job moves from within ",
            absl::FormatDuration(wait), " (", s.message(), "): is --checkpoint_dir one directory that every ps "
            "task reads?"));
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Milliseconds(500));
    }
  };
  std::vector<absl::Status> restored(num_tasks());
  {
    std::vector<std::thread> others;
    for (int t = 1; t < num_tasks(); ++t) others.emplace_back([&, t] { restored[t] = restore(t); });
    for (std::thread& th : others) th.join();
  }
  for (int t = 1; t < num_tasks(); ++t) RETURN_IF_ERROR(restored[t]);
  RETURN_IF_ERROR(restore(0));
  LOG(WARNING) << "chief: the job moved onto " << num_tasks() << " ps task" << (num_tasks() == 1 ? "" : "s")
               << " at step " << step << " in " << absl::FormatDuration(absl::Now() - started)
               << " (every task restored its share of that step)";
  return absl::OkStatus();
}

std::string WorkerClient::restored_input_position() const {
  absl::MutexLock lock(&mu_);
  return restored_position_;
}

int64_t WorkerClient::join_step() const {
  absl::MutexLock lock(&mu_);
  return join_step_;
}

void WorkerClient::SetInputPosition(std::string position) { next_input_position_ = std::move(position); }

absl::Status WorkerClient::MoveTo(std::vector<PsInterface*> tasks, std::vector<std::vector<SliceSpec>> placement,
                                  const PsSet& set, absl::Duration wait) {
  const int64_t step = set.step > 0 ? set.step : -1;
  if (tasks.empty() || tasks.size() != placement.size()) {
    return absl::InvalidArgumentError(absl::StrCat("moving onto ", tasks.size(), " ps tasks with a placement for ",
                                                   placement.size()));
  }
  // What is in flight ends first, and so do the lanes and the heartbeat, which use the old tasks.
  inflight_.Cancel();
  ReleasePullWrites();
  absl::Status push = WaitPush().status();
  absl::Status pull = FinishPull().status();
  VLOG(1) << "moving after push: " << push << ", pull: " << pull;
  if (cancel_.cancelled()) return absl::CancelledError("moving onto other ps tasks: cancelled");
  {
    absl::MutexLock lock(&mu_);
    heartbeat_stop_ = true;
    heartbeat_cv_.SignalAll();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  push_lanes_.clear();
  pull_lanes_.clear();
  {
    absl::MutexLock lock(&mu_);
    heartbeat_stop_ = false;
    move_step_ = step;
  }
  const int from = num_tasks();
  tasks_ = std::move(tasks);
  placement_ = std::move(placement);
  SetUpTasks();
  config_.num_ps = num_tasks();
  config_.ps_hosts = set.hosts;
  config_.ps_version = set.version;
  LOG(INFO) << "worker " << worker_id_ << ": moving from " << from << " onto " << num_tasks() << " ps tasks"
            << (step >= 0 ? absl::StrCat(" at step ", step) : std::string(" (the job moved before)"));
  absl::Status moved = Reconnect(wait);
  absl::MutexLock lock(&mu_);
  move_step_ = -1;
  return moved;
}

absl::Status WorkerClient::Reconnect(absl::Duration wait) {
  // What is in flight belongs to the old sessions: end it now (a pull may wait on ps 0 for a step that needs
  // workers who are reconnecting themselves) and let it finish before connecting again.
  inflight_.Cancel();
  ReleasePullWrites();
  absl::Status push = WaitPush().status();
  absl::Status pull = FinishPull().status();
  VLOG(1) << "reconnecting after push: " << push << ", pull: " << pull;
  if (cancel_.cancelled()) return absl::CancelledError("reconnecting: cancelled");
  auto start_over = [this] {
    absl::MutexLock lock(&mu_);
    inflight_.Reset();  // nothing is in flight
    session_lost_ = absl::OkStatus();
    // The old push's failure was taken above: it must not fail the new sessions' waits (WaitForSparse, which a
    // sparse step calls before its BeginPush, and WaitPush with no push in flight would report it).
    push_status_ = absl::OkStatus();
  };
  start_over();
  absl::Status connected = Connect(config_, nullptr, wait);
  // A heartbeat of an old session may have been refused while Connect ran: Connect replaced every session.
  start_over();
  return connected;
}

void WorkerClient::HeartbeatLoop(absl::Duration every) {
  absl::MutexLock lock(&mu_);
  while (!cancel_.cancelled() && !heartbeat_stop_) {
    const absl::Time until = absl::Now() + every;
    while (!cancel_.cancelled() && !heartbeat_stop_ && !heartbeat_cv_.WaitWithDeadline(&mu_, until)) {
    }
    if (cancel_.cancelled() || heartbeat_stop_) break;
    const std::vector<uint64_t> sessions = sessions_;
    mu_.Unlock();
    std::vector<absl::Status> answers(num_tasks());
    for (int t = 0; t < num_tasks(); ++t) {
      if (sessions[t] != 0) answers[t] = tasks_[t]->Heartbeat(worker_id_, sessions[t]).status();
    }
    mu_.Lock();
    // Other failures are for the training thread to find: its next call to the task says what is wrong. But a
    // task that lost this worker's session may be one the training thread does not call while it waits (for a
    // step on ps 0 that needs every worker, one of them waiting for this chief to restore the task).
    for (int t = 0; t < num_tasks(); ++t) {
      if (IsJobEnded(answers[t]) && session_lost_.ok()) {
        // The run ended elsewhere: what the training thread waits for will not come; it stops.
        session_lost_ = absl::Status(answers[t].code(), absl::StrCat("ps task ", t, ": ", answers[t].message()));
        LOG(WARNING) << "worker " << worker_id_ << ": " << session_lost_.message() << "; ending the calls in flight";
        inflight_.Cancel();
        cv_.SignalAll();
      }
      if (answers[t].code() == absl::StatusCode::kAborted && sessions_[t] == sessions[t] && session_lost_.ok()) {
        session_lost_ = absl::AbortedError(absl::StrCat("heartbeat to ps task ", t, ": ", answers[t].message()));
        LOG(WARNING) << "worker " << worker_id_ << ": " << session_lost_.message() << "; ending the calls in flight";
        inflight_.Cancel();  // under mu_, so Reconnect's Reset cannot come between (its callbacks take no mu_)
        cv_.SignalAll();
      }
    }
  }
}

uint64_t WorkerClient::session(int task) {
  absl::MutexLock lock(&mu_);
  return sessions_[task];
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

template <typename Op>
absl::Status WorkerClient::WithRetries(const char* what, int task, Op op) {
  const bool pull = std::string_view(what) == "pull";
  const absl::Time give_up = absl::Now() + options_.retry_window;
  absl::Duration backoff = options_.initial_backoff;
  for (bool retry = false;; retry = true) {
    const absl::Time started = absl::Now();
    absl::Status s = op(retry);
    if (s.ok()) return s;
    if (cancel_.cancelled() || inflight_.cancelled()) return absl::CancelledError(absl::StrCat(what, " cancelled"));
    // Retried while the next try would still start within the window. Judged by when the failed try started,
    // not by the clock now: a process paused (SIGSTOP, a frozen VM) past the window during a try gets one more
    // try on waking, and one paused during the backoff below makes its try on waking before it gives up.
    if (!(pull ? RetryablePull(s) : Retryable(s)) || started + backoff > give_up) {
      return absl::Status(s.code(), absl::StrCat(what, " to ps task ", task, ": ", s.message()));
    }
    VLOG(1) << what << " to ps task " << task << " failed (" << s << "), retrying";
    absl::MutexLock lock(&mu_);
    const absl::Time until = absl::Now() + backoff;
    while (!cancel_.cancelled() && !cv_.WaitWithDeadline(&mu_, until)) {
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

// ---- push -------------------------------------------------------------------------------------------------------

absl::Status WorkerClient::BeginPush(int64_t step, const float* grads) {
  bool previous_active;
  {
    absl::MutexLock lock(&mu_);
    previous_active = push_active_;
  }
  // The previous push must be done before its buffer is overwritten.
  if (previous_active) RETURN_IF_ERROR(WaitPush().status());
  {
    absl::MutexLock lock(&mu_);
    push_step_ = step;
    push_status_ = absl::OkStatus();
    push_response_ = PushResponse{};
    pushes_pending_ = num_tasks();
    others_pending_ = num_tasks() - 1;
    push_active_ = true;
  }
  push_grads_ = grads;
  push_request_id_ = next_request_id_++;
  input_position_ = next_input_position_;  // the previous push is done with it
  std::fill(slice_queued_.begin(), slice_queued_.end(), 0);
  for (auto& p : pushes_) *p = TaskPush{};
  for (auto& parts : sparse_parts_) parts.clear();
  push_finishing_ = false;
  if (options_.wire_dtype != WireDtype::kF32 && residual_.empty()) {
    const int64_t n = slices_.empty() ? 0 : slices_.back().spec.flat_offset + slices_.back().spec.length;
    residual_.assign(n, 0.0f);
    encoded_.assign(n * DtypeBytes(options_.wire_dtype), 0);
  }
  return absl::OkStatus();
}

void WorkerClient::PushRange(int64_t begin, int64_t end) {
  std::vector<std::vector<int>> by_task(num_tasks());
  for (int s : SlicesIn(begin, end)) {
    const SliceSpec& spec = slices_[s].spec;
    if (slice_queued_[s] || spec.flat_offset < begin || spec.flat_offset + spec.length > end) continue;
    slice_queued_[s] = 1;
    by_task[slices_[s].task].push_back(s);
  }
  for (int t = 0; t < num_tasks(); ++t) {
    if (by_task[t].empty()) continue;
    RunOn(push_lanes_[t].get(), t, [this, t, list = std::move(by_task[t])]() mutable { SendSlices(t, std::move(list)); });
  }
}

void WorkerClient::FinishPush() {
  push_finishing_ = true;
  ReleasePullWrites();  // backward is over: a pull sent beside the push may write the new values
  // Gradient clipping: the norm of the whole gradient (every task's trainable slices), known only now that
  // every gradient is final; each task gets it after its slices (OptimizerConfig::clip_norm, ps_types.h).
  push_norm_ = -1.0;
  if (config_.optimizer.clip_norm > 0.0f) {
    double sum = 0.0;
    for (const Slice& slice : slices_) {
      if (!slice.spec.trainable) continue;
      const float* g = push_grads_ + slice.spec.flat_offset;
      for (int64_t i = 0; i < slice.spec.length; ++i) sum += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    }
    push_norm_ = std::sqrt(sum);
  }
  // Whatever was not pushed range by range goes now.
  std::vector<std::vector<int>> by_task(num_tasks());
  for (int s = 0; s < static_cast<int>(slices_.size()); ++s) {
    if (!slice_queued_[s]) {
      slice_queued_[s] = 1;
      by_task[slices_[s].task].push_back(s);
    }
  }
  // Other tasks first; ps 0's lane waits for them before it commits.
  for (int t = num_tasks() - 1; t >= 0; --t) {
    // A commit on a task reached inline (shared memory) is only sent here: the pull that follows goes right
    // behind it and the step sleeps once, for the pull's end (CompleteStartedCommit).
    const bool defer = t == 0 && tasks_[0]->PrefersInlineCalls();
    auto job = [this, t, defer, list = std::move(by_task[t])]() mutable {
      if (!list.empty()) SendSlices(t, std::move(list));
      FinishTaskPush(t, defer);
    };
    if (defer) {
      push_lanes_[0]->RunInline(std::move(job));  // on this thread, whatever the task prefers by now
    } else {
      RunOn(push_lanes_[t].get(), t, std::move(job));
    }
  }
}

void WorkerClient::CompleteStartedCommit() {
  if (!commit_started_) return;
  commit_started_ = false;
  CompleteTaskPush(0, /*norm_sent=*/push_norm_ >= 0.0);
}

void WorkerClient::AbandonPush(absl::Status why) {
  push_finishing_ = true;
  ReleasePullWrites();
  if (why.ok()) why = absl::CancelledError("push abandoned");
  for (int t = num_tasks() - 1; t >= 0; --t) {
    RunOn(push_lanes_[t].get(), t, [this, t, why] { AbandonTaskPush(t, why); });
  }
}

void WorkerClient::AbandonTaskPush(int task, const absl::Status& why) {
  // Destroying an unfinished upload cancels its stream; the task drops what it received of it.
  pushes_[task]->upload.reset();
  absl::MutexLock lock(&mu_);
  if (push_status_.ok()) push_status_ = why;
  --pushes_pending_;
  if (task > 0) --others_pending_;
  cv_.SignalAll();
}

absl::Status WorkerClient::OpenUpload(int task) {
  PushHeader header;
  header.worker_id = worker_id_;
  header.step = push_step_;  // not changed while lanes run a push
  header.request_id = push_request_id_;
  header.commit = task == 0;
  header.apply_early = header.commit && apply_early_.load();
  header.session = session(task);
  if (header.commit) header.input_position = input_position_;
  header.cancel = &inflight_;
  ASSIGN_OR_RETURN(pushes_[task]->upload, tasks_[task]->StartPush(header));
  return absl::OkStatus();
}

absl::Status WorkerClient::WriteSlice(int task, int s) {
  const SliceSpec& spec = slices_[s].spec;
  const float* g = push_grads_ + spec.flat_offset;
  if (options_.wire_dtype == WireDtype::kF32) {
    return pushes_[task]->upload->Write(spec.key, 0, spec.length, WireDtype::kF32, g);
  }
  const int bytes = DtypeBytes(options_.wire_dtype);
  char* out = encoded_.data() + spec.flat_offset * bytes;
  TaskPush& p = *pushes_[task];
  // Encode once per push (a retried upload sends the same bytes again).
  if (std::find(p.sent.begin(), p.sent.end(), s) == p.sent.end()) {
    EncodeWithErrorFeedback(options_.wire_dtype, g, residual_.data() + spec.flat_offset, spec.length, out);
  }
  return p.upload->Write(spec.key, 0, spec.length, options_.wire_dtype, out);
}

absl::Status WorkerClient::Reopen(int task) {
  TaskPush& p = *pushes_[task];
  RETURN_IF_ERROR(OpenUpload(task));
  for (int s : p.sent) RETURN_IF_ERROR(WriteSlice(task, s));
  for (const SparsePart* part : p.sparse_sent) RETURN_IF_ERROR(WriteSparsePart(task, *part));
  return absl::OkStatus();
}

absl::Status WorkerClient::WriteSparsePart(int task, const SparsePart& part) {
  const WireDtype dtype = options_.wire_dtype;
  const void* data = dtype == WireDtype::kF32 ? static_cast<const void*>(part.grads.data()) : part.encoded.data();
  return pushes_[task]->upload->WriteSparse(part.table, part.ids.data(), static_cast<int64_t>(part.ids.size()),
                                            part.dim, dtype, data);
}

void WorkerClient::SendSparse(int task, SparsePart* part) {
  TaskPush& p = *pushes_[task];
  if (!p.status.ok()) return;
  p.status = WithRetries("push", task, [&](bool retry) -> absl::Status {
    if (retry || !p.upload) RETURN_IF_ERROR(Reopen(task));
    if (std::find(p.sparse_sent.begin(), p.sparse_sent.end(), part) == p.sparse_sent.end()) {
      RETURN_IF_ERROR(WriteSparsePart(task, *part));
      p.sparse_sent.push_back(part);
    }
    return absl::OkStatus();
  });
}

absl::Status WorkerClient::PushSparse(uint32_t table, const int64_t* ids, int64_t n, const float* grads) {
  if (table >= config_.tables.size()) {
    return absl::InvalidArgumentError(absl::StrCat("PushSparse: no sparse table ", table, " (the config has ",
                                                   config_.tables.size(), ")"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (!push_active_ || push_finishing_) {
      return absl::FailedPreconditionError("PushSparse outside a push (call it between BeginPush and FinishPush)");
    }
  }
  if (n < 0 || (n > 0 && (ids == nullptr || grads == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("PushSparse: ", n, " rows without ids or gradients"));
  }
  const int dim = config_.tables[table].dim;
  std::vector<std::unique_ptr<SparsePart>> parts(num_tasks());
  for (auto& part : parts) {
    part = std::make_unique<SparsePart>();
    part->table = table;
    part->dim = dim;
  }
  for (int64_t i = 0; i < n; ++i) {
    SparsePart& part = *parts[ShardOfId(ids[i], num_tasks())];
    part.ids.push_back(ids[i]);
    part.grads.insert(part.grads.end(), grads + i * dim, grads + (i + 1) * dim);
  }
  for (int t = 0; t < num_tasks(); ++t) {
    if (parts[t]->ids.empty()) continue;
    SparsePart* part = parts[t].get();
    if (options_.wire_dtype != WireDtype::kF32) {
      part->encoded.resize(part->grads.size() * DtypeBytes(options_.wire_dtype));
      EncodeFloats(options_.wire_dtype, part->grads.data(), static_cast<int64_t>(part->grads.size()),
                   part->encoded.data());
    }
    sparse_parts_[t].push_back(std::move(parts[t]));
    RunOn(push_lanes_[t].get(), t, [this, t, part] { SendSparse(t, part); });
  }
  return absl::OkStatus();
}

void WorkerClient::SendSlices(int task, std::vector<int> list) {
  TaskPush& p = *pushes_[task];
  if (!p.status.ok()) return;
  p.status = WithRetries("push", task, [&](bool retry) -> absl::Status {
    if (retry || !p.upload) RETURN_IF_ERROR(Reopen(task));
    for (int s : list) {
      if (std::find(p.sent.begin(), p.sent.end(), s) != p.sent.end()) continue;
      const int64_t began = tracing() ? TraceRecorder::NowNs() : 0;
      RETURN_IF_ERROR(WriteSlice(task, s));
      if (began != 0) {
        options_.trace->Complete(absl::StrCat("send ", slices_[s].spec.variable), "transport", began,
                                 TraceRecorder::NowNs(), push_step_, absl::StrCat("ps ", task));
      }
      p.sent.push_back(s);
    }
    return absl::OkStatus();
  });
}

void WorkerClient::FinishTaskPush(int task, bool defer) {
  TaskPush& p = *pushes_[task];
  if (p.status.ok() && task == 0 && num_tasks() > 1) {
    TraceSpan span(options_.trace, "wait other tasks' uploads", "transport", push_step_);
    // A committed push is complete everywhere: wait for the other tasks' uploads.
    absl::MutexLock lock(&mu_);
    p.status = AwaitWithDeadline(
        absl::Condition(
            +[](WorkerClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) { return c->others_pending_ == 0; }, this),
        "waiting for the other ps tasks to take the push");
    if (p.status.ok() && !push_status_.ok()) p.status = push_status_;
  }
  if (defer && p.status.ok() && p.upload != nullptr) {
    absl::Status norm = push_norm_ >= 0.0 ? p.upload->SetGradientNorm(push_norm_) : absl::OkStatus();
    if (norm.ok() && p.upload->StartFinish()) {
      commit_started_ = true;  // completed by the pull behind it, or by WaitPush
      return;
    }
    CompleteTaskPush(task, /*norm_sent=*/norm.ok() && push_norm_ >= 0.0, norm);
    return;
  }
  CompleteTaskPush(task, /*norm_sent=*/false);
}

void WorkerClient::CompleteTaskPush(int task, bool norm_sent, absl::Status first_error) {
  TaskPush& p = *pushes_[task];
  TraceSpan span(options_.trace,
                 !tracing() ? std::string() : task == 0 ? "push commit ps 0" : absl::StrCat("push end ps ", task),
                 "transport", push_step_);
  PushResponse response;
  if (p.status.ok()) {
    p.status = WithRetries("push", task, [&](bool retry) -> absl::Status {
      if (!retry) RETURN_IF_ERROR(first_error);
      if (retry || !p.upload) RETURN_IF_ERROR(Reopen(task));
      // The upload in hand already carries the norm (FinishTaskPush sent it); a new one gets it again.
      if (push_norm_ >= 0.0 && (retry || !norm_sent)) RETURN_IF_ERROR(p.upload->SetGradientNorm(push_norm_));
      absl::StatusOr<PushResponse> r = p.upload->Finish();
      p.upload.reset();
      if (!r.ok()) return r.status();
      response = *r;
      return absl::OkStatus();
    });
  }
  p.upload.reset();
  absl::MutexLock lock(&mu_);
  if (task == 0) push_response_ = response;
  if (!p.status.ok() && push_status_.ok()) push_status_ = p.status;
  --pushes_pending_;
  if (task > 0) --others_pending_;
  cv_.SignalAll();
}

absl::StatusOr<PushResponse> WorkerClient::WaitPush() {
  CompleteStartedCommit();  // no pull followed it
  absl::MutexLock lock(&mu_);
  if (push_active_) {
    RETURN_IF_ERROR(AwaitWithDeadline(
        absl::Condition(
            +[](WorkerClient* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) { return c->pushes_pending_ == 0; }, this),
        "waiting for the push to complete"));
    push_active_ = false;
    if (push_status_.ok() && options_.push_journal != nullptr) {
      options_.push_journal->Acknowledged(worker_id_, push_step_, push_request_id_, push_response_);
    }
  }
  if (!push_status_.ok()) return Explain(push_status_);
  return push_response_;
}

absl::StatusOr<PushResponse> WorkerClient::Push(int64_t step, const float* grads) {
  RETURN_IF_ERROR(BeginPush(step, grads));
  FinishPush();
  return WaitPush();
}

absl::StatusOr<PushResponse> WorkerClient::Push(int64_t step, const float* grads,
                                                const std::vector<SparseGradients>& sparse) {
  RETURN_IF_ERROR(BeginPush(step, grads));
  for (const SparseGradients& g : sparse) {
    if (absl::Status s = PushSparse(g.table, g.ids, g.n, g.grads); !s.ok()) {
      AbandonPush(s);
      WaitPush().status().IgnoreError();
      return s;
    }
  }
  FinishPush();
  return WaitPush();
}

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
