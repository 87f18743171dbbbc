// ParameterServer, its life: registration (adopting the chief's config, restoring a checkpoint), probe and restore
// (the chief's rollback of every task to a common step), membership (done, heartbeats, leases) and the end of
// training. The rest: parameter_server.cc (the public class), _uploads.cc, _push.cc, _sync.cc, _pull.cc, _control.cc
// (dtrain_ctl's commands, the elastic plan and the ps set), _state.cc (checkpoints, deltas); the design and the lock
// order: parameter_server_impl.h.
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

// " resharded from N ps tasks onto M" for the log line of a checkpoint written by another number of tasks.
std::string Resharded(int from, int num_ps) {
  return from > 0 ? absl::StrCat(" resharded from ", from, " ps task", from > 1 ? "s" : "", " onto ", num_ps) : "";
}

}  // namespace

// ---- register, probe, restore ---------------------------------------------------------------------------------

absl::Status ParameterServer::Impl::ConfigureLocked(const TrainConfig& config, int chief) {
  RETURN_IF_ERROR(ValidateTrainConfig(config, options_.num_workers));
  RETURN_IF_ERROR(CheckElasticConfig(config, slots()));
  int64_t bytes = 0;
  for (const SliceSpec& s : config.slices) bytes += s.length * static_cast<int64_t>(sizeof(float));
  if (bytes > options_.max_model_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the model's slices on ps task ", task_index(), " take ",
                                                     bytes, " bytes, more than --max_model_bytes=",
                                                     options_.max_model_bytes));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SliceStore> store,
                   SliceStore::Create(config.slices, config.optimizer, config.moving_average_decay));
  store->set_apply_threads(options_.apply_threads);
  // Without tables the sparse optimizer is not used (and may be unset): an empty store with the defaults.
  SparseStoreOptions sparse_options;
  sparse_options.task_index = task_index();
  sparse_options.num_ps = num_ps();
  sparse_options.max_rows_cap = options_.sparse_max_rows;
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
                                                     "task ", task_index(), " take up to ", bytes,
                                                     " bytes, more than --max_model_bytes=", options_.max_model_bytes));
  }
  sparse->SetVersion(step_);
  config_ = config;
  sync_ = config_.mode == "sync";
  sparse_async_ = sync_ && config_.sparse_mode == "async";
  store_ = std::move(store);
  sparse_ = std::move(sparse);
  buffers_ = std::make_unique<GradientBuffers>(slots(), *store_, sparse_.get());
  coordinator_ = std::make_unique<SyncCoordinator>(ReplicasToAggregateLocked());
  coordinator_->StartAt(step_);
  gate_ = std::make_unique<StalenessGate>(slots(), config_.max_staleness);
  applied_through_ = step_;
  chief_ = chief;
  members_.StartLeases(Now(), step_);
  configured_ = true;
  StartElasticLocked();
  // A worker refused before the chief registered (it reported its bad flags) fails a run that needs it.
  for (int w = 0; w < slots() && job_ended_.empty(); ++w) {
    if (!members_.done(w) || members_.stats(w).leaving != Leaving::kRefused) continue;
    DoneRequest refused;
    refused.worker_id = w;
    refused.leaving = Leaving::kRefused;
    refused.reason = members_.stats(w).reason;
    const std::string why = WhyLeavingEndsRunLocked(refused);
    if (!why.empty()) EndRunLocked(why);
  }
  LOG(INFO) << "ps task " << task_index() << ": adopted the config of chief worker " << chief_ << " ("
            << config_.mode << ", " << config_.num_workers << " workers"
            << (slots() > config_.num_workers ? absl::StrCat(" (up to ", slots(), ")") : "")
            << (config_.elastic_batch.empty() ? ""
                : config_.elastic_batch == "global"
                    ? absl::StrCat(", elastic: global batches of ", config_.global_batch, " in parts of ",
                                   config_.batch_unit)
                    : absl::StrCat(", elastic ", config_.elastic_batch, " batches of ", config_.batch_unit))
            << ", R=" << (config_.elastic_batch.empty() || config_.replicas_to_aggregate > 0
                              ? absl::StrCat(ResolvedReplicasToAggregate(config_))
                              : std::string("the workers'"))
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
  RETURN_IF_ERROR(CheckNotOver());  // e.g. a chief restarted just after the others completed
  if (!configured_) last_contact_ = Now();
  RETURN_IF_ERROR(CheckRunning());  // a worker waiting for a chief that failed hears it at once
  if (OtherPsSet(request.config)) {
    // The worker missed a change of the ps tasks (or was started with an old --ps_hosts): ps 0 tells it the set;
    // another task has it wait (it registers with ps 0 first, and learns it there).
    const PsSet set = coordinator() ? ps_plan_.View(step_) : PsSet{};
    if (set.version > 0 && static_cast<int>(set.hosts.size()) == num_ps()) return PsSetChangedError(set);
    // The worker heard of a change the job does not run on: ps 0 decided it, died before the chief moved the
    // state, and the chief restored the job on the set it knew (the change died with ps 0; a --join task asks
    // again). The worker goes back to the job's set.
    if (coordinator() && configured_ && !ps_plan_.pending() && request.config.ps_version > ps_plan_.version() &&
        static_cast<int>(ps_plan_.hosts().size()) == num_ps()) {
      PsSet now;
      now.version = ps_plan_.version();
      now.hosts = ps_plan_.hosts();
      LOG(WARNING) << "ps task 0: worker " << request.worker_id << " runs on version " << request.config.ps_version
                   << " of the ps tasks (" << request.config.num_ps << "), which the job does not (a change lost "
                   << "with a restart of ps 0): it goes back to version " << now.version << " ("
                   << absl::StrJoin(now.hosts, ",") << ")";
      return PsSetChangedError(now);
    }
    // A mismatch of the spec's lists (no change ever made, or ps 0 runs the job); a ps 0 that restarted after a
    // change waits for the chief, whose config names the set it adopts.
    if (coordinator() && set.version == 0 && (configured_ || request.config.ps_version == 0)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", request.worker_id, " places the variables on ", request.config.num_ps, " ps tasks, but the job "
          "has ", num_ps(), " (--ps_hosts must list the same tasks on every process)"));
    }
    // Another task, still on the set it was started with, and a worker whose set never changed either (ps 0,
    // which it registered with first, took its config as the job's): the spec's lists differ, and no move is
    // coming to settle it. (A task that moved ahead of ps 0 in a change, or a worker of a changed set, waits.)
    if (!coordinator() && request.config.ps_version == 0 && num_ps() == options_.num_ps) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", request.worker_id, " places the variables on ", request.config.num_ps, " ps tasks, but ps task ",
          task_index(), " was started among ", num_ps(),
          " (--ps_hosts must list the same tasks on every process)"));
    }
    return absl::UnavailableError(absl::StrCat("ps task ", task_index(), " runs among ", num_ps(),
                                               " ps tasks, worker ", request.worker_id, "'s config says ",
                                               request.config.num_ps, ": waiting for the job to move"));
  }
  if (coordinator() && saved_for_move_) {
    // An async job cut for a move (its pushes would be refused): the worker moves with the others.
    return PsSetChangedError(ps_plan_.View(step_));
  }
  if (!configured_) {
    if (!request.is_chief) {
      if (ended_step_ >= 0) {
        // A worker reported to this process that training reached its last step (this task restarted after it):
        // the chief has reported done and will not register again, so nothing is left for this worker to do.
        return RunOverError(RunOutcome::kComplete, ended_step_,
                            absl::StrCat("run complete: training reached step ", ended_step_, " while ps task ",
                                         task_index(), " was down (reported to it after its restart)"));
      }
      return absl::UnavailableError(absl::StrCat("ps task ", task_index(),
                                                 " is waiting for the chief to register its config (worker ",
                                                 request.worker_id, " is not the chief)"));
    }
    // Restore before adopting anything, so a refused checkpoint leaves the task waiting for a chief.
    RETURN_IF_ERROR(ValidateTrainConfig(request.config, options_.num_workers));
    RETURN_IF_ERROR(CheckElasticConfig(request.config, slots()));
    ASSIGN_OR_RETURN(std::optional<RestorableCheckpoint> restored,
                     FindStateToRestore(options_.checkpoint.env, options_.checkpoint.dir, options_.delta.dir,
                                        request.config, task_index(), num_ps(), request.restore_step));
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
      RestoreElasticCursorLocked(restored->data.input_positions);
      RestoredLocked(restored->data.global_step);
      initialized_ = true;
      if (journal_) {
        if (restored->resharded_from > 0) {
          journal_->Resharded(restored->data.global_step, restored->resharded_from);
        } else {
          journal_->Restored(restored->data.global_step);
        }
      }
      LOG(INFO) << "ps task " << task_index() << ": restored " << restored->path
                << Resharded(restored->resharded_from, num_ps()) << " (step " << restored->data.global_step
                << ", " << restored->data.slices.size() << " slices" << SparseRowsRestored(restored->data.tables)
                << ")";
    }
  } else {
    RETURN_IF_ERROR(CompareTrainConfigs(config_, request.config, request.worker_id));
    if (request.is_chief && request.worker_id != chief_) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", request.worker_id,
                                                        " registers as chief, but the chief is worker ", chief_));
    }
  }
  const bool was_lost = members_.lost(request.worker_id);
  // An elastic job takes back a worker that left before the end (a scheduler's scale-down, then up again).
  const bool rejoins = !config_.elastic_batch.empty() && members_.Rejoin(request.worker_id);
  const bool joins = !members_.present(request.worker_id) || rejoins;
  const std::vector<int> active_before = members_.active_workers();
  RegisterResponse response{initialized_, step_, members_.Register(request.worker_id, Now(), step_),
                            absl::ToInt64Milliseconds(options_.worker_timeout),
                            members_.ResumeInputPosition(request.worker_id)};
  response.max_workers = slots();
  if (elastic_ != nullptr) {
    response.join_step = elastic_->Join(request.worker_id, step_, active_before);
    MembershipChangedLocked();
  }
  if (joins) {
    LOG(INFO) << "ps task " << task_index() << ": worker " << request.worker_id << " joins the running job at "
              << "step " << step_ << (response.join_step > step_ ? absl::StrCat(" (it counts from step ",
                                                                                  response.join_step, ")")
                                                                   : "")
              << "; " << members_.num_active() << " active";
  }
  if (was_lost) {
    LOG(INFO) << "ps task " << task_index() << ": worker " << request.worker_id
              << " is back (registered again after it was declared lost; " << members_.num_active() << " active)";
  }
  cv_.SignalAll();  // a worker that comes back counts as active again
  return response;
}

