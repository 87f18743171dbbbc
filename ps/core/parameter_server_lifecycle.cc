// ParameterServer, part 2: registration (adopting the chief's config, restoring a checkpoint), probe and restore
// (the chief's rollback of every task to a common step), membership (done, heartbeats, leases) and the end of
// training, checkpoints. Part 1: parameter_server.cc; the design and the lock order:
// parameter_server_impl.h.
#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {
namespace {

// ", N sparse rows" for the log line of a restored checkpoint with tables ("" without).
std::string SparseRowsRestored(const std::vector<SparseTableState>& tables) {
  if (tables.empty()) return "";
  int64_t rows = 0;
  for (const SparseTableState& t : tables) rows += static_cast<int64_t>(t.ids.size());
  return absl::StrCat(", ", rows, " sparse rows");
}

}  // namespace

// ---- register, probe, restore ---------------------------------------------------------------------------------

absl::Status ParameterServer::Impl::ConfigureLocked(const TrainConfig& config, int chief) {
  RETURN_IF_ERROR(ValidateTrainConfig(config, options_.num_workers));
  int64_t bytes = 0;
  for (const SliceSpec& s : config.slices) bytes += s.length * static_cast<int64_t>(sizeof(float));
  if (bytes > options_.max_model_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the model's slices on ps task ", options_.task_index, " take ",
                                                     bytes, " bytes, more than --max_model_bytes=",
                                                     options_.max_model_bytes));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SliceStore> store,
                   SliceStore::Create(config.slices, config.optimizer, config.moving_average_decay));
  store->set_apply_threads(options_.apply_threads);
  // Without tables the sparse optimizer is not used (and may be unset): an empty store with the defaults.
  SparseStoreOptions sparse_options{options_.task_index, options_.num_ps, options_.sparse_max_rows};
  sparse_options.track_changes = deltas();
  sparse_options.clock = options_.clock;
  ASSIGN_OR_RETURN(std::unique_ptr<SparseStore> sparse,
                   SparseStore::Create(config.tables,
                                       config.tables.empty() ? SparseOptimizerConfig() : config.sparse_optimizer,
                                       config.optimizer, sparse_options));
  for (int t = 0; t < sparse->num_tables(); ++t) {
    const SparseTableSpec& spec = sparse->spec(t);
    const int64_t row_bytes = 13 + int64_t{RowDtypeBytes(spec.row_dtype)} * spec.dim +
                              int64_t{RowDtypeBytes(spec.slot_dtype)} * spec.dim * sparse->optimizer().num_slots();
    if (sparse->max_rows(t) > 0) bytes += sparse->max_rows(t) * row_bytes;
  }
  if (bytes > options_.max_model_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the model's slices and bounded sparse tables (max_rows) on ps "
                                                     "task ", options_.task_index, " take up to ", bytes,
                                                     " bytes, more than --max_model_bytes=", options_.max_model_bytes));
  }
  sparse->SetVersion(step_);
  config_ = config;
  sync_ = config_.mode == "sync";
  sparse_async_ = sync_ && config_.sparse_mode == "async";
  store_ = std::move(store);
  sparse_ = std::move(sparse);
  buffers_ = std::make_unique<GradientBuffers>(options_.num_workers, *store_, sparse_.get());
  coordinator_ = std::make_unique<SyncCoordinator>(ResolvedReplicasToAggregate(config_));
  coordinator_->StartAt(step_);
  gate_ = std::make_unique<StalenessGate>(options_.num_workers, config_.max_staleness);
  applied_through_ = step_;
  chief_ = chief;
  members_.StartLeases(Now());
  configured_ = true;
  LOG(INFO) << "ps task " << options_.task_index << ": adopted the config of chief worker " << chief_ << " ("
            << config_.mode << ", " << config_.num_workers << " workers, R=" << ResolvedReplicasToAggregate(config_)
            << ", " << config_.optimizer.name << ", " << store_->num_slices() << " slices, " << store_->total_floats()
            << " floats" << (config_.tables.empty() ? "" : absl::StrCat(", ", config_.tables.size(), " sparse tables (",
                                                                        config_.sparse_optimizer.name, ")"))
            << ")";
  return absl::OkStatus();
}

