// ParameterServer: a push's end (FinishPush: recorded, committed on ps 0) and the applications that do not wait
// for a sync decision: the early apply of one worker's push, async pushes, sparse rows. The design:
// parameter_server_impl.h.
#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {

// ---- early apply --------------------------------------------------------------------------------------------

bool ParameterServer::Impl::EarlyApplyLocked(const PushHeader& header) const {
  return header.apply_early && header.commit && sync_ && coordinator() && num_ps() == 1 &&
         slots() == 1 && elastic_ == nullptr && header.step == step_ && !clipping() &&
         options_.nonfinite != ParameterServerOptions::NonFinite::kSkip &&
         tentative_note_.state != TentativeNote::kOpen;
}

void ParameterServer::Impl::ApplyTentativeLocked(uint64_t writer, int64_t epoch, const PushHeader& header, int i,
                                                 const GradientBuffers::Buffer& buffer) {
  if (tentative_.writer != writer) {
    if (tentative_.writer != 0 || tentative_started_ >= writer) return;  // another's, or ours ended already
    tentative_started_ = writer;
    // Only on top of the previous step, in the epoch the upload started in, while it is the newest upload.
    if (applied_through_ != header.step || epoch_.load() != epoch || newest_writer_.load() != writer) {
      EndTentativeLocked(writer, /*confirmed=*/false);
      return;
    }
    tentative_ = Tentative{writer, header.step, header.request_id, epoch};
  }
  if (newest_writer_.load() != writer || epoch_.load() != epoch ||
      buffer.received(i) < store_->tentative_floats(i)) {  // superseded, rolled back, or a slice started again
    EndTentativeLocked(writer, /*confirmed=*/false);
    return;
  }
  int64_t zeroed = 0;
  store_->ApplyTentative(i, header.step, buffer.data(i), buffer.received(i), header.step + 1, GuardFor(buffer, i),
                         &zeroed);
  if (zeroed > 0) NoteNonFiniteAtApply(zeroed, header.step, i, absl::StrCat("worker ", header.worker_id));
}

void ParameterServer::Impl::NoteNonFiniteAtApply(int64_t zeroed, int64_t step, int i, const std::string& workers) {
  nonfinite_at_apply_ += zeroed;
  LOG(ERROR) << "ps task " << task_index() << ": step " << step << ": " << zeroed << " gradient value"
             << (zeroed == 1 ? "" : "s") << " of '" << store_->spec(i).variable << "' from " << workers
             << " were NaN/Inf when applied though finite when they arrived (shared memory changed after its "
             << "check): applied as 0";
}

void ParameterServer::Impl::EndTentativeLocked(uint64_t writer, bool confirmed) {
  if (tentative_.writer == writer) {
    // After a rollback the store holds the restored state (ImportState dropped what was tentative).
    if (epoch_.load() == tentative_.epoch) {
      for (int i = 0; i < store_->num_slices(); ++i) {
        if (confirmed) {
          store_->ConfirmTentative(i);
        } else {
          store_->UndoTentative(i);
        }
      }
    }
    tentative_ = Tentative{};
  }
  tentative_started_ = std::max(tentative_started_, writer);
  absl::MutexLock lock(&mu_);
  if (tentative_note_.writer != writer || tentative_note_.state != TentativeNote::kOpen) return;
  tentative_note_.state = confirmed ? TentativeNote::kConfirmed : TentativeNote::kUndone;
  if (!confirmed) {
    LOG(WARNING) << "ps task " << task_index() << ": took back the early-applied push "
                 << tentative_note_.request_id << " of worker " << tentative_note_.worker << " for step "
                 << tentative_note_.step << " (it did not become the step)";
    undone_writer_.store(writer);
    store_->WakeWaiters();  // a pull waiting for a slice the update will not bring
  }
  cv_.SignalAll();
}