absl::StatusOr<CheckpointProbe> ParameterServer::Impl::Probe(const TrainConfig& config) {
  CheckpointProbe probe;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckNotOver());
    probe.configured = configured_;
    probe.initialized = initialized_;
    probe.step = step_;
    probe.first_relayable_step = coordinator_ != nullptr ? coordinator_->FirstRelayableStep(step_) : step_;
    probe.num_ps = num_ps();
    // A config for another number of tasks is the chief's move of the job (Restore): the same model, other slices.
    if (configured_) RETURN_IF_ERROR(CompareModelLocked(config, 0));
  }
  const int num_ps_probed = config.num_ps != 0 ? config.num_ps : probe.num_ps;
  if (!restorable()) return probe;
  // Every checkpoint of this task that reads back valid and fits the config, its own files or complete ones of
  // another number of ps tasks (resharded); read outside the lock: it takes time.
  if (checkpointing()) {
    ASSIGN_OR_RETURN(probe.restorable_steps, RestorableSteps(options_.checkpoint.env, options_.checkpoint.dir,
                                                             config, IndexIn(config), num_ps_probed));
  }
  if (num_ps_probed != probe.num_ps) return probe;  // a move: from checkpoints alone (deltas are refused then)
  // And the steps of the deltas that chain from them (or from a fresh start).
  ASSIGN_OR_RETURN(const std::vector<int64_t> by_deltas,
                   DeltaStepsReachable(options_.checkpoint.env, options_.delta.dir, task_index(),
                                       num_ps(), probe.restorable_steps));
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
    return absl::FailedPreconditionError(absl::StrCat("ps task ", task_index(),
                                                      " has no --checkpoint_dir: it cannot restore step ", step));
  }
  // A config for another number of ps tasks: the chief moves the job onto them (a change of the ps set,
  // ps_set_plan.h): this task takes its new share from the checkpoint of `step` that every old task wrote.
  // A task before this one left: this one (the last) takes its index (IndexIn: its address in the job's hosts).
  const int index = IndexIn(config);
  const bool move = OtherPsSet(config) || index != task_index();
  if (move && (index >= config.num_ps || deltas())) {
    return absl::FailedPreconditionError(
        index >= config.num_ps
            ? absl::StrCat("ps task ", task_index(), " has no place among ", config.num_ps, " ps tasks")
            : absl::StrCat("ps task ", task_index(), " keeps deltas (--delta_dir): a live change of the ps "
                           "tasks is not built for them"));
  }
  // Read and check the file first (or reshard a checkpoint of another number of ps tasks; or an earlier
  // checkpoint and the deltas up to that step): a bad one leaves the task as it was.
  RestorableCheckpoint restorable;
  if (options_.delta.dir.empty() || move) {
    ASSIGN_OR_RETURN(restorable, ReadCheckpointForTask(options_.checkpoint.env, options_.checkpoint.dir, step, config,
                                                       index, move ? config.num_ps : num_ps()));
  } else {
    TrainConfig exact = config;
    exact.mode = "sync";  // that step or nothing, whatever the mode
    ASSIGN_OR_RETURN(std::optional<RestorableCheckpoint> found,
                     FindStateToRestore(options_.checkpoint.env, options_.checkpoint.dir, options_.delta.dir, exact,
                                        task_index(), num_ps(), step));
    if (!found.has_value()) {
      return absl::NotFoundError(absl::StrCat("ps task ", task_index(),
                                              " has no checkpoint or deltas to restore step ", step));
    }
    restorable = *std::move(found);
  }
  const std::string path = restorable.path;
  const CheckpointData& data = restorable.data;
  std::shared_ptr<Cancellation> ended;
  {
    absl::MutexLock apply_lock(&apply_mu_);
    absl::MutexLock lock(&mu_);
    int moved_from = 0, moved_from_index = task_index();
    if (move) {
      if (configured_) RETURN_IF_ERROR(CompareModelLocked(config, worker_id));
      if (coordinator()) {
        // The announced move; or, on a ps 0 that restarted after a change (it started with the spec's set), the
        // set the chief's config names.
        RETURN_IF_ERROR(ps_plan_.pending() || config.ps_version == 0
                            ? ps_plan_.Moved(config.num_ps, data.global_step)
                            : ps_plan_.Adopt(config.ps_hosts, config.ps_version, config.num_ps));
      }
      moved_from = num_ps();
      moved_from_index = task_index();
      num_ps_.store(config.num_ps, std::memory_order_release);
      task_index_.store(index, std::memory_order_release);
      configured_ = false;  // configured again below with this task's new slices (and its shard of the rows)
      if (journal_) {
        absl::StatusOr<std::unique_ptr<AppliedJournal>> j = AppliedJournal::Open(
            options_.checkpoint.env, options_.checkpoint.dir, task_index(), config.num_ps);
        if (j.ok()) {
          old_journals_.push_back(std::exchange(journal_, *std::move(j)));
        } else {
          LOG(ERROR) << "ps task " << task_index() << ": cannot open a journal for " << config.num_ps
                     << " ps tasks (" << j.status() << "): the old one goes on";
        }
      }
    }
    if (!configured_) {
      step_ = data.task_step;
      absl::Status configured = ConfigureLocked(config, worker_id);
      if (!configured.ok() && moved_from > 0) {
        num_ps_.store(moved_from, std::memory_order_release);
        task_index_.store(moved_from_index, std::memory_order_release);
      }
      RETURN_IF_ERROR(configured);
    } else {
      RETURN_IF_ERROR(CompareTrainConfigs(config_, config, worker_id));
    }
    if (moved_from > 0) {
      LOG(WARNING) << "ps task " << task_index() << ": the job moved from " << moved_from << " onto "
                   << config.num_ps << " ps tasks at step " << data.global_step
                   << (moved_from_index != task_index()
                           ? absl::StrCat(" (this task was ps task ", moved_from_index, " of ", moved_from,
                                          ": a task before it left, and it takes that one's place)")
                           : std::string());
    }
    ASSIGN_OR_RETURN(const SparseStore::CheckedState tables, sparse_->CheckState(data.tables));
    RETURN_IF_ERROR(store_->ImportState(data.slices, data.task_step));
    sparse_->ImportChecked(tables, data.task_step);
    const int64_t was = step_;
    step_ = data.task_step;
    step_hint_ = data.global_step;
    initialized_ = true;
    saved_for_move_ = false;  // an async move's cut ends with its restore (or a rollback)
    stopped_for_move_.clear();
    applied_through_ = step_;
    coordinator_ = std::make_unique<SyncCoordinator>(ReplicasToAggregateLocked());
    coordinator_->StartAt(step_);
    gate_ = std::make_unique<StalenessGate>(slots(), config_.max_staleness);
    std::fill(complete_step_.begin(), complete_step_.end(), -1);
    for (size_t w = 0; w < pending_accepted_.size(); ++w) {  // gradients of the old epoch: never applied
      if (pending_accepted_[w]) ++accounting_.discarded;
      pending_accepted_[w] = false;
    }
    checkpoints_.Saved(data.global_step);
    written_label_ = data.global_step;
    members_.RestoreInputPositions(data.input_positions, data.global_step);
    RestoreElasticCursorLocked(data.input_positions);
    if (journal_) {
      if (restorable.resharded_from > 0) {
        journal_->Resharded(data.global_step, restorable.resharded_from);
      } else {
        journal_->Restored(data.global_step);
      }
    }
    RestoredLocked(data.global_step);
    ended = NewEpochLocked();
    LOG(WARNING) << "ps task " << task_index() << ": restored " << path
                 << Resharded(restorable.resharded_from, num_ps()) << " on the chief's request (was at step "
                 << was << ", now " << step_ << SparseRowsRestored(data.tables) << "); every worker registers again";
  }
  // Outside the locks: the callbacks of the pulls waiting in the old epoch take mu_ to wake them.
  ended->Cancel();
  return absl::OkStatus();
}