absl::StatusOr<RegisterResponse> ParameterServer::Impl::Register(const RegisterRequest& request) {
  absl::MutexLock apply_lock(&apply_mu_);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(members_.CheckWorker(request.worker_id));
  if (!configured_) {
    last_contact_ = Now();
    if (!request.is_chief) {
      return absl::UnavailableError(absl::StrCat("ps task ", options_.task_index,
                                                 " is waiting for the chief to register its config (worker ",
                                                 request.worker_id, " is not the chief)"));
    }
    // Restore before adopting anything, so a refused checkpoint leaves the task waiting for a chief.
    RETURN_IF_ERROR(ValidateTrainConfig(request.config, options_.num_workers));
    ASSIGN_OR_RETURN(std::optional<RestorableCheckpoint> restored,
                     FindStateToRestore(options_.checkpoint.env, options_.checkpoint.dir, options_.delta.dir,
                                        request.config, options_.task_index, options_.num_ps, request.restore_step));
    if (restored.has_value()) step_ = restored->data.task_step;
    RETURN_IF_ERROR(ConfigureLocked(request.config, request.worker_id));
    if (restored.has_value()) {
      absl::StatusOr<SparseStore::CheckedState> tables = sparse_->CheckState(restored->data.tables);
      absl::Status s = tables.status();
      if (s.ok()) s = store_->ImportState(restored->data.slices, restored->data.task_step);
      if (s.ok()) sparse_->ImportChecked(*tables, restored->data.task_step);
      if (!s.ok()) {
        configured_ = false;
        step_ = 0;
        return absl::FailedPreconditionError(absl::StrCat("cannot restore ", restored->path, ": ", s.message()));
      }
      step_hint_ = restored->data.global_step;
      checkpoints_.Saved(restored->data.global_step);
      written_label_ = restored->data.global_step;
      members_.RestoreInputPositions(restored->data.input_positions, restored->data.global_step);
      RestoredLocked(restored->data.global_step);
      initialized_ = true;
      LOG(INFO) << "ps task " << options_.task_index << ": restored " << restored->path << " (step "
                << restored->data.global_step << ", " << restored->data.slices.size() << " slices"
                << SparseRowsRestored(restored->data.tables) << ")";
    }
  } else {
    RETURN_IF_ERROR(CompareTrainConfigs(config_, request.config, request.worker_id));
    if (request.is_chief && request.worker_id != chief_) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", request.worker_id,
                                                        " registers as chief, but the chief is worker ", chief_));
    }
  }
  const bool was_lost = members_.lost(request.worker_id);
  RegisterResponse response{initialized_, step_, members_.Register(request.worker_id, Now()),
                            absl::ToInt64Milliseconds(options_.worker_timeout),
                            members_.RestoredInputPosition(request.worker_id)};
  if (was_lost) {
    LOG(INFO) << "ps task " << options_.task_index << ": worker " << request.worker_id
              << " is back (registered again after it was declared lost; " << members_.num_active() << " active)";
  }
  cv_.SignalAll();  // a worker that comes back counts as active again
  return response;
}

absl::StatusOr<CheckpointProbe> ParameterServer::Impl::Probe(const TrainConfig& config) {
  CheckpointProbe probe;
  {
    absl::MutexLock lock(&mu_);
    probe.configured = configured_;
    probe.initialized = initialized_;
    probe.step = step_;
    if (configured_) RETURN_IF_ERROR(CompareTrainConfigs(config_, config, 0));
  }
  if (!restorable()) return probe;
  // Every file of this task that reads back valid and fits the config (read outside the lock: it takes time).
  std::vector<CheckpointFile> files;
  if (checkpointing()) {
    ASSIGN_OR_RETURN(files, ListCheckpointFiles(options_.checkpoint.env, options_.checkpoint.dir));
  }
  for (const CheckpointFile& f : files) {
    if (f.task != options_.task_index || f.num_ps != options_.num_ps) continue;
    absl::StatusOr<CheckpointData> data = ReadCheckpoint(options_.checkpoint.env, f.path);
    if (!data.ok()) {
      LOG(WARNING) << "ps task " << options_.task_index << ": " << f.path << " is not restorable (skipping it; an older step will be tried): "
                   << data.status();
      continue;
    }
    if (!CheckCompatible(*data, f.path, config, options_.task_index, options_.num_ps).ok()) continue;
    probe.restorable_steps.push_back(f.step);
  }
  std::sort(probe.restorable_steps.begin(), probe.restorable_steps.end());
  // And the steps of the deltas that chain from them (or from a fresh start).
  ASSIGN_OR_RETURN(const std::vector<int64_t> by_deltas,
                   DeltaStepsReachable(options_.checkpoint.env, options_.delta.dir, options_.task_index,
                                       options_.num_ps, probe.restorable_steps));
  if (!by_deltas.empty()) {
    probe.restorable_steps.insert(probe.restorable_steps.end(), by_deltas.begin(), by_deltas.end());
    std::sort(probe.restorable_steps.begin(), probe.restorable_steps.end());
    probe.restorable_steps.erase(std::unique(probe.restorable_steps.begin(), probe.restorable_steps.end()),
                                 probe.restorable_steps.end());
  }
  return probe;
}

