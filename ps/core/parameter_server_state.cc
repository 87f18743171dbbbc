// ParameterServer, the task's state as files: checkpoints (what one holds, when one is due, writing them), state
// trained outside the ps (import and export), deltas and the sparse rows' expiry clock. The rest:
// parameter_server_lifecycle.cc and its neighbours; the design and the lock order: parameter_server_impl.h.
#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {

// ---- checkpoints ----------------------------------------------------------------------------------------------

// The step a checkpoint taken now belongs to: the task's step, except on a non-zero task in async mode, whose
// own step counts its updates: there, the newest global step seen in pushes.
int64_t ParameterServer::Impl::CheckpointLabel() const { return sync_ || coordinator() ? step_ : step_hint_; }

CheckpointData ParameterServer::Impl::StateLocked(int64_t label, int64_t task_step, bool tables) const {
  CheckpointData d;
  d.task_index = task_index();
  d.num_ps = num_ps();
  d.global_step = label;
  d.task_step = task_step;
  d.model_signature = config_.model_signature;
  d.model_flags = config_.model_flags;
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
  if (coordinator()) {
    d.input_positions = members_.InputPositionsBefore(label);
    if (elastic_ != nullptr) d.input_positions[kElasticCursorKey] = elastic_->SaveState();
  }
  checkpoints_.Saved(label);
  if (journal_) journal_->Checkpointed(label);
  return d;
}

absl::Status ParameterServer::Impl::WriteCheckpoints(std::vector<CheckpointData> saves) {
  absl::Status newest;
  // The journal's records of what a checkpoint holds are durable before the checkpoint is.
  if (journal_ && !saves.empty()) journal_->Sync().IgnoreError();  // logged by the journal
  for (const CheckpointData& d : saves) {
    // A checkpoint after step k is labelled k + 1: traced with the step it follows.
    TraceSpan span(Tracing(d.global_step - 1), "checkpoint write", "ps checkpoint", d.global_step - 1);
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
    LOG_FIRST_N(WARNING, 1) << "ps task " << task_index() << ": ps task 0 took a delta at step " << label
                            << ", but this task writes none (no --delta_every_secs): serving lacks its part";
    return;
  }
  if (label <= delta_prev_step_) return;  // nothing new since the last one (an async task between pushes)
  DeltaData d = delta_writer_->TakeSpare();  // the buffers of the last delta written, kept
  std::vector<SparseTableState> tables = std::move(d.state.tables);  // StateLocked below replaces the state
  d.prev_step = delta_prev_step_;
  d.state = StateLocked(label, task_step, /*tables=*/false);
  d.state.tables = std::move(tables);
  if (coordinator()) d.state.input_positions = members_.InputPositionsBefore(label);
  if (!config_.tables.empty()) sparse_->TakeChanges(&d.state.tables, &d.removed);
  delta_prev_step_ = label;
  delta_writer_->Submit(std::move(d));  // written on the writer's thread (waits if one is still queued)
  // A state a restore may come back to (checkpoint + deltas): the applied journal records it like a checkpoint,
  // in order with the updates before and after it.
  if (journal_) journal_->Checkpointed(label);
}

void ParameterServer::Impl::RestoredLocked(int64_t step) {
  delta_prev_step_ = step;
  last_delta_step_ = step;
  last_delta_time_ = Now();
  sparse_->SetClock(step);
  if (!options_.delta.dir.empty()) {
    RemoveDeltasAfter(options_.checkpoint.env, options_.delta.dir, task_index(), num_ps(), step)
        .IgnoreError();  // logged there
  }
}

void ParameterServer::Impl::AdvanceSparseClock(int64_t step) {
  sparse_->SetClock(step);
  const int64_t expired = sparse_->MaybeExpire();
  if (expired > 0) VLOG(1) << "ps task " << task_index() << ": " << expired << " rows expired at step " << step;
}

}  // namespace dtrain::ps
