// ParameterServer: the protocol of ps_types.h on top of a SliceStore. Choices the header leaves open:
// - One absl::Mutex guards all state; one CondVar wakes blocked Pulls whenever the step, a worker's clock,
//   a done flag or finished() changes. options.on_step_applied runs with that lock held, in step order:
//   it must not call back into the ParameterServer.
// - Sync: every task buffers each worker's gradients for the current step (one buffer per worker, reused;
//   a step's slices may arrive in several pushes, the commit needs them all on ps 0). A step applies the
//   average (sum in decision order, times 1/count) of the decided workers' buffers.
// - Async: a push applies on arrival. On ps 0 only a commit advances the global step and the worker's clock;
//   on other tasks every accepted push advances the task's own step (its learning-rate schedule).
// - Bounded staleness: a worker's Pull on ps 0 waits while its clock exceeds the slowest active worker's by
//   more than max_staleness, so at the moment a Pull returns, clock - min clock <= max_staleness.
// - A Pull never waits when no other worker is active (nobody could move the step): it returns at once,
//   possibly with step < min_step. When every worker is done it returns with training_done.
// - Request ids are remembered per worker for the last 1024 accepted or dropped pushes (not for pushes that
//   failed with an error, so a retry after e.g. Unavailable is handled afresh).
// - Checkpoints: whatever advances the step (Push, Pull applying decisions, Done deciding a step) copies the
//   state into pending_saves_ under the lock at the exact step due; the same RPC thread writes the files
//   after releasing the lock (through writer_, which serializes writes and pruning), before it returns. Restore
//   reads the file under the lock inside Register: nothing else can proceed before the values exist anyway.
#include "ps/parameter_server.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps/checkpoint_dir.h"
#include "ps/checkpoint_writer.h"
#include "ps/optimizer.h"
#include "ps/recent_request_ids.h"
#include "ps/slice_store.h"
#include "ps/train_config.h"