absl::Status ParameterServer::Impl::Restore(const TrainConfig& config, int worker_id, int64_t step) {
  if (worker_id != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Restore from worker ", worker_id, ": only the chief (worker 0) restores the ps tasks"));
  }
  if (!restorable()) {
    return absl::FailedPreconditionError(absl::StrCat("ps task ", options_.task_index,
                                                      " has no --checkpoint_dir: it cannot restore step ", step));
  }
  // Read and check the file first: a bad one leaves the task as it was.
  std::string path = CheckpointPath(options_.checkpoint.dir, step, options_.task_index, options_.num_ps);
  CheckpointData data;
  if (options_.delta.dir.empty()) {
    ASSIGN_OR_RETURN(data, ReadCheckpoint(options_.checkpoint.env, path));
    RETURN_IF_ERROR(CheckCompatible(data, path, config, options_.task_index, options_.num_ps));
  } else {
    // The checkpoint of that step, or an earlier one and the deltas up to it.
    TrainConfig exact = config;
    exact.mode = "sync";  // that step or nothing, whatever the mode
    ASSIGN_OR_RETURN(std::optional<RestorableCheckpoint> found,
                     FindStateToRestore(options_.checkpoint.env, options_.checkpoint.dir, options_.delta.dir, exact,
                                        options_.task_index, options_.num_ps, step));
    if (!found.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat("ps task ", options_.task_index,
                                                        " has no checkpoint or deltas to restore step ", step));
    }
    path = std::move(found->path);
    data = std::move(found->data);
  }
  std::shared_ptr<Cancellation> ended;
  {
    absl::MutexLock apply_lock(&apply_mu_);
    absl::MutexLock lock(&mu_);
    if (!configured_) {
      step_ = data.task_step;
      RETURN_IF_ERROR(ConfigureLocked(config, worker_id));
    } else {
      RETURN_IF_ERROR(CompareTrainConfigs(config_, config, worker_id));
    }
    ASSIGN_OR_RETURN(const SparseStore::CheckedState tables, sparse_->CheckState(data.tables));
    RETURN_IF_ERROR(store_->ImportState(data.slices, data.task_step));
    sparse_->ImportChecked(tables, data.task_step);
    const int64_t was = step_;
    step_ = data.task_step;
    step_hint_ = data.global_step;
    initialized_ = true;
    applied_through_ = step_;
    coordinator_ = std::make_unique<SyncCoordinator>(ResolvedReplicasToAggregate(config_));
    coordinator_->StartAt(step_);
    gate_ = std::make_unique<StalenessGate>(options_.num_workers, config_.max_staleness);
    std::fill(complete_step_.begin(), complete_step_.end(), -1);
    for (size_t w = 0; w < pending_accepted_.size(); ++w) {  // gradients of the old epoch: never applied
      if (pending_accepted_[w]) ++accounting_.discarded;
      pending_accepted_[w] = false;
    }
    checkpoints_.Saved(data.global_step);
    written_label_ = data.global_step;
    members_.RestoreInputPositions(data.input_positions, data.global_step);
    RestoredLocked(data.global_step);
    ended = NewEpochLocked();
    LOG(WARNING) << "ps task " << options_.task_index << ": restored " << path << " on the chief's request (was at step "
                 << was << ", now " << step_ << SparseRowsRestored(data.tables) << "); every worker registers again";
  }
  // Outside the locks: the callbacks of the pulls waiting in the old epoch take mu_ to wake them.
  ended->Cancel();
  return absl::OkStatus();
}