void ParameterServer::Impl::ApplyAsync(int i, GradientBuffers::Buffer& buffer) {
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    step = step_;
  }
  const float* grad = buffer.data(i);
  const absl::Time start = options_.on_update_timed ? absl::Now() : absl::InfinitePast();
  TraceSpan span(Tracing(step), Tracing(step) != nullptr ? absl::StrCat("apply slice ", i) : std::string(), "ps apply",
                 step);
  store_->Apply(i, step, &grad, 1, 1.0f, store_->version(i) + 1);
  buffer.set_applied(i);
  if (options_.on_update_timed) {
    options_.on_update_timed({store_->spec(i).length, 1, 0, absl::ToDoubleSeconds(absl::Now() - start), 0});
  }
}

void ParameterServer::Impl::ApplySparse(const std::vector<GradientBuffers::Buffer*>& buffers, int64_t step,
                                        float scale) {
  for (int t = 0; t < sparse_->num_tables(); ++t) {
    if (buffers.size() == 1) {
      const std::vector<int64_t>& ids = buffers[0]->sparse_ids(t);
      if (!ids.empty()) sparse_->Apply(t, step, ids.data(), ids.size(), buffers[0]->sparse_grads(t), scale);
      continue;
    }
    // Summed per id over the workers, in their order (the same bits on every run).
    const int dim = sparse_->spec(t).dim;
    size_t at_most = 0;  // ids over all buffers: sized once, no rehashing or regrowth while summing
    for (const GradientBuffers::Buffer* b : buffers) at_most += b->sparse_ids(t).size();
    absl::flat_hash_map<int64_t, uint32_t> row_of;
    row_of.reserve(at_most);
    std::vector<int64_t> ids;
    ids.reserve(at_most);
    std::vector<float> sum;
    sum.reserve(at_most * dim);
    for (const GradientBuffers::Buffer* b : buffers) {
      const std::vector<int64_t>& bids = b->sparse_ids(t);
      const float* grads = b->sparse_grads(t);
      for (size_t i = 0; i < bids.size(); ++i) {
        auto [it, inserted] = row_of.try_emplace(bids[i], static_cast<uint32_t>(ids.size()));
        const float* g = grads + i * dim;
        if (inserted) {
          ids.push_back(bids[i]);
          sum.insert(sum.end(), g, g + dim);
        } else {
          AddInto(g, sum.data() + static_cast<int64_t>(it->second) * dim, dim);
        }
      }
    }
    if (!ids.empty()) sparse_->Apply(t, step, ids.data(), ids.size(), sum.data(), scale);
  }
}

absl::StatusOr<PushResponse> ParameterServer::Impl::FinishPush(const PushHeader& header,
                                                               GradientBuffers::Buffer& buffer,
                                                               std::optional<StepDecision>* decided, int64_t* epoch,
                                                               std::vector<CheckpointData>* saves) {
  absl::MutexLock lock(&mu_);
  const int w = header.worker_id;
  // The task may have rolled back, or declared the worker lost, or the run may have ended, while the gradients
  // were on their way.
  absl::Status s = CheckRunning();
  if (s.ok()) s = members_.CheckSession(w, header.session, Now());
  if (!s.ok()) {
    ++accounting_.refused;
    return s;
  }
  *epoch = epoch_;
  // The worker drew this step's batches whatever becomes of its gradient.
  if (header.commit && coordinator() && !header.input_position.empty()) {
    members_.RecordInputPosition(w, header.step, header.input_position);
  }
  WorkerStats& stats = members_.stats(w);
  if (members_.recent_ids(w).Contains(header.request_id)) {  // a concurrent retry finished first
    CountNotTaken(w, PushResponse::Outcome::kDuplicate);
    return PushResponse{PushResponse::Outcome::kDuplicate, step_};
  }
  if (clipping() && !buffer.has_gradient_norm()) {
    ++accounting_.refused;
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", w, "'s push for step ", header.step, " came without its gradient norm, but the chief's config "
        "clips gradients (clip_norm ", config_.optimizer.clip_norm, "): every worker must send it (SliceUpload::"
        "SetGradientNorm; a dtrain_worker of this version does)"));
  }
  // Non-finite gradients (checked as they arrived unless --nonfinite=apply).
  const std::string& bad_slice = buffer.nonfinite_slice();
  if (!bad_slice.empty()) {
    ++stats.nonfinite;
    if (options_.nonfinite == ParameterServerOptions::NonFinite::kReject) {
      ++accounting_.rejected_nonfinite;
      members_.recent_ids(w).Insert(header.request_id);
      cv_.SignalAll();
      return absl::InvalidArgumentError(absl::StrCat("worker ", w, "'s gradient for step ", header.step,
                                                     " holds NaN or Inf in '", bad_slice, "' (ps task ",
                                                     task_index(), ", --nonfinite=reject): nothing applied"));
    }
  }
  const bool skip = !bad_slice.empty() && options_.nonfinite == ParameterServerOptions::NonFinite::kSkip;
  PushResponse response{skip ? PushResponse::Outcome::kSkippedNonFinite : PushResponse::Outcome::kAccepted, step_};
  if (sync_) {
    RETURN_IF_ERROR(FinishSyncPushLocked(header, buffer, skip, &response, decided));
  } else {
    RETURN_IF_ERROR(FinishAsyncPushLocked(header, buffer, skip, &response, saves));
  }
  members_.recent_ids(w).Insert(header.request_id);
  cv_.SignalAll();  // a pull may wait for this push (PullRequest::after_push), or for the step
  response.global_step = step_;
  return response;
}