std::shared_ptr<Cancellation> ParameterServer::Impl::NewEpochLocked() {
  members_.ResetSessions(Now(), step_);
  // A tentative update of the old epoch is not part of any state (a restore dropped it already).
  if (tentative_.writer != 0 && store_) {
    for (int i = 0; i < store_->num_slices(); ++i) store_->UndoTentative(i);
  }
  tentative_ = Tentative{};
  if (tentative_note_.state == TentativeNote::kOpen) {
    tentative_note_.state = TentativeNote::kUndone;
    undone_writer_.store(tentative_note_.writer);
  }
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
        absl::StrCat("ps task ", task_index(), " has no config yet: waiting for the chief to register"));
  }
  if (!initialized_) {
    return absl::UnavailableError(
        absl::StrCat("ps task ", task_index(), " is not initialized yet: waiting for the chief"));
  }
  return absl::OkStatus();
}

// ---- membership: done, heartbeats, leases, the end --------------------------------------------------------------

absl::Status ParameterServer::Impl::Done(const DoneRequest& request) {
  const int worker_id = request.worker_id;
  std::optional<StepDecision> decided;
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(members_.CheckWorker(worker_id));
    RETURN_IF_ERROR(members_.CheckLeave(worker_id, request.session));
    last_contact_ = Now();
    const bool completed = request.leaving == Leaving::kCompleted;
    if (!configured_ && completed && !members_.done(worker_id)) {
      // Training ended while this task was down (it restarted after the last step): see CheckUnconfiguredLocked.
      ended_step_ = std::max({ended_step_, request.global_step, int64_t{0}});
    }
    const int64_t at = request.global_step > 0 ? request.global_step : (configured_ ? CheckpointLabel() : step_);
    if (members_.MarkDone(worker_id, request.leaving, at, request.reason)) {
      if (completed) {
        LOG(INFO) << "ps task " << task_index() << ": worker " << worker_id << " is done ("
                  << members_.num_done() << " of " << members_.present_workers().size() << ")";
      } else {
        LOG(WARNING) << "ps task " << task_index() << ": worker " << worker_id << " left ("
                     << LeavingName(request.leaving) << " at step " << at
                     << (request.reason.empty() ? "" : absl::StrCat(": ", request.reason)) << "; "
                     << members_.num_active() << " of " << members_.present_workers().size() << " still active)";
      }
      if (!completed) MembershipChangedLocked();
      if (job_ended_.empty()) {
        const std::string why = WhyLeavingEndsRunLocked(request);
        if (!why.empty()) EndRunLocked(why);
      }
    }
    if (configured_ && sync_ && coordinator() && job_ended_.empty()) decided = DecideLocked();
    epoch = epoch_;
    cv_.SignalAll();
  }
  AfterWorkersLeft(std::move(decided), epoch);
  return absl::OkStatus();
}