std::shared_ptr<Cancellation> ParameterServer::Impl::NewEpochLocked() {
  members_.ResetSessions(Now());
  ++epoch_;
  std::shared_ptr<Cancellation> ended = std::exchange(epoch_cancel_, std::make_shared<Cancellation>());
  cv_.SignalAll();
  if (store_) store_->WakeWaiters();
  if (sparse_) sparse_->WakeWaiters();
  return ended;
}

absl::Status ParameterServer::Impl::CheckReady() const {
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

// ---- membership: done, heartbeats, leases, the end --------------------------------------------------------------

absl::Status ParameterServer::Impl::Done(int worker_id, uint64_t session, bool completed, int64_t global_step) {
  std::optional<StepDecision> decided;
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(members_.CheckWorker(worker_id));
    RETURN_IF_ERROR(members_.CheckLeave(worker_id, session));
    last_contact_ = Now();
    if (!configured_ && completed && !members_.done(worker_id)) {
      // Training ended while this task was down (it restarted after the last step): see CheckUnconfiguredLocked.
      ended_step_ = std::max({ended_step_, global_step, int64_t{0}});
    }
    if (members_.MarkDone(worker_id, completed)) {
      if (completed) {
        LOG(INFO) << "ps task " << options_.task_index << ": worker " << worker_id << " is done ("
                  << members_.num_done() << " of " << options_.num_workers << ")";
      } else {
        LOG(WARNING) << "ps task " << options_.task_index << ": worker " << worker_id
                     << " left after an error (it stops counting; " << members_.num_active() << " of "
                     << options_.num_workers << " still active)";
      }
    }
    if (configured_ && sync_ && coordinator()) decided = DecideLocked();
    epoch = epoch_;
    cv_.SignalAll();
  }
  AfterWorkersLeft(std::move(decided), epoch);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterServer::Impl::Heartbeat(int worker_id, uint64_t session) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(members_.CheckWorker(worker_id));
  if (!configured_) {
    last_contact_ = Now();
    return absl::AbortedError(absl::StrCat("ps task ", options_.task_index, " has no config (it restarted): register again"));
  }
  RETURN_IF_ERROR(members_.CheckSession(worker_id, session, Now()));
  return step_;
}

void ParameterServer::Impl::CheckLeases() {
  std::optional<StepDecision> decided;
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    if (!configured_) {
      CheckUnconfiguredLocked();
      return;
    }
    if (options_.worker_timeout <= absl::ZeroDuration()) return;
    const std::vector<int> lost = members_.ExpireLeases(Now(), options_.worker_timeout);
    if (lost.empty()) return;
    LOG(WARNING) << "ps task " << options_.task_index << ": worker" << (lost.size() > 1 ? "s " : " ")
                 << absl::StrJoin(lost, ", ") << " lost: no contact for more than "
                 << absl::FormatDuration(options_.worker_timeout) << " (" << members_.num_active()
                 << " still active)";
    if (sync_ && coordinator()) decided = DecideLocked();
    epoch = epoch_;
    cv_.SignalAll();
  }
  AfterWorkersLeft(std::move(decided), epoch);
}

void ParameterServer::Impl::CheckUnconfiguredLocked() {
  const absl::Time now = Now();
  if (ended_step_ >= 0) {
    // Workers that reported done to this task's previous process will not call again: wait for the others only
    // while someone is still calling.
    const absl::Duration quiet = options_.worker_timeout > absl::ZeroDuration() ? options_.worker_timeout
                                                                                : options_.registration_timeout;
    if (now - last_contact_ >= quiet) FinishAfterEndLocked();
    return;
  }
  if (now - unconfigured_since_ < options_.registration_timeout) return;
  outcome_ = TrainingOutcome();
  outcome_.global_step = step_;
  outcome_.message = absl::StrCat("no chief worker registered within ",
                                  absl::FormatDuration(options_.registration_timeout),
                                  " (--registration_timeout_secs): the workers never reached this task, or training "
                                  "had ended before it was started again");
  LOG(WARNING) << "ps task " << options_.task_index << ": " << outcome_.message;
  finished_ = true;
  cv_.SignalAll();
}

