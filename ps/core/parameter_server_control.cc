// ParameterServer, steering a running job: dtrain_ctl's commands (Control: remove-worker, drain, add-ps,
// remove-ps, retire), an elastic job's plan as workers come and go, and ps 0's changes of the ps set. The rest:
// parameter_server_lifecycle.cc and its neighbours; the design and the lock order: parameter_server_impl.h.
#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {

absl::StatusOr<std::string> ParameterServer::Impl::Control(const ControlRequest& r) {
  const std::string who = r.reason.empty() ? std::string("dtrain_ctl") : r.reason;
  if (r.command == "drain") {
    int64_t step;
    bool ended;
    {
      absl::MutexLock lock(&mu_);
      ended = !job_ended_.empty() || finished_;
      step = step_;
    }
    if (ended) return absl::StrCat("ps task ", task_index(), ": the run had already ended (step ", step, ")");
    LOG(WARNING) << "ps task " << task_index() << ": drained by " << who;
    EndRun(absl::StrCat("drained by ", who, " at step ", step));  // the final checkpoint is written before it returns
    absl::MutexLock lock(&mu_);
    return absl::StrCat("ps task ", task_index(), ": drained at step ", step_,
                        checkpointing() ? (final_checkpoint_status_.ok() ? ", its state saved" : ", its save FAILED")
                                        : " (it keeps no checkpoints)",
                        "; the workers are told to stop");
  }
  if (r.command == "remove-worker") {
    if (!coordinator()) {
      return absl::StrCat("ps task ", task_index(), ": nothing to do (ps task 0 removes workers)");
    }
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(members_.CheckWorker(r.worker));
    if (!configured_) return absl::FailedPreconditionError("no job is running yet (no chief registered)");
    if (r.worker == chief_) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", r.worker, " is the chief: it cannot be removed "
                                                        "(dtrain_ctl drain ends the job, saving its state)"));
    }
    if (!members_.active(r.worker)) {
      const WorkerStats& s = members_.stats(r.worker);
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", r.worker, " is not active (",
          !members_.present(r.worker) ? "it never joined" : s.lost ? "lost" : LeavingName(s.leaving), ")"));
    }
    members_.Remove(r.worker, absl::StrCat("removed by ", who, " at step ", step_));
    LOG(INFO) << "ps task " << task_index() << ": worker " << r.worker << " removed by " << who
              << " at step " << step_ << ": it leaves at its next call";
    cv_.SignalAll();
    return absl::StrCat("worker ", r.worker, " removed at step ", step_, ": it leaves at its next call");
  }
  if (r.command == "add-ps" || r.command == "remove-ps") return ChangePsSet(r, who);
  if (r.command == "retire") return Retire(who);
  if (r.command == "stop-for-move" || r.command == "cut" || r.command == "save-for-move") return MoveAsync(r, who);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown command '", r.command,
                   "': ps tasks take remove-worker, drain, add-ps, remove-ps, retire, and a worker's "
                   "stop-for-move, cut and save-for-move"));
}

void ParameterServer::Impl::MembershipChangedLocked() {
  if (elastic_ == nullptr) return;
  const std::vector<int> active = members_.active_workers();
  if (!sync_) {
    const std::string change = elastic_->Changed(step_, active);
    if (!change.empty()) LOG(INFO) << "ps task " << task_index() << ": " << change;
    return;
  }
  if (!elastic_->global() || !job_ended_.empty()) return;
  // A global step needs every part of its batch: a plan worker gone without its commit leaves a part undone.
  bool undone = false;
  for (int w : elastic_->plan()) {
    undone |= !std::binary_search(active.begin(), active.end(), w) && !coordinator_->HasCommitted(w);
  }
  if (!undone) return;
  const std::string change = elastic_->Replan(step_, active);
  if (change.empty()) return;
  for (int w : coordinator_->TakePending()) {
    if (journal_) journal_->Voided(w, step_, commit_ids_[w]);
  }
  LOG(INFO) << "ps task " << task_index() << ": " << change;
}

bool ParameterServer::Impl::MustRedoLocked(int worker) const {
  return elastic_ != nullptr && sync_ && elastic_->global() && elastic_->InPlan(worker) &&
         elastic_seen_[worker] != elastic_->version() && !coordinator_->HasCommitted(worker);
}