std::string ParameterServer::Impl::WhyLeavingEndsRunLocked(const DoneRequest& r) const {
  const int w = r.worker_id;
  const bool chief = w == (chief_ >= 0 ? chief_ : 0);  // before a chief registered: worker 0, the chief to be
  const std::string who = chief ? absl::StrCat("the chief (worker ", w, ")") : absl::StrCat("worker ", w);
  const std::string because = r.reason.empty() ? "" : absl::StrCat(": ", r.reason);
  const int64_t at = r.global_step > 0 ? r.global_step : step_;
  switch (r.leaving) {
    case Leaving::kCompleted:
      return "";
    case Leaving::kStopped:
      return chief ? absl::StrCat(who, " was stopped at step ", at, because) : "";
    case Leaving::kFailed:
      return chief ? absl::StrCat(who, " failed at step ", at, because) : "";
    case Leaving::kRefused:
      if (chief) return absl::StrCat(kConfigurationRefused, who, because);
      if (configured_ && sync_ && config_.elastic_batch.empty() &&
          ResolvedReplicasToAggregate(config_) >= options_.num_workers) {
        return absl::StrCat(kConfigurationRefused, who, because, " (sync training aggregates every worker, R = ",
                            options_.num_workers, ": the run cannot complete without it)");
      }
      return "";
    case Leaving::kPeerFailed:
      return r.reason.empty() ? absl::StrCat(who, " stopped: the run ended elsewhere") : r.reason;
  }
  return "";
}