void ParameterServer::Impl::FinishAfterEndLocked() {
  std::vector<int> reported, silent;
  for (int w = 0; w < options_.num_workers; ++w) (members_.done(w) ? reported : silent).push_back(w);
  outcome_ = TrainingOutcome();
  outcome_.succeeded = true;
  outcome_.global_step = ended_step_;
  std::string message = absl::StrCat("training reached step ", ended_step_, " while this task was down (worker",
                                     reported.size() > 1 ? "s " : " ", absl::StrJoin(reported, ", "),
                                     " reported done to it after its restart");
  if (!silent.empty()) absl::StrAppend(&message, "; ", absl::StrJoin(silent, ", "), " had reported before");
  message += ")";
  if (!checkpointing()) {
    message += "; it keeps no checkpoints";
  } else {
    // A directory listing under mu_: once, when the task ends, with nothing left to serve.
    absl::StatusOr<std::vector<CheckpointFile>> files =
        ListCheckpointFiles(options_.checkpoint.env, options_.checkpoint.dir);
    int64_t newest = -1;
    for (const CheckpointFile& f : files.ok() ? *files : std::vector<CheckpointFile>{}) {
      if (f.task == options_.task_index && f.num_ps == options_.num_ps) newest = std::max(newest, f.step);
    }
    if (!files.ok()) {
      final_checkpoint_status_ = files.status();
    } else if (newest >= ended_step_) {
      absl::StrAppend(&message, "; its newest checkpoint, step ", newest, ", holds the end");
    } else {
      final_checkpoint_status_ = absl::DataLossError(absl::StrCat(
          "training reached step ", ended_step_, " while ps task ", options_.task_index,
          " was down, and its newest ", newest < 0 ? std::string("checkpoint: none") : absl::StrCat("checkpoint is step ", newest),
          ": the updates of its variables since then were lost with the killed process (resume from the newest "
          "checkpoint every task holds)"));
    }
  }
  outcome_.message = std::move(message);
  LOG(INFO) << "ps task " << options_.task_index << ": " << outcome_.message;
  finished_ = true;
  cv_.SignalAll();
}

void ParameterServer::Impl::LeaseLoop() {
  SetFlushDenormals();  // deciding a step here applies it here
  const absl::Duration every =
      std::clamp(options_.worker_timeout > absl::ZeroDuration() ? options_.worker_timeout / 4
                                                                 : options_.registration_timeout / 4,
                 absl::Milliseconds(20), absl::Seconds(1));
  absl::MutexLock lock(&lease_mu_);
  while (!stopping_) {
    lease_mu_.AwaitWithTimeout(absl::Condition(&stopping_), every);
    if (stopping_) break;
    lease_mu_.Unlock();
    CheckLeases();
    lease_mu_.Lock();
  }
}

void ParameterServer::Impl::AfterWorkersLeft(std::optional<StepDecision> decided, int64_t epoch) {
  std::vector<CheckpointData> saves;
  if (decided) ApplyDecision(*decided, epoch, &saves);  // before the final checkpoint below
  bool finish_after_write = false;
  {
    // The final checkpoint is copied between updates, at the step the values hold.
    absl::MutexLock apply_lock(&apply_mu_);
    absl::MutexLock lock(&mu_);
    const bool ending = members_.all_ended() && !finished_ && !final_save_started_;
    if (ending && !configured_ && ended_step_ >= 0) {
      FinishAfterEndLocked();  // restarted after the end: nothing of its own to save
    } else if (ending) {
      TrainingOutcome& o = outcome_;
      o.global_step = sync_ ? applied_through_ : CheckpointLabel();
      o.lost_workers = members_.lost_workers();
      // A worker completes when the global step reaches train_steps: ps tasks other than 0 only estimate it.
      o.succeeded = members_.any_completed();
      for (const WorkerStats& w : members_.AllStats()) {
        if (w.done && w.failed) o.failed_workers.push_back(w.worker_id);
      }
      std::vector<std::string> what;
      if (!o.lost_workers.empty()) {
        what.push_back(absl::StrCat("worker", o.lost_workers.size() > 1 ? "s " : " ", absl::StrJoin(o.lost_workers, ", "),
                                    " lost (no contact for ", absl::FormatDuration(options_.worker_timeout), ")"));
      }
      if (!o.failed_workers.empty()) {
        what.push_back(absl::StrCat("worker", o.failed_workers.size() > 1 ? "s " : " ",
                                    absl::StrJoin(o.failed_workers, ", "), " stopped on an error"));
      }
      const std::string of = config_.train_steps > 0 ? absl::StrCat(" of ", config_.train_steps) : "";
      o.message = o.succeeded ? absl::StrCat("training reached step ", o.global_step, of, what.empty() ? "" : "; ",
                                             absl::StrJoin(what, "; "))
                              : absl::StrCat("training stopped at step ", o.global_step, of,
                                             ": no worker is left to complete it",
                                             what.empty() ? "" : absl::StrCat(" (", absl::StrJoin(what, "; "), ")"));
      // A last delta of the final state, so that serving ends where training did (nothing when the last delta
      // was of this step).
      if (deltas() && configured_ && initialized_) TakeDeltaLocked(o.global_step, sync_ ? o.global_step : step_);
      if ((checkpointing() || deltas()) && configured_ && initialized_) {
        final_save_started_ = true;
        finish_after_write = true;
        const int64_t label = o.global_step;
        // Saved again unless this step is on disk already, or about to be written by this very call (a periodic
        // save of the same step that failed, or runs on another thread, does not count).
        const bool pending_here = !saves.empty() && saves.back().global_step == label;
        if (checkpointing() && label != written_label_ && !pending_here) {
          saves.push_back(SnapshotLocked(label, sync_ ? label : step_));
        }
      } else {
        finished_ = true;
      }
    }
    cv_.SignalAll();
  }
  const absl::Status saved = WriteCheckpoints(std::move(saves));
  if (finish_after_write && deltas()) {
    delta_writer_->Flush();  // every delta taken is on disk before the task may exit
    LOG(INFO) << "ps task " << options_.task_index << ": " << delta_writer_->written() << " deltas written ("
              << delta_writer_->bytes_written() << " bytes, " << delta_writer_->write_seconds() << " s on the writer's "
              << "thread), " << delta_writer_->failed() << " failed";
  }
  if (finish_after_write) {
    // Only now: a finished server may exit, and the final checkpoint must be on disk by then (or its failure
    // known, for the exit code).
    absl::MutexLock lock(&mu_);
    final_checkpoint_status_ = saved;
    finished_ = true;
    cv_.SignalAll();
  }
}