// FinishPush in sync mode: the push becomes the worker's part of the step, or is dropped (stale, a backup, a
// duplicate commit, outside an elastic plan, a step planned again), or refused (a commit without every slice).
// On ps 0 a commit may decide the step (`decided`).
absl::Status ParameterServer::Impl::FinishSyncPushLocked(const PushHeader& header, GradientBuffers::Buffer& buffer,
                                                         bool skip, PushResponse* response,
                                                         std::optional<StepDecision>* decided) {
  const int w = header.worker_id;
  if (header.step < step_) {
    // The step was decided while this upload was on its way.
    response->outcome = header.step == step_ - 1 ? PushResponse::Outcome::kDroppedBackup
                                                 : PushResponse::Outcome::kDroppedStale;
    CountNotTaken(w, response->outcome);
  } else if (header.commit && coordinator_->HasCommitted(w)) {
    response->outcome = PushResponse::Outcome::kDuplicate;
    CountNotTaken(w, response->outcome);
  } else if (header.commit && elastic_ != nullptr && !elastic_->InPlan(w)) {
    // An elastic job's step counts on its plan's workers (their batches): another worker's gradient is left out
    // as a backup's would be; it pulls the next step, whose plan has it.
    response->outcome = PushResponse::Outcome::kDroppedBackup;
    CountNotTaken(w, response->outcome);
  } else if (header.commit && MustRedoLocked(w)) {
    // A global step planned again while this worker computed its part of the old split: it computes the step
    // again with the new one (its pull answers at once).
    response->outcome = PushResponse::Outcome::kDroppedStale;
    CountNotTaken(w, response->outcome);
  } else if (header.commit && !buffer.all_complete()) {
    ++accounting_.refused;
    return absl::FailedPreconditionError(absl::StrCat("worker ", w, " committed step ", header.step,
                                                      " without every slice of ps task 0; missing: ",
                                                      buffer.DescribeMissing()));
  } else {
    // A skipped gradient still counts as this worker's part of the step (the step goes on); ApplyDecision
    // leaves it out of the average.
    ++accounting_.accepted;
    if (journal_) journal_->Accepted(w, header.step, header.request_id);
    if (pending_accepted_[w]) ++accounting_.discarded;  // its previous one never made it into a step
    pending_accepted_[w] = buffer.all_complete();
    if (!buffer.all_complete()) ++accounting_.discarded;  // no decision can apply an incomplete gradient
    if (buffer.all_complete()) complete_step_[w] = header.step;
    if (sparse_async_ && buffer.all_complete() && !skip) {
      // The hybrid: this push's rows now, scaled like a step's (1/R); ApplyDecision leaves them alone.
      sparse_->SetClock(step_);
      ApplySparse({&buffer}, header.step, 1.0f / static_cast<float>(ResolvedReplicasToAggregate(config_)));
    }
    if (header.commit) {
      coordinator_->AddCommit(w);
      commit_ids_[w] = header.request_id;
      *decided = DecideLocked();
    }
  }
  return absl::OkStatus();
}