absl::Status ParameterServer::Impl::CompareModelLocked(const TrainConfig& config, int worker_id) const {
  if (!OtherPsSet(config)) return CompareTrainConfigs(config_, config, worker_id);
  TrainConfig same = config;  // placed on another number of tasks: its slices differ, the rest must not
  same.slices = config_.slices;
  same.num_ps = config_.num_ps;
  return CompareTrainConfigs(config_, same, worker_id);
}

void ParameterServer::Impl::EndRunLocked(const std::string& why) {
  job_ended_ = why;
  LOG(WARNING) << "ps task " << task_index() << ": " << why << ": the run ends here (step " << step_
               << "); the workers still running are told to stop";
  cv_.SignalAll();  // pulls waiting for a step wake up and hear it
}

void ParameterServer::Impl::EndRun(const std::string& why) {
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    if (!job_ended_.empty() || finished_) return;
    EndRunLocked(why);
    epoch = epoch_;
  }
  AfterWorkersLeft(std::nullopt, epoch);
}

absl::StatusOr<int64_t> ParameterServer::Impl::Heartbeat(int worker_id, uint64_t session) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(members_.CheckWorker(worker_id));
  if (!configured_) last_contact_ = Now();
  RETURN_IF_ERROR(CheckRunning());
  if (!configured_) {
    return absl::AbortedError(absl::StrCat("ps task ", task_index(), " has no config (it restarted): register again"));
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
    epoch = epoch_;
    if (!configured_ || options_.worker_timeout <= absl::ZeroDuration()) {
      if (!configured_) CheckUnconfiguredLocked();
      // The run ended and nobody holds a lease: the workers that stay silent are not coming.
      const absl::Duration quiet = std::min(options_.registration_timeout, absl::Seconds(10));
      if (finished_ || job_ended_.empty() || members_.all_ended() || Now() - last_contact_ < quiet) return;
      const std::vector<int> gone = members_.ExpireAll(step_, "silent after the run ended");
      LOG(WARNING) << "ps task " << task_index() << ": no call for " << absl::FormatDuration(quiet)
                   << " after the run ended: worker" << (gone.size() > 1 ? "s " : " ") << absl::StrJoin(gone, ", ")
                   << " declared lost";
    } else {
      const std::vector<int> lost = members_.ExpireLeases(Now(), options_.worker_timeout, CheckpointLabel());
      if (lost.empty()) return;
      LOG(WARNING) << "ps task " << task_index() << ": worker" << (lost.size() > 1 ? "s " : " ")
                   << absl::StrJoin(lost, ", ") << " lost: no contact for more than "
                   << absl::FormatDuration(options_.worker_timeout) << " (" << members_.num_active()
                   << " still active)";
      MembershipChangedLocked();
      if (sync_ && coordinator() && job_ended_.empty()) decided = DecideLocked();
    }
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
  if (!job_ended_.empty() || now - unconfigured_since_ < options_.registration_timeout) return;
  outcome_ = TrainingOutcome();
  outcome_.global_step = step_;
  outcome_.message = absl::StrCat("run ended early: no chief worker registered within ",
                                  absl::FormatDuration(options_.registration_timeout),
                                  " (--registration_timeout_secs): the workers never reached this task, or training "
                                  "had ended before it was started again");
  LOG(WARNING) << "ps task " << task_index() << ": " << outcome_.message;
  finished_ = true;
  cv_.SignalAll();
}