absl::StatusOr<TrainingStats> ParameterServer::Impl::GetStats() {
  absl::MutexLock lock(&mu_);
  TrainingStats stats;
  stats.global_step = step_;
  stats.workers = members_.AllStats();
  if (configured_ && !sync_) stats.staleness_histogram = gate_->histogram();
  if (configured_) stats.max_staleness_seen = gate_->max_staleness_seen();
  stats.bytes_received = bytes_received_;
  stats.bytes_sent = bytes_sent_;
  if (configured_) stats.tables = sparse_->Stats();
  return stats;
}

bool ParameterServer::Impl::finished() const {
  absl::MutexLock lock(&mu_);
  return finished_;
}

TrainingOutcome ParameterServer::Impl::outcome() const {
  absl::MutexLock lock(&mu_);
  return outcome_;
}

bool ParameterServer::Impl::WaitUntilFinished(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (!finished_) {
    if (cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  return finished_;
}

int64_t ParameterServer::Impl::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

// ---- checkpoints ----------------------------------------------------------------------------------------------

// The step a checkpoint taken now belongs to: the task's step, except on a non-zero task in async mode, whose
// own step counts its updates: there, the newest global step seen in pushes.
int64_t ParameterServer::Impl::CheckpointLabel() const { return sync_ || coordinator() ? step_ : step_hint_; }

CheckpointData ParameterServer::Impl::StateLocked(int64_t label, int64_t task_step, bool tables) const {
  CheckpointData d;
  d.task_index = options_.task_index;
  d.num_ps = options_.num_ps;
  d.global_step = label;
  d.task_step = task_step;
  d.model_signature = config_.model_signature;
  d.optimizer = config_.optimizer.name;
  d.num_slots = store_->optimizer().num_slots();
  d.has_moving_averages = store_->has_moving_averages();
  d.slices = store_->ExportState();
  if (!d.has_moving_averages) {
    for (SliceState& s : d.slices) s.moving_average.clear();
  }
  if (!config_.tables.empty()) {
    d.sparse_optimizer = config_.sparse_optimizer.name;
    d.sparse_num_slots = sparse_->optimizer().num_slots();
    if (tables) d.tables = sparse_->ExportState();
  }
  return d;
}

CheckpointData ParameterServer::Impl::SnapshotLocked(int64_t label, int64_t task_step) {
  CheckpointData d = StateLocked(label, task_step);
  if (coordinator()) d.input_positions = members_.InputPositionsBefore(label);
  checkpoints_.Saved(label);
  return d;
}

absl::Status ParameterServer::Impl::WriteCheckpoints(std::vector<CheckpointData> saves) {
  absl::Status newest;
  for (const CheckpointData& d : saves) {
    newest = writer_->Save(d);
    if (newest.ok()) {
      if (deltas()) delta_writer_->NoteSnapshot(d.global_step);
      absl::MutexLock lock(&mu_);
      written_label_ = std::max(written_label_, d.global_step);
    }
  }
  return newest;
}

// ---- state trained outside the ps -------------------------------------------------------------------------

absl::StatusOr<CheckpointData> ParameterServer::Impl::ExportState() {
  absl::MutexLock apply_lock(&apply_mu_);  // between updates
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckReady());
  return StateLocked(step_, step_);
}

bool ParameterServer::Impl::CheckpointDue(int64_t step) {
  absl::MutexLock lock(&mu_);
  return checkpointing() && configured_ && checkpoints_.Due(step).has_value();
}

absl::Status ParameterServer::Impl::ImportState(int64_t step, const std::vector<SliceState>& slices,
                                                bool save) {
  std::vector<CheckpointData> saves;
  {
    absl::MutexLock apply_lock(&apply_mu_);
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckReady());
    if (step < 0) return absl::InvalidArgumentError(absl::StrCat("ImportState at negative step ", step));
    RETURN_IF_ERROR(store_->ImportState(slices, step));
    sparse_->SetVersion(step);  // the tables keep their rows
    step_ = step;
    step_hint_ = step;
    applied_through_ = step;
    coordinator_->StartAt(step);
    if (save && checkpointing()) saves.push_back(SnapshotLocked(step, step));
    cv_.SignalAll();
  }
  WriteCheckpoints(std::move(saves)).IgnoreError();  // logged by the writer; training goes on
  return absl::OkStatus();
}