namespace dtrain::ps {
namespace {

constexpr int kStalenessBuckets = 33;          // 0..31, then ">= 32"
constexpr size_t kMaxDecisionLog = 100000;     // sync decisions ps 0 keeps for lagging pulls
constexpr size_t kRecentIdsPerWorker = 1024;   // retries arrive within a few calls of the original

// One worker's gradients for one sync step on this task, reused across steps (no allocation after the first).
struct GradientBuffer {
  int64_t step = -1;                        // the step the filled slices belong to
  std::vector<std::vector<float>> slices;   // [slice index]
  std::vector<char> filled;                 // [slice index]
  int num_filled = 0;
};

struct WorkerState {
  RecentRequestIds recent_ids{kRecentIdsPerWorker};
  WorkerStats stats;
  int64_t clock = 0;  // async, ps 0: commits applied
  GradientBuffer buffer;
};

int64_t PayloadBytes(const std::vector<SliceData>& slices) {
  int64_t floats = 0;
  for (const SliceData& s : slices) floats += static_cast<int64_t>(s.values.size());
  return floats * static_cast<int64_t>(sizeof(float));
}

}  // namespace

class ParameterServer::Impl {
 public:
  explicit Impl(ParameterServerOptions options) : options_(std::move(options)), workers_(options_.num_workers) {
    CHECK_GE(options_.task_index, 0);
    CHECK_GE(options_.num_ps, 1);
    CHECK_LT(options_.task_index, options_.num_ps);
    CHECK_GE(options_.num_workers, 1);
    const absl::Status checkpoint_options = ValidateCheckpointOptions(options_.checkpoint);
    CHECK(checkpoint_options.ok()) << checkpoint_options;
    if (checkpointing()) {
      writer_ = std::make_unique<CheckpointWriter>(options_.checkpoint, options_.task_index, options_.num_ps);
    }
    for (int w = 0; w < options_.num_workers; ++w) workers_[w].stats.worker_id = w;
  }

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckWorker(request.worker_id));
    if (!configured_) {
      if (!request.is_chief) {
        return absl::UnavailableError(absl::StrCat("ps task ", options_.task_index,
                                                   " is waiting for the chief to register its config (worker ",
                                                   request.worker_id, " is not the chief)"));
      }
      RETURN_IF_ERROR(ValidateTrainConfig(request.config, options_.num_workers));
      ASSIGN_OR_RETURN(SliceStore store, SliceStore::Create(request.config.slices, request.config.optimizer,
                                                            request.config.moving_average_decay));
      store.set_apply_threads(options_.apply_threads);
      // Restore before adopting anything, so a refused checkpoint leaves the task waiting for a chief.
      ASSIGN_OR_RETURN(std::optional<RestorableCheckpoint> restored,
                       FindCheckpointToRestore(options_.checkpoint.env, options_.checkpoint.dir, request.config,
                                               options_.task_index, options_.num_ps, request.restore_step));
      if (restored.has_value()) {
        absl::Status s = store.ImportState(restored->data.slices);
        if (!s.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("cannot restore ", restored->path, ": ", s.message()));
        }
        step_ = restored->data.task_step;
        step_hint_ = restored->data.global_step;
        last_save_label_ = restored->data.global_step;
        written_label_ = restored->data.global_step;
        first_logged_step_ = step_;
        initialized_ = true;
        LOG(INFO) << "ps task " << options_.task_index << ": restored " << restored->path << " (step "
                  << restored->data.global_step << ", " << restored->data.slices.size() << " slices)";
      }
      last_save_time_ = absl::Now();
      config_ = request.config;
      sync_ = config_.mode == "sync";
      replicas_to_aggregate_ = ResolvedReplicasToAggregate(config_);
      store_.emplace(std::move(store));
      chief_ = request.worker_id;
      configured_ = true;
      LOG(INFO) << "ps task " << options_.task_index << ": adopted the config of chief worker " << chief_ << " ("
                << config_.mode << ", " << config_.num_workers << " workers, R=" << replicas_to_aggregate_ << ", "
                << config_.optimizer.name << ", " << store_->num_slices() << " slices, " << store_->total_floats()
                << " floats)";
    } else {
      RETURN_IF_ERROR(CompareTrainConfigs(config_, request.config, request.worker_id));
      if (request.is_chief && request.worker_id != chief_) {
        return absl::FailedPreconditionError(absl::StrCat("worker ", request.worker_id,
                                                          " registers as chief, but the chief is worker ", chief_));
      }
    }
    return RegisterResponse{initialized_, step_};
  }

  absl::Status Initialize(const InitializeRequest& request) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckWorker(request.worker_id));
    if (!configured_) {
      return absl::UnavailableError(
          absl::StrCat("ps task ", options_.task_index, " has no config yet: Register the chief first"));
    }
    if (request.worker_id != chief_) {
      return absl::FailedPreconditionError(
          absl::StrCat("Initialize from worker ", request.worker_id, ", but only the chief (worker ", chief_,
                       ") initializes"));
    }
    bytes_received_ += PayloadBytes(request.slices);
    if (initialized_) {
      // A restarted chief initializes again; the values trained so far win.
      LOG(INFO) << "ps task " << options_.task_index << ": already initialized, ignoring Initialize at step "
                << step_;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(store_->SetValues(request.slices));
    initialized_ = true;
    LOG(INFO) << "ps task " << options_.task_index << ": initialized " << store_->num_slices() << " slices";
    return absl::OkStatus();
  }

  absl::StatusOr<PushResponse> Push(const PushRequest& request) {
    absl::StatusOr<PushResponse> response;
    std::vector<CheckpointData> saves;
    {
      absl::MutexLock lock(&mu_);
      response = PushLocked(request);
      saves.swap(pending_saves_);
    }
    // A periodic save that failed was logged by the writer; training goes on with the previous checkpoint.
    WriteCheckpoints(std::move(saves)).IgnoreError();
    return response;
  }

  absl::StatusOr<PullResponse> Pull(const PullRequest& request) {
    const absl::Time deadline = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, request.timeout_ms));
    absl::StatusOr<PullResponse> response;
    std::vector<CheckpointData> saves;
    {
      absl::MutexLock lock(&mu_);
      response = PullLocked(request, deadline);
      saves.swap(pending_saves_);
    }
    // A periodic save that failed was logged by the writer; training goes on with the previous checkpoint.
    WriteCheckpoints(std::move(saves)).IgnoreError();
    return response;
  }

  absl::Status Done(int worker_id) {
    absl::Status status;
    std::vector<CheckpointData> saves;
    bool finish_after_write = false;
    {
      absl::MutexLock lock(&mu_);
      status = DoneLocked(worker_id, &finish_after_write);
      saves.swap(pending_saves_);
    }
    const absl::Status saved = WriteCheckpoints(std::move(saves));
    if (finish_after_write) {
      // Only now: a finished server may exit, and the final checkpoint must be on disk by then (or its failure
      // known, for the exit code).
      absl::MutexLock lock(&mu_);
      final_checkpoint_status_ = saved;
      finished_ = true;
      cv_.SignalAll();
    }
    return status;
  }

 private:
  absl::StatusOr<PushResponse> PushLocked(const PushRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RETURN_IF_ERROR(CheckReady());
    RETURN_IF_ERROR(CheckWorker(request.worker_id));
    if (request.commit && !coordinator()) {
      return absl::InvalidArgumentError(
          absl::StrCat("commit=true sent to ps task ", options_.task_index, "; only ps task 0 takes commits"));
    }
    if (request.step < 0) return absl::InvalidArgumentError(absl::StrCat("push for negative step ", request.step));
    slice_index_.clear();
    grad_ptrs_.clear();
    if (request.flat_gradients != nullptr) {
      if (!request.gradients.empty() || !request.gradient_refs.empty()) {
        return absl::InvalidArgumentError("push with both gradients and flat_gradients");
      }
      for (int i = 0; i < store_->num_slices(); ++i) {
        slice_index_.push_back(i);
        grad_ptrs_.push_back(request.flat_gradients + store_->spec(i).flat_offset);
      }
      bytes_received_ += store_->total_floats() * static_cast<int64_t>(sizeof(float));
    }
    for (const SliceData& g : request.gradients) {
      ASSIGN_OR_RETURN(int i, store_->IndexOf(g.key));
      if (static_cast<int64_t>(g.values.size()) != store_->spec(i).length) {
        return absl::InvalidArgumentError(absl::StrCat("gradient for slice key ", g.key, " ('",
                                                       store_->spec(i).variable, "') has ", g.values.size(),
                                                       " values, expected ", store_->spec(i).length));
      }
      if (std::find(slice_index_.begin(), slice_index_.end(), i) != slice_index_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("gradient for slice key ", g.key, " given twice"));
      }
      slice_index_.push_back(i);
      grad_ptrs_.push_back(g.values.data());
    }
    bytes_received_ += PayloadBytes(request.gradients);
    for (const SliceRef& g : request.gradient_refs) {
      ASSIGN_OR_RETURN(int i, store_->IndexOf(g.key));
      if (g.length != store_->spec(i).length || g.data == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("gradient for slice key ", g.key, " ('",
                                                       store_->spec(i).variable, "') has ", g.length,
                                                       " values, expected ", store_->spec(i).length));
      }
      if (std::find(slice_index_.begin(), slice_index_.end(), i) != slice_index_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("gradient for slice key ", g.key, " given twice"));
      }
      slice_index_.push_back(i);
      grad_ptrs_.push_back(g.data);
      bytes_received_ += g.length * static_cast<int64_t>(sizeof(float));
    }

    WorkerState& worker = workers_[request.worker_id];
    PushResponse response;
    if (worker.recent_ids.Contains(request.request_id)) {
      ++worker.stats.duplicates;
      response.outcome = PushResponse::Outcome::kDuplicate;
    } else {
      ASSIGN_OR_RETURN(response.outcome, sync_ ? PushSync(request, worker) : PushAsync(request, worker));
      worker.recent_ids.Insert(request.request_id);
    }
    response.global_step = step_;
    return response;
  }

  absl::StatusOr<PullResponse> PullLocked(const PullRequest& request, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RETURN_IF_ERROR(CheckReady());
    RETURN_IF_ERROR(CheckWorker(request.worker_id));
    if (request.moving_averages && !store_->has_moving_averages()) {
      return absl::FailedPreconditionError(absl::StrCat("ps task ", options_.task_index,
                                                        " keeps no moving averages (the chief's "
                                                        "moving_average_decay is 0): cannot pull them"));
    }
    if (request.min_step < 0 || request.since_step < 0) {
      return absl::InvalidArgumentError(absl::StrCat("pull with negative min_step (", request.min_step,
                                                     ") or since_step (", request.since_step, ")"));
    }
    if (sync_ && !coordinator()) RETURN_IF_ERROR(ApplyDecisions(request.decisions));

    WorkerState& worker = workers_[request.worker_id];
    const absl::Time wait_start = absl::Now();
    bool timed_out = false;
    while (MustWait(request)) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) {
        timed_out = MustWait(request);
        break;
      }
    }
    worker.stats.wait_seconds += absl::ToDoubleSeconds(absl::Now() - wait_start);
    if (timed_out) {
      std::string waiting_for = absl::StrCat("step >= ", request.min_step, " (at step ", step_, ")");
      if (step_ >= request.min_step) {
        waiting_for = absl::StrCat("the slowest worker (worker ", request.worker_id, " has ", worker.clock,
                                   " commits, the slowest active worker ", MinActiveClock(),
                                   ", max_staleness ", config_.max_staleness, ")");
      }
      return absl::DeadlineExceededError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                                      options_.task_index, " timed out after ",
                                                      request.timeout_ms, " ms waiting for ", waiting_for));
    }

    PullResponse response;
    response.step = step_;
    response.training_done = finished_;
    if (request.flat_out != nullptr) {
      if (request.moving_averages) {
        store_->CopyMovingAveragesToFlat(request.flat_out);
      } else {
        store_->CopyValuesToFlat(request.flat_out);
      }
      bytes_sent_ += store_->total_floats() * static_cast<int64_t>(sizeof(float));
    } else if (request.moving_averages) {
      store_->ReadMovingAverages(&response.slices);
    } else {
      store_->ReadValues(&response.slices);
    }
    if (sync_ && coordinator()) {
      // Decisions older than the log are gone; a task that needs them reports "missing decision".
      const int64_t first = std::max(request.since_step, first_logged_step_);
      for (int64_t s = first; s < step_; ++s) response.decisions.push_back(decision_log_[s - first_logged_step_]);
    }
    bytes_sent_ += PayloadBytes(response.slices);
    return response;
  }

  absl::Status DoneLocked(int worker_id, bool* finish_after_write) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RETURN_IF_ERROR(CheckWorker(worker_id));
    WorkerState& worker = workers_[worker_id];
    if (!worker.stats.done) {
      worker.stats.done = true;
      ++num_done_;
      LOG(INFO) << "ps task " << options_.task_index << ": worker " << worker_id << " is done (" << num_done_
                << " of " << options_.num_workers << ")";
    }
    if (configured_ && sync_ && coordinator()) MaybeDecide();
    if (num_done_ == options_.num_workers && !finished_ && !final_save_started_) {
      if (checkpointing() && configured_ && initialized_) {
        final_save_started_ = true;
        *finish_after_write = true;
        // Saved again unless this step is on disk already, or about to be written by this very call (a
        // periodic save of the same step that failed, or runs on another thread, does not count).
        const int64_t label = CheckpointLabel();
        const bool pending_here = !pending_saves_.empty() && pending_saves_.back().global_step == label;
        if (label != written_label_ && !pending_here) SnapshotLocked(label);
      } else {
        finished_ = true;
      }
    }
    cv_.SignalAll();
    return absl::OkStatus();
  }

 public:

  absl::StatusOr<TrainingStats> GetStats() {
    absl::MutexLock lock(&mu_);
    TrainingStats stats;
    stats.global_step = step_;
    for (const WorkerState& w : workers_) stats.workers.push_back(w.stats);
    if (configured_ && !sync_) stats.staleness_histogram = staleness_histogram_;
    stats.max_staleness_seen = max_staleness_seen_;
    stats.bytes_received = bytes_received_;
    stats.bytes_sent = bytes_sent_;
    return stats;
  }

  bool finished() const {
    absl::MutexLock lock(&mu_);
    return finished_;
  }

  bool WaitUntilFinished(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::MutexLock lock(&mu_);
    while (!finished_) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) break;
    }
    return finished_;
  }

  int64_t step() const {
    absl::MutexLock lock(&mu_);
    return step_;
  }

  absl::Status final_checkpoint_status() const {
    absl::MutexLock lock(&mu_);
    return final_checkpoint_status_;
  }

 private:
  bool coordinator() const { return options_.task_index == 0; }
  bool checkpointing() const { return options_.checkpoint.enabled(); }

  // The step a checkpoint taken now belongs to: the task's step, except on a non-zero task in async mode,
  // whose own step counts its updates: there, the newest global step seen in pushes.
  int64_t CheckpointLabel() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return sync_ || coordinator() ? step_ : step_hint_;
  }

  // Whether ps 0 (or, in async mode, any task) saves at `label` by its own schedule; if so, the label to
  // save under (a crossed multiple of checkpoint.save_steps, or `label` itself for a time-based save).
  std::optional<int64_t> SaveDue(int64_t label) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!checkpointing() || label <= last_save_label_) return std::nullopt;
    const int64_t every = options_.checkpoint.save_steps;
    if (every > 0 && label / every > last_save_label_ / every) return label / every * every;
    if (options_.checkpoint.save_secs > 0 &&
        absl::Now() - last_save_time_ >= absl::Seconds(options_.checkpoint.save_secs)) {
      return label;
    }
    return std::nullopt;
  }

  // Copies the state into pending_saves_; the RPC thread writes it after releasing the lock.
  void SnapshotLocked(int64_t label) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CheckpointData d;
    d.task_index = options_.task_index;
    d.num_ps = options_.num_ps;
    d.global_step = label;
    d.task_step = step_;
    d.model_signature = config_.model_signature;
    d.optimizer = config_.optimizer.name;
    d.num_slots = store_->optimizer().num_slots();
    d.has_moving_averages = store_->has_moving_averages();
    d.slices = store_->ExportState();
    if (!d.has_moving_averages) {
      for (SliceState& s : d.slices) s.moving_average.clear();
    }
    pending_saves_.push_back(std::move(d));
    last_save_label_ = label;
    last_save_time_ = absl::Now();
  }

  // Writes checkpoints taken under the lock (CheckpointWriter: retried, then logged; it prunes the oldest
  // beyond checkpoint.keep). Returns the status of the newest one: the caller decides whether it matters (the
  // final save).
  absl::Status WriteCheckpoints(std::vector<CheckpointData> saves) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Status newest;
    for (const CheckpointData& d : saves) {
      newest = writer_->Save(d);
      if (newest.ok()) {
        absl::MutexLock lock(&mu_);
        written_label_ = std::max(written_label_, d.global_step);
      }
    }
    return newest;
  }

  absl::Status CheckWorker(int worker_id) const {
    if (worker_id < 0 || worker_id >= options_.num_workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker id ", worker_id, " is out of range [0, ", options_.num_workers, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!configured_) {
      return absl::UnavailableError(
          absl::StrCat("ps task ", options_.task_index, " has no config yet: waiting for the chief to register"));
    }
    if (!initialized_) {
      return absl::UnavailableError(
          absl::StrCat("ps task ", options_.task_index, " is not initialized yet: waiting for the chief"));
    }
    return absl::OkStatus();
  }

  // Sync push: buffer the gradient for the current step; on ps 0 a commit may decide the step.
  absl::StatusOr<PushResponse::Outcome> PushSync(const PushRequest& request, WorkerState& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (request.step < step_) {
      // Every step below step_ has been decided; the one just decided is where backup workers land.
      if (request.step == step_ - 1) {
        ++worker.stats.dropped_backup;
        return PushResponse::Outcome::kDroppedBackup;
      }
      ++worker.stats.dropped_stale;
      return PushResponse::Outcome::kDroppedStale;
    }
    if (request.step > step_) {
      return absl::FailedPreconditionError(absl::StrCat("push from worker ", request.worker_id, " for step ",
                                                        request.step, ", but ps task ", options_.task_index,
                                                        " is at step ", step_, " (pull before pushing)"));
    }
    if (request.commit &&
        std::find(pending_.begin(), pending_.end(), request.worker_id) != pending_.end()) {
      ++worker.stats.duplicates;  // a second commit for the same step under a new request id
      return PushResponse::Outcome::kDuplicate;
    }
    GradientBuffer& buffer = worker.buffer;
    if (buffer.step != request.step) {
      buffer.step = request.step;
      buffer.slices.resize(store_->num_slices());
      buffer.filled.assign(store_->num_slices(), 0);
      buffer.num_filled = 0;
    }
    for (size_t j = 0; j < slice_index_.size(); ++j) {
      const int i = slice_index_[j];
      buffer.slices[i].assign(grad_ptrs_[j], grad_ptrs_[j] + store_->spec(i).length);
      if (!buffer.filled[i]) {
        buffer.filled[i] = 1;
        ++buffer.num_filled;
      }
    }
    if (request.commit) {
      if (buffer.num_filled != store_->num_slices()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "worker ", request.worker_id, " committed step ", request.step, " with gradients for ",
            buffer.num_filled, " of the ", store_->num_slices(), " slices of ps task 0"));
      }
      pending_.push_back(request.worker_id);
      MaybeDecide();
    }
    return PushResponse::Outcome::kAccepted;
  }

  // Async push: apply at once; on ps 0 a commit advances the global step and the worker's clock.
  absl::StatusOr<PushResponse::Outcome> PushAsync(const PushRequest& request, WorkerState& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (coordinator() && request.step > step_) {
      return absl::FailedPreconditionError(absl::StrCat("push from worker ", request.worker_id, " for step ",
                                                        request.step, ", but the global step is only ", step_));
    }
    for (size_t j = 0; j < slice_index_.size(); ++j) {
      store_->ApplyGradient(slice_index_[j], step_, grad_ptrs_[j], 1.0f);
    }
    if (!coordinator()) {
      ++step_;  // the task's own count of updates, for its learning-rate schedule
      ++worker.stats.applied;
      step_hint_ = std::max(step_hint_, request.step + 1);
      if (std::optional<int64_t> label = SaveDue(step_hint_)) SnapshotLocked(*label);
    } else if (request.commit) {
      const int64_t staleness = step_ - request.step;
      ++staleness_histogram_[std::min<int64_t>(staleness, kStalenessBuckets - 1)];
      max_staleness_seen_ = std::max(max_staleness_seen_, staleness);
      ++worker.clock;
      ++worker.stats.applied;
      StepDecision applied{step_, {request.worker_id}};
      ++step_;
      if (std::optional<int64_t> label = SaveDue(step_)) {
        applied.checkpoint = true;
        SnapshotLocked(*label);
      }
      if (options_.on_step_applied) options_.on_step_applied(applied);
    }
    cv_.SignalAll();
    return PushResponse::Outcome::kAccepted;
  }

  // ps 0, sync: decides the current step once it has min(R, active workers) commits.
  void MaybeDecide() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int active = options_.num_workers - num_done_;
    const size_t needed = static_cast<size_t>(std::min(replicas_to_aggregate_, active));
    if (pending_.empty() || pending_.size() < needed) return;
    StepDecision decision{step_, std::move(pending_)};
    pending_.clear();
    ApplyDecision(decision);
    if (std::optional<int64_t> label = SaveDue(step_)) {
      decision.checkpoint = true;  // the other tasks save this step too when they apply the decision
      SnapshotLocked(*label);
    }
    decision_log_.push_back(decision);
    if (decision_log_.size() > kMaxDecisionLog) {
      decision_log_.pop_front();
      ++first_logged_step_;
    }
    VLOG(1) << "step " << decision.step << " decided: workers " << absl::StrJoin(decision.workers, ",");
    if (options_.on_step_applied) options_.on_step_applied(decision);
  }

  // Non-coordinator tasks, sync: applies the decisions this task has not applied yet, in order.
  absl::Status ApplyDecisions(const std::vector<StepDecision>& decisions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const StepDecision& d : decisions) {
      if (d.step < step_) continue;
      if (d.step > step_) {
        return absl::FailedPreconditionError(absl::StrCat("missing decision for step ", step_, " on ps task ",
                                                          options_.task_index, " (got one for step ", d.step,
                                                          ")"));
      }
      if (d.workers.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("decision for step ", d.step, " names no workers"));
      }
      for (size_t k = 0; k < d.workers.size(); ++k) {
        const int w = d.workers[k];
        RETURN_IF_ERROR(CheckWorker(w));
        if (std::find(d.workers.begin(), d.workers.begin() + k, w) != d.workers.begin() + k) {
          return absl::InvalidArgumentError(
              absl::StrCat("decision for step ", d.step, " names worker ", w, " twice"));
        }
        const GradientBuffer& b = workers_[w].buffer;
        if (b.step != d.step || b.num_filled != store_->num_slices()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "decision for step ", d.step, " includes worker ", w, ", but ps task ", options_.task_index,
              " does not hold its gradients for that step (buffered step ", b.step, ", ", b.num_filled, " of ",
              store_->num_slices(), " slices)"));
        }
      }
      ApplyDecision(d);
      if (d.checkpoint) {
        if (checkpointing()) {
          SnapshotLocked(step_);
        } else {
          LOG_FIRST_N(WARNING, 1) << "ps task " << options_.task_index << ": ps task 0 saved a checkpoint at step "
                                  << step_ << ", but this task has no --checkpoint_dir: its part is not saved";
        }
      }
    }
    return absl::OkStatus();
  }

  // Applies the average of the decided workers' buffered gradients as step_, then advances step_.
  void ApplyDecision(const StepDecision& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const float scale = 1.0f / static_cast<float>(d.workers.size());
    for (int i = 0; i < store_->num_slices(); ++i) {
      const int64_t n = store_->spec(i).length;
      const float* grad = workers_[d.workers[0]].buffer.slices[i].data();
      if (d.workers.size() > 1) {
        scratch_.assign(grad, grad + n);
        for (size_t k = 1; k < d.workers.size(); ++k) {
          AddInto(workers_[d.workers[k]].buffer.slices[i].data(), scratch_.data(), n);
        }
        grad = scratch_.data();
      }
      store_->ApplyGradient(i, step_, grad, scale);
    }
    for (int w : d.workers) ++workers_[w].stats.applied;
    ++step_;
    cv_.SignalAll();
  }

  int64_t MinActiveClock() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t min_clock = -1;
    for (const WorkerState& w : workers_) {
      if (!w.stats.done && (min_clock < 0 || w.clock < min_clock)) min_clock = w.clock;
    }
    return min_clock;
  }

  bool AnotherWorkerActive(int worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int w = 0; w < options_.num_workers; ++w) {
      if (w != worker_id && !workers_[w].stats.done) return true;
    }
    return false;
  }

  // Whether a Pull must keep waiting. It stops when training is finished, or when no other active worker
  // is left to move the step or the clocks (then it returns what there is, possibly step < min_step).
  bool MustWait(const PullRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || !AnotherWorkerActive(request.worker_id)) return false;
    if (step_ < request.min_step) return true;
    if (!sync_ && coordinator() && config_.max_staleness >= 0) {
      const WorkerState& w = workers_[request.worker_id];
      return !w.stats.done && w.clock - MinActiveClock() > config_.max_staleness;
    }
    return false;
  }

  const ParameterServerOptions options_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled whenever the step, a clock, a worker's done flag or finished_ changes

  bool configured_ ABSL_GUARDED_BY(mu_) = false;
  TrainConfig config_ ABSL_GUARDED_BY(mu_);
  bool sync_ ABSL_GUARDED_BY(mu_) = true;
  int replicas_to_aggregate_ ABSL_GUARDED_BY(mu_) = 1;
  int chief_ ABSL_GUARDED_BY(mu_) = -1;
  std::optional<SliceStore> store_ ABSL_GUARDED_BY(mu_);
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;

  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  int num_done_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;

  std::vector<int> pending_ ABSL_GUARDED_BY(mu_);  // ps 0, sync: committed workers for step_, in order
  std::deque<StepDecision> decision_log_ ABSL_GUARDED_BY(mu_);  // [i] decides step first_logged_step_ + i
  int64_t first_logged_step_ ABSL_GUARDED_BY(mu_) = 0;

  std::vector<int64_t> staleness_histogram_ ABSL_GUARDED_BY(mu_) = std::vector<int64_t>(kStalenessBuckets, 0);
  int64_t max_staleness_seen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;

  // Checkpoints.
  int64_t step_hint_ ABSL_GUARDED_BY(mu_) = 0;        // async, tasks > 0: newest global step seen in pushes
  int64_t last_save_label_ ABSL_GUARDED_BY(mu_) = 0;  // step of the newest checkpoint taken (or restored)
  int64_t written_label_ ABSL_GUARDED_BY(mu_) = 0;    // step of the newest checkpoint written (or restored)
  absl::Time last_save_time_ ABSL_GUARDED_BY(mu_);
  std::vector<CheckpointData> pending_saves_ ABSL_GUARDED_BY(mu_);  // taken, not yet written
  bool final_save_started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_checkpoint_status_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CheckpointWriter> writer_;  // set once in the constructor when checkpointing; thread-safe

  std::vector<int> slice_index_ ABSL_GUARDED_BY(mu_);  // Push: slice index of each gradient in the request
  std::vector<const float*> grad_ptrs_ ABSL_GUARDED_BY(mu_);  // Push: where each of those gradients is
  std::vector<float> scratch_ ABSL_GUARDED_BY(mu_);    // ApplyDecision: gradient sums
};

ParameterServer::ParameterServer(ParameterServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
ParameterServer::~ParameterServer() = default;

absl::StatusOr<RegisterResponse> ParameterServer::Register(const RegisterRequest& request) {
  return impl_->Register(request);
}
absl::Status ParameterServer::Initialize(const InitializeRequest& request) { return impl_->Initialize(request); }
absl::StatusOr<PushResponse> ParameterServer::Push(const PushRequest& request) { return impl_->Push(request); }
absl::StatusOr<PullResponse> ParameterServer::Pull(const PullRequest& request) { return impl_->Pull(request); }
absl::Status ParameterServer::Done(int worker_id) { return impl_->Done(worker_id); }
absl::StatusOr<TrainingStats> ParameterServer::GetStats() { return impl_->GetStats(); }
bool ParameterServer::finished() const { return impl_->finished(); }
bool ParameterServer::WaitUntilFinished(absl::Duration timeout) { return impl_->WaitUntilFinished(timeout); }
int64_t ParameterServer::step() const { return impl_->step(); }
absl::Status ParameterServer::final_checkpoint_status() const { return impl_->final_checkpoint_status(); }

}  // namespace dtrain::ps