void ParameterServer::Impl::FinishAfterEndLocked() {
  std::vector<int> reported, silent;
  for (int w : members_.present_workers()) (members_.done(w) ? reported : silent).push_back(w);
  outcome_ = TrainingOutcome();
  outcome_.kind = TrainingOutcome::Kind::kComplete;
  outcome_.succeeded = true;
  outcome_.global_step = ended_step_;
  std::string message = absl::StrCat("run complete: training reached step ", ended_step_,
                                     " while this task was down (worker", reported.size() > 1 ? "s " : " ",
                                     absl::StrJoin(reported, ", "), " reported done to it after its restart");
  if (!silent.empty()) absl::StrAppend(&message, "; ", absl::StrJoin(silent, ", "), " had reported before");
  message += ")";
  if (!checkpointing()) {
    message += "; it keeps no checkpoints";
  } else {
    // A directory listing under mu_: once, when the task ends, with nothing left to serve. This task's own file of
    // a step, or a complete checkpoint of it by another number of ps tasks (the job's ps set changed while it ran,
    // and this task restarted with the spec's).
    absl::StatusOr<std::vector<int64_t>> steps =
        CandidateSteps(options_.checkpoint.env, options_.checkpoint.dir, task_index(), num_ps());
    const int64_t newest = steps.ok() && !steps->empty() ? steps->front() : -1;
    if (!steps.ok()) {
      final_checkpoint_status_ = steps.status();
    } else if (newest >= ended_step_) {
      absl::StrAppend(&message, "; its newest checkpoint, step ", newest, ", holds the end");
    } else {
      final_checkpoint_status_ = absl::DataLossError(absl::StrCat(
          "training reached step ", ended_step_, " while ps task ", task_index(),
          " was down, and its newest ", newest < 0 ? std::string("checkpoint: none") : absl::StrCat("checkpoint is step ", newest),
          ": the updates of its variables since then were lost with the killed process (resume from the newest "
          "checkpoint every task holds)"));
    }
  }
  outcome_.message = std::move(message);
  LOG(INFO) << "ps task " << task_index() << ": " << outcome_.message;
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
  absl::Time last = absl::Now();  // real time: how late this thread wakes, whatever options_.clock says
  while (!stopping_) {
    lease_mu_.AwaitWithTimeout(absl::Condition(&stopping_), every);
    if (stopping_) break;
    lease_mu_.Unlock();
    // Woken much later than asked: this process was not running (stopped, starved, its host paused). The workers'
    // calls and heartbeats of that time are only now being read, so their silence proves nothing: renew every
    // lease instead of declaring everyone lost at once.
    const absl::Time now = absl::Now();
    const absl::Duration late = now - last - every;
    last = now;
    if (options_.worker_timeout > absl::ZeroDuration() && late > options_.worker_timeout / 2) {
      absl::MutexLock mu_lock(&mu_);
      if (configured_) {
        members_.RenewLeases(Now());
        LOG(WARNING) << "ps task " << task_index() << ": its lease checks ran " << absl::FormatDuration(late)
                     << " late (this process was not running): every worker's lease starts again";
      }
    }
    CheckLeases();
    lease_mu_.Lock();
  }
}