absl::StatusOr<std::string> ParameterServer::Impl::ChangePsSet(const ControlRequest& r, const std::string& who) {
  if (!coordinator()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ps task ", task_index(), " does not change the ps tasks: ask ps task 0"));
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckRunning());
  if (finished_) return absl::FailedPreconditionError("the run is over");
  if (!configured_ || !initialized_) {
    return absl::FailedPreconditionError("no job is running yet (the chief has not initialized the ps tasks)");
  }
  if (!checkpointing()) {
    return absl::FailedPreconditionError("ps task 0 keeps no checkpoints (--checkpoint_dir): the state moves onto "
                                         "the new ps tasks through a checkpoint every task can read");
  }
  if (deltas()) {
    return absl::FailedPreconditionError("the job keeps deltas (--delta_dir): a live change of the ps tasks is not "
                                         "built for them");
  }
  std::string line;
  if (r.command == "add-ps") {
    ASSIGN_OR_RETURN(line, ps_plan_.Add(r.address));
  } else {
    ASSIGN_OR_RETURN(line, ps_plan_.Remove(r.ps));
  }
  LOG(INFO) << "ps task 0: " << line << " (asked by " << who << ", at step " << step_ << ")";
  if (!sync_) {
    // Async: the pulls announce the move from now on; each worker finishes the push in flight and stops
    // (stop-for-move), and the chief cuts the job once they all have (MoveAsync). Pulls waiting for the staleness
    // gate answer at once (a stopped worker no longer moves the slowest step).
    ps_plan_.Decided(step_);
    stopped_for_move_.clear();
    const size_t n = ps_plan_.pending_size();
    LOG(INFO) << "ps task 0: step " << step_ << ": the job moves onto " << n << " ps task" << (n == 1 ? "" : "s")
              << " where every worker has stopped pushing (an async job's cut)";
  }
  cv_.SignalAll();
  return line;
}

// An async job's move onto another set of ps tasks. Each task applies a push on its own, so the move needs a cut
// that every task's part of the checkpoint agrees on: every worker finishes the push in flight (it lands on every
// task) and says so to ps 0 (stop-for-move); once every active worker has (a worker that leaves or is lost meanwhile
// is no longer waited for), the chief's "cut" has ps 0 save its part at its step L and take no push from then on,
// and the chief has every other task of the old set save its part as checkpoint L (save-for-move). The chief then
// moves the job from L as a sync move does (every task of the new set restores L resharded, ps 0 last).
absl::StatusOr<std::string> ParameterServer::Impl::MoveAsync(const ControlRequest& r, const std::string& who) {
  if (r.command == "save-for-move") return SaveForMove(r.step, /*cut=*/false);
  if (!coordinator()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ps task ", task_index(), " does not take ", r.command, ": ask ps task 0"));
  }
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckRunning());
    if (!configured_ || sync_) {
      return absl::FailedPreconditionError(absl::StrCat(
          r.command, ": ", !configured_ ? "no job is running yet" : "the job trains in sync (its moves need no cut)"));
    }
    if (!ps_plan_.pending() && r.command == "stop-for-move") {
      // A worker that heard of the move late (it was lost meanwhile, or registered after the cut): the job moved
      // without it, and it connects to the new set.
      return absl::StrCat("ps task 0: no move of the ps tasks is under way (the job is on version ", ps_plan_.version(),
                          ")");
    }
    if (!ps_plan_.pending()) {
      return absl::FailedPreconditionError(absl::StrCat(r.command, ": no change of the ps tasks is under way"));
    }
    if (r.command == "stop-for-move") {
      RETURN_IF_ERROR(members_.CheckWorker(r.worker));
      stopped_for_move_.insert(r.worker);
      cv_.SignalAll();
      return absl::StrCat("ps task 0: worker ", r.worker, " stopped pushing at step ", step_, " for the move");
    }
  }
  VLOG(1) << "cut asked by " << who;
  return SaveForMove(-1, /*cut=*/true);
}