// ---- deltas and the expiry clock -------------------------------------------------------------------------

bool ParameterServer::Impl::DeltaDueLocked() {
  if (!deltas()) return false;
  const int64_t step = CheckpointLabel();
  const bool by_time = options_.delta.every_secs > 0 &&
                       Now() - last_delta_time_ >= absl::Seconds(options_.delta.every_secs);
  const bool by_steps = options_.delta.every_steps > 0 && step - last_delta_step_ >= options_.delta.every_steps;
  // By time, a delta waits while the previous one is still being written (training does not wait for the disk);
  // by steps, it is taken at its step whatever it costs (the steps of deltas are then known in advance).
  if (!by_steps && (!by_time || delta_writer_->busy())) return false;
  last_delta_time_ = Now();
  last_delta_step_ = step;
  return true;
}

void ParameterServer::Impl::TakeDeltaLocked(int64_t label, int64_t task_step) {
  if (!deltas()) {
    LOG_FIRST_N(WARNING, 1) << "ps task " << options_.task_index << ": ps task 0 took a delta at step " << label
                            << ", but this task writes none (no --delta_every_secs): serving lacks its part";
    return;
  }
  if (label <= delta_prev_step_) return;  // nothing new since the last one (an async task between pushes)
  DeltaData d;
  d.prev_step = delta_prev_step_;
  d.state = StateLocked(label, task_step, /*tables=*/false);
  if (coordinator()) d.state.input_positions = members_.InputPositionsBefore(label);
  if (!config_.tables.empty()) sparse_->TakeChanges(&d.state.tables, &d.removed);
  delta_prev_step_ = label;
  delta_writer_->Submit(std::move(d));  // written on the writer's thread (waits if one is still queued)
}

void ParameterServer::Impl::RestoredLocked(int64_t step) {
  delta_prev_step_ = step;
  last_delta_step_ = step;
  last_delta_time_ = Now();
  sparse_->SetClock(step);
  if (!options_.delta.dir.empty()) {
    RemoveDeltasAfter(options_.checkpoint.env, options_.delta.dir, options_.task_index, options_.num_ps, step)
        .IgnoreError();  // logged there
  }
}

void ParameterServer::Impl::AdvanceSparseClock(int64_t step) {
  sparse_->SetClock(step);
  const int64_t expired = sparse_->MaybeExpire();
  if (expired > 0) VLOG(1) << "ps task " << options_.task_index << ": " << expired << " rows expired at step " << step;
}

}  // namespace dtrain::ps