void ParameterServer::Impl::FinishLocked() {
  TrainingOutcome& o = outcome_;
  o = TrainingOutcome();
  o.global_step = !configured_ ? step_ : sync_ ? applied_through_ : CheckpointLabel();
  o.lost_workers = members_.lost_workers();
  const std::vector<WorkerStats> stats = members_.AllStats();
  for (const WorkerStats& w : stats) {
    if (w.done && w.failed) o.failed_workers.push_back(w.worker_id);
  }
  o.job_ended = job_ended_;
  o.kind = SummarizeRun(stats, o.global_step, configured_ ? config_.train_steps : 0, job_ended_, &o.message,
                        configured_ && !config_.elastic_batch.empty());
  o.succeeded = o.kind == TrainingOutcome::Kind::kComplete || o.kind == TrainingOutcome::Kind::kDegraded;
  finished_ = true;
}

void ParameterServer::Impl::AfterWorkersLeft(std::optional<StepDecision> decided, int64_t epoch) {
  std::vector<CheckpointData> saves;
  if (decided) ApplyDecision(*decided, epoch, &saves);  // before the final checkpoint below
  bool writing_final = false;
  {
    // The final checkpoint is copied between updates, at the step the values hold.
    absl::MutexLock apply_lock(&apply_mu_);
    absl::MutexLock lock(&mu_);
    const bool ending = (members_.all_ended() || !job_ended_.empty()) && !finished_ && !final_save_started_;
    if (ending && !configured_ && ended_step_ >= 0) {
      if (members_.all_ended()) FinishAfterEndLocked();  // restarted after the end: nothing of its own to save
    } else if (ending) {
      final_save_started_ = true;
      const int64_t final_label = sync_ ? applied_through_ : CheckpointLabel();
      // A last delta of the final state, so that serving ends where training did (nothing when the last delta
      // was of this step).
      if (deltas() && configured_ && initialized_) TakeDeltaLocked(final_label, sync_ ? final_label : step_);
      if ((checkpointing() || deltas()) && configured_ && initialized_) {
        writing_final = true;
        const int64_t label = final_label;
        // Saved again unless this step is on disk already, or about to be written by this very call (a periodic
        // save of the same step that failed, or runs on another thread, does not count).
        const bool pending_here = !saves.empty() && saves.back().global_step == label;
        if (checkpointing() && label != written_label_ && !pending_here) {
          saves.push_back(SnapshotLocked(label, sync_ ? label : step_));
        }
      } else {
        final_save_done_ = true;  // nothing to save
      }
    }
    if (!writing_final && final_save_done_ && members_.all_ended() && !finished_) FinishLocked();
    cv_.SignalAll();
  }
  const absl::Status saved = WriteCheckpoints(std::move(saves));
  if (writing_final && deltas()) {
    delta_writer_->Flush();  // every delta taken is on disk before the task may exit
    LOG(INFO) << "ps task " << task_index() << ": " << delta_writer_->written() << " deltas written ("
              << delta_writer_->bytes_written() << " bytes, " << delta_writer_->write_seconds() << " s on the writer's "
              << "thread), " << delta_writer_->failed() << " failed";
  }
  if (writing_final) {
    // Only now: a finished server may exit, and the final checkpoint must be on disk by then (or its failure
    // known, for the exit code).
    absl::MutexLock apply_lock(&apply_mu_);
    absl::MutexLock lock(&mu_);
    final_checkpoint_status_ = saved;
    final_save_done_ = true;
    if (saved.ok() && checkpointing()) {
      LOG(INFO) << "ps task " << task_index() << ": final checkpoint of step "
                << std::max(written_label_, int64_t{0}) << " saved";
    }
    if (members_.all_ended() && !finished_) FinishLocked();
    cv_.SignalAll();
  }
}

absl::StatusOr<TrainingStats> ParameterServer::Impl::GetStats() {
  absl::MutexLock lock(&mu_);
  TrainingStats stats;
  stats.global_step = step_;
  stats.checkpoint_step = checkpointing() && written_label_ > 0 ? written_label_ : -1;
  if (coordinator() && ps_plan_.changed()) stats.ps_hosts = ps_plan_.hosts();
  stats.workers = members_.AllStats();
  if (configured_ && !sync_) stats.staleness_histogram = gate_->histogram();
  if (configured_) stats.max_staleness_seen = gate_->max_staleness_seen();
  stats.bytes_received = bytes_received_;
  stats.bytes_sent = bytes_sent_;
  if (configured_) stats.tables = sparse_->Stats();
  stats.job_ended = job_ended_;
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
  // Not on cv_: it is signalled several times a step, and each wake-up of this (idle) thread took a core from
  // the threads serving the step. The condition is evaluated by whoever releases mu_, which wakes this thread
  // only once finished_ is true.
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&finished_), timeout);
  return finished_;
}

int64_t ParameterServer::Impl::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

}  // namespace dtrain::ps