absl::StatusOr<std::string> ParameterServer::Impl::SaveForMove(int64_t label, bool cut) {
  std::vector<CheckpointData> saves;
  {
    absl::MutexLock apply_lock(&apply_mu_);
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckRunning());
    if (!configured_ || !initialized_ || sync_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "save-for-move: ps task ", task_index(),
          !configured_ || !initialized_ ? " holds no job's values" : " runs a sync job (its moves need no cut)"));
    }
    if (cut) {
      // ps 0 (checked and cut under the same locks as the save: no push slips in between).
      if (!ps_plan_.pending()) {
        return absl::FailedPreconditionError("cut: no change of the ps tasks is under way");
      }
      if (saved_for_move_) {
        return absl::StrCat("ps task 0: the job was cut at step ", ps_plan_.move_step(), " for the move already");
      }
      std::vector<int> waiting;
      for (int w : members_.active_workers()) {
        if (stopped_for_move_.count(w) == 0) waiting.push_back(w);
      }
      if (!waiting.empty()) {
        return absl::UnavailableError(absl::StrCat("ps task 0 waits for worker", waiting.size() == 1 ? " " : "s ",
                                                   absl::StrJoin(waiting, ","),
                                                   " to stop pushing before it cuts the job for the move"));
      }
      label = step_;
    }
    if (!checkpointing()) {
      return absl::FailedPreconditionError(
          absl::StrCat("save-for-move: ps task ", task_index(), " keeps no checkpoints (--checkpoint_dir)"));
    }
    if (label < 0 || (coordinator() && label != step_)) {
      return absl::InvalidArgumentError(absl::StrCat("save-for-move: step ", label, " is not the step ps task ",
                                                     task_index(), " is cut at (", step_, ")"));
    }
    if (coordinator()) ps_plan_.Cut(label);
    saved_for_move_ = true;  // from here on a push is refused: it would be lost with the move
    saves.push_back(SnapshotLocked(label, step_));
  }
  RETURN_IF_ERROR(WriteCheckpoints(std::move(saves)));
  LOG(INFO) << "ps task " << task_index() << ": saved its part of step " << label
            << " for the move onto other ps tasks; it takes no push until the move";
  return absl::StrCat("ps task ", task_index(), ": saved step ", label, " for the move");
}

absl::StatusOr<std::string> ParameterServer::Impl::Retire(const std::string& who) {
  std::shared_ptr<Cancellation> ended;
  std::string line;
  {
    absl::MutexLock apply_lock(&apply_mu_);
    absl::MutexLock lock(&mu_);
    line = RetireLocked(who, &ended);
  }
  if (ended != nullptr) ended->Cancel();  // outside the locks, as in Restore
  return line;
}

std::string ParameterServer::Impl::RetireLocked(const std::string& who, std::shared_ptr<Cancellation>* ended) {
  if (finished_) return absl::StrCat("ps task ", task_index(), ": the run was over already");
  outcome_ = TrainingOutcome();
  outcome_.kind = TrainingOutcome::Kind::kComplete;
  outcome_.succeeded = true;
  outcome_.global_step = step_;
  outcome_.message = absl::StrCat("ps task ", task_index(), " left the job at step ", step_,
                                  " (removed; its share lives on the other ps tasks; asked by ", who, ")");
  LOG(INFO) << "ps task " << task_index() << ": " << outcome_.message;
  finished_ = true;
  *ended = NewEpochLocked();
  return outcome_.message;
}

void ParameterServer::Impl::StartElasticLocked() {
  if (!coordinator() || config_.elastic_batch.empty()) return;
  elastic_ = std::make_unique<ElasticPlan>(sync_, config_.elastic_batch == "global", config_.batch_unit,
                                           config_.replicas_to_aggregate, config_.global_batch);
  elastic_->Start(members_.active_workers());
}

void ParameterServer::Impl::RestoreElasticCursorLocked(const std::map<int, std::string>& positions) {
  if (elastic_ == nullptr) return;
  elastic_->Start(members_.active_workers());
  auto it = positions.find(kElasticCursorKey);
  absl::Status s = elastic_->RestoreState(it == positions.end() ? "0" : it->second);
  if (!s.ok()) {
    LOG(WARNING) << "ps task " << task_index() << ": " << s.message() << ": the input starts again from "
                 << "its first batch";
    elastic_->RestoreState("0").IgnoreError();
  }
}

}  // namespace dtrain::ps