// FinishPush in async mode: the push is applied at once (unless skipped as non-finite, dropped after the last
// step, or refused without every slice); the task counts the update, and checkpoints and deltas fall due.
absl::Status ParameterServer::Impl::FinishAsyncPushLocked(const PushHeader& header, GradientBuffers::Buffer& buffer,
                                                          bool skip, PushResponse* response,
                                                          std::vector<CheckpointData>* saves) {
  const int w = header.worker_id;
  WorkerStats& stats = members_.stats(w);
  if (saved_for_move_) {
    // Its part of a move's checkpoint is taken: an update now would be lost with the move.
    ++accounting_.refused;
    return absl::AbortedError(absl::StrCat("ps task ", task_index(), " saved its state for a move onto other ps "
                                           "tasks: worker ", w, "'s push for step ", header.step, " is not taken"));
  }
  if (coordinator() && header.commit && config_.train_steps > 0 && step_ >= config_.train_steps) {
    // Async: the last step was reached while this push was on its way (see StartPushLocked).
    response->outcome = PushResponse::Outcome::kDroppedStale;
    CountNotTaken(w, response->outcome);
    if (journal_) journal_->DroppedAfterEnd(w, header.step, header.request_id);
  } else {
    if (!buffer.all_complete()) {
      ++accounting_.refused;
      return absl::FailedPreconditionError(absl::StrCat("worker ", w, "'s push for step ", header.step,
                                                        " ended without every slice of ps task ",
                                                        task_index(), "; missing: ",
                                                        buffer.DescribeMissing()));
    }
    ++accounting_.accepted;
    if (journal_) journal_->Accepted(w, header.step, header.request_id);
    ++(skip ? accounting_.skipped_nonfinite : accounting_.applied);
    if (!skip) {
      // Checked whole first (unless --nonfinite=apply, which applied each slice on arrival).
      const float clip = ClipFactorOf(buffer);
      for (int i = 0; i < store_->num_slices(); ++i) {
        if (buffer.applied(i)) continue;
        const float* grad = buffer.data(i);
        const int64_t zeroed =
            store_->Apply(i, step_, &grad, 1, 1.0f, store_->version(i) + 1, &clip, GuardFor(buffer, i));
        if (zeroed > 0) NoteNonFiniteAtApply(zeroed, step_, i, absl::StrCat("worker ", w));
        buffer.set_applied(i);
      }
      sparse_->SetClock(coordinator() ? step_ : step_hint_);
      ApplySparse({&buffer}, step_, 1.0f);
      AdvanceSparseClock(coordinator() ? step_ : std::max(step_hint_, header.step + 1));
      if (!coordinator()) {
        ++step_;  // the task's own count of updates, for its learning-rate schedule
        ++stats.applied;
        step_hint_ = std::max(step_hint_, header.step + 1);
        if (journal_) journal_->Applied(w, header.step, header.request_id, step_hint_);
        if (std::optional<int64_t> label = checkpointing() ? checkpoints_.Due(step_hint_) : std::nullopt) {
          saves->push_back(SnapshotLocked(*label, step_));
        }
        if (DeltaDueLocked()) TakeDeltaLocked(step_hint_, step_);
      } else if (header.commit) {
        gate_->RecordCommit(w, step_ - header.step);
        ++stats.applied;
        StepDecision applied{step_, {w}, false, ""};
        ++step_;
        if (journal_) journal_->Applied(w, header.step, header.request_id, step_);
        if (std::optional<int64_t> label = checkpointing() ? checkpoints_.Due(step_) : std::nullopt) {
          applied.checkpoint = true;
          saves->push_back(SnapshotLocked(*label, step_));
        }
        if (DeltaDueLocked()) {
          applied.delta = true;
          TakeDeltaLocked(step_, step_);
        }
        if (options_.on_step_applied) options_.on_step_applied(applied);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain::ps
