// ParameterServer, the sync decisions: ps 0 decides each step from its commits and every task applies the
// decisions in step order. The rest: parameter_server.cc, parameter_server_pull.cc, parameter_server_lifecycle.cc;
// the design and the lock order: parameter_server_impl.h.
#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {

// ---- sync ---------------------------------------------------------------------------------------------------

std::optional<StepDecision> ParameterServer::Impl::DecideLocked() {
  if (!job_ended_.empty()) return std::nullopt;  // the run ended early: no more steps
  // A change of the ps tasks waits for the chief at its step: nothing is decided past it until the job has moved.
  if (ps_plan_.Frozen(step_)) return std::nullopt;
  std::optional<StepDecision> d = coordinator_->MaybeDecide(
      step_, elastic_ != nullptr ? elastic_->Needed(members_.active_workers()) : members_.num_active());
  if (!d) return std::nullopt;
  ++step_;
  if (elastic_ != nullptr) {
    const std::string change = elastic_->Advance(d->step, d->workers, members_.active_workers());
    if (!change.empty()) LOG(INFO) << "ps task " << task_index() << ": " << change;
  }
  if (checkpointing() && checkpoints_.Due(step_)) {
    // The other tasks save this step too when they apply the decision; the state is copied once applied.
    d->checkpoint = true;
    checkpoints_.Saved(step_);
  }
  if (ps_plan_.Decided(step_)) {
    // The step a change of the ps tasks happens at: every task saves it, and the chief moves the job from there.
    d->checkpoint = true;
    checkpoints_.Saved(step_);
    const size_t n = ps_plan_.pending_size();
    LOG(INFO) << "ps task 0: step " << step_ << ": the job moves onto " << n << " ps task" << (n == 1 ? "" : "s")
              << " here; no step is decided past it until the chief has moved the state";
  }
  // Every task writes a delta when it applies a decision marked so (DeltaDueLocked records it as taken).
  d->delta = DeltaDueLocked();
  if (!options_.decision_key.empty()) d->mac = HmacSha256(options_.decision_key, DecisionBytes(*d));
  coordinator_->Replace(*d);
  VLOG(1) << "step " << d->step << " decided: workers " << absl::StrJoin(d->workers, ",");
  cv_.SignalAll();
  return d;
}

absl::StatusOr<std::vector<StepDecision>> ParameterServer::Impl::ClaimDecisions(
    const std::vector<StepDecision>& decisions) {
  std::vector<StepDecision> claimed;
  int64_t next = step_;
  for (const StepDecision& d : decisions) {
    if (d.step < next) continue;
    if (d.step > next) {
      return absl::FailedPreconditionError(absl::StrCat("missing decision for step ", next, " on ps task ",
                                                        task_index(), " (got one for step ", d.step, ")"));
    }
    if (!options_.decision_key.empty() && !HmacMatches(options_.decision_key, DecisionBytes(d), d.mac)) {
      return absl::PermissionDeniedError(absl::StrCat("the decision for step ", d.step,
                                                      " is not signed by ps task 0 (wrong or missing MAC): refused"));
    }
    if (d.workers.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("decision for step ", d.step, " names no workers"));
    }
    for (size_t k = 0; k < d.workers.size(); ++k) {
      const int w = d.workers[k];
      RETURN_IF_ERROR(members_.CheckWorker(w));
      if (std::find(d.workers.begin(), d.workers.begin() + k, w) != d.workers.begin() + k) {
        return absl::InvalidArgumentError(absl::StrCat("decision for step ", d.step, " names worker ", w, " twice"));
      }
      if (complete_step_[w] == -1 && epoch_ > 0) {
        // The task rolled back (a restore on the chief's request, as after a ps task restarted) since the decision
        // was made: its gradients went with the rollback, and the decision itself may not stand (ps 0 may be
        // rolling back too, tasks one after another). Not a broken protocol: the worker registers again.
        return absl::AbortedError(absl::StrCat(
            "decision for step ", d.step, " includes worker ", w, ", whose gradients ps task ", task_index(),
            " dropped when it rolled back to step ", step_, ": the decision was made before; register again"));
      }
      if (complete_step_[w] != d.step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "decision for step ", d.step, " includes worker ", w, ", but ps task ", task_index(),
            " does not hold its gradients for that step (its last complete upload is for step ", complete_step_[w],
            ")"));
      }
    }
    claimed.push_back(d);
    ++next;
  }
  if (next != step_) {
    step_ = next;
    cv_.SignalAll();
  }
  return claimed;
}

void ParameterServer::Impl::ApplyDecision(const StepDecision& d, int64_t epoch, std::vector<CheckpointData>* saves) {
  absl::MutexLock apply_lock(&apply_mu_);
  // Decisions are decided (or claimed) in step order but may reach this point out of order; a rollback ends
  // the epoch they belong to.
  struct InOrder {
    const int64_t* applied_through;
    const std::atomic<int64_t>* epoch_now;
    int64_t step, epoch;
    static bool Ready(InOrder* o) { return *o->applied_through == o->step || o->epoch_now->load() != o->epoch; }
  } in_order{&applied_through_, &epoch_, d.step, epoch};
  apply_mu_.Await(absl::Condition(&InOrder::Ready, &in_order));
  if (epoch_.load() != epoch) return;
  std::vector<char> outcome(slots(), kDiscarded);
  ApplyDecidedGradientsLocked(d, epoch, &outcome);
  applied_through_ = d.step + 1;
  absl::MutexLock lock(&mu_);
  RecordDecisionLocked(d, outcome, saves);
}

void ParameterServer::Impl::ApplyDecidedGradientsLocked(const StepDecision& d, int64_t epoch,
                                                        std::vector<char>* outcome) {
  // Buffers are locked in worker order (one lock order for every step) and summed in that order too.
  std::vector<int> by_id = d.workers;
  std::sort(by_id.begin(), by_id.end());
  std::vector<GradientBuffers::Locked> held;
  std::vector<GradientBuffers::Buffer*> buffer_of(slots(), nullptr);
  for (int w : by_id) {
    held.push_back(buffers_->Lock(w));
    buffer_of[w] = &*held.back();
  }
  const SummedGradients summed = ChooseSummedGradients(d, by_id, buffer_of, outcome);
  const float scale = summed.buffers.empty() ? 0.0f : 1.0f / static_cast<float>(summed.buffers.size());
  // Each worker's gradient scaled by its own clip factor (its global norm came with its upload).
  std::vector<float> clip(summed.buffers.size(), 1.0f);
  for (size_t k = 0; k < summed.buffers.size(); ++k) clip[k] = ClipFactorOf(*summed.buffers[k]);
  const float* weights = clipping() ? clip.data() : nullptr;
  const bool tentative = KeepTentativeUpdateLocked(d, epoch, summed);
  const absl::Time dense_start = options_.on_update_timed ? absl::Now() : absl::InfinitePast();
  TraceRecorder* const trace = Tracing(d.step);
  if (trace != nullptr) trace->NameThread("ps handler");
  ApplyDenseSlices(d.step, summed, scale, weights, tentative, trace);
  if (tentative) EndTentativeLocked(tentative_.writer, /*confirmed=*/true);
  // The tables after the slices (pulls stream them in that order), with the same 1/R.
  const absl::Time sparse_start = options_.on_update_timed ? absl::Now() : absl::InfinitePast();
  sparse_->SetClock(d.step);
  if (!sparse_async_) {
    TraceSpan span(sparse_->num_tables() > 0 ? trace : nullptr, "sparse row updates", "ps apply", d.step);
    ApplySparse(summed.buffers, d.step, scale);
  }
  if (options_.on_update_timed && !tentative) {
    int64_t rows = 0;
    for (int t = 0; t < sparse_->num_tables() && !sparse_async_; ++t) {
      for (const GradientBuffers::Buffer* b : summed.buffers) rows += static_cast<int64_t>(b->sparse_ids(t).size());
    }
    const absl::Time end = absl::Now();
    options_.on_update_timed({store_->total_floats(), static_cast<int>(summed.buffers.size()), rows,
                              absl::ToDoubleSeconds(sparse_start - dense_start),
                              absl::ToDoubleSeconds(end - sparse_start)});
  }
  for (GradientBuffers::Locked& b : held) {
    if (b->step() == d.step) b->Unlend(0);  // read for the last time
  }
  sparse_->SetVersion(d.step + 1);
  if (journal_) {
    for (size_t k = 0; k < summed.buffers.size(); ++k) {
      journal_->Applied(summed.workers[k], d.step, summed.buffers[k]->request_id(), d.step + 1);
    }
  }
  AdvanceSparseClock(d.step + 1);
}

ParameterServer::Impl::SummedGradients ParameterServer::Impl::ChooseSummedGradients(
    const StepDecision& d, const std::vector<int>& by_id, const std::vector<GradientBuffers::Buffer*>& buffer_of,
    std::vector<char>* outcome) const {
  // Summed in worker order, not in the decision's (commit) order: float addition of three or more gradients
  // depends on the order, and commit order differs from run to run. So a sync step gives the same bits on
  // every run with the same inputs (a restarted worker or ps task ends bit-identical to an uninterrupted run).
  SummedGradients summed;
  for (int w : by_id) {
    GradientBuffers::Buffer* b = buffer_of[w];
    // Only a worker that broke the protocol (pushing step s+1 before pulling it) can have overwritten them.
    if (b->step() != d.step || !b->all_complete()) {
      LOG(ERROR) << "ps task " << task_index() << ": worker " << w << "'s gradients for step " << d.step
                 << " were overwritten (buffer holds step " << b->step() << "); step applied without them";
      continue;
    }
    if (!b->nonfinite_slice().empty() && options_.nonfinite == ParameterServerOptions::NonFinite::kSkip) {
      LOG(WARNING) << "ps task " << task_index() << ": step " << d.step << " without worker " << w
                   << "'s gradient (NaN/Inf in '" << b->nonfinite_slice() << "', --nonfinite=skip)";
      (*outcome)[w] = kSkipped;
      continue;
    }
    (*outcome)[w] = kApplied;
    summed.buffers.push_back(b);
    summed.workers.push_back(w);
  }
  return summed;
}

bool ParameterServer::Impl::KeepTentativeUpdateLocked(const StepDecision& d, int64_t epoch,
                                                      const SummedGradients& summed) {
  // Early apply: the update is in the store already when it is exactly this step's (the one gradient summed, of
  // the upload that applied it, every slice whole); any other tentative update is taken back first.
  bool tentative = false;
  if (tentative_.writer != 0) {
    tentative = tentative_.step == d.step && tentative_.epoch == epoch && summed.buffers.size() == 1 &&
                summed.buffers[0]->request_id() == tentative_.request_id &&
                newest_writer_.load() == tentative_.writer;
    for (int i = 0; tentative && i < store_->num_slices(); ++i) {
      tentative = store_->tentative_floats(i) == store_->spec(i).length;
    }
    if (!tentative) EndTentativeLocked(tentative_.writer, /*confirmed=*/false);
  }
  return tentative;
}

void ParameterServer::Impl::ApplyDenseSlices(int64_t step, const SummedGradients& summed, float scale,
                                             const float* weights, bool tentative, TraceRecorder* trace) {
  std::vector<const float*> grads(summed.buffers.size());
  for (int i = 0; i < store_->num_slices(); ++i) {
    // The sum of the step's gradients and the update, one slice at a time (SliceStore::Apply does both).
    TraceSpan span(trace, trace != nullptr ? absl::StrCat("sum+apply slice ", i) : std::string(), "ps apply", step);
    if (span.recording()) span.set_detail(absl::StrCat(summed.buffers.size(), " gradients summed"));
    for (size_t k = 0; k < summed.buffers.size(); ++k) grads[k] = summed.buffers[k]->data(i);
    if (tentative) {
      // Applied as it arrived (ApplyTentative: the same chunks and bits as Apply); published already.
    } else if (grads.empty()) {
      store_->Apply(i, step, nullptr, 0, 0.0f, step + 1);  // publishes the version, changes nothing
    } else {
      ApplyGuard guard = ApplyGuard::kNone;
      for (const GradientBuffers::Buffer* b : summed.buffers) {
        if (GuardFor(*b, i) == ApplyGuard::kCopyFinite) guard = ApplyGuard::kCopyFinite;
      }
      const int64_t zeroed =
          store_->Apply(i, step, grads.data(), static_cast<int>(grads.size()), scale, step + 1, weights, guard);
      if (zeroed > 0) {
        NoteNonFiniteAtApply(zeroed, step, i, absl::StrCat("workers ", absl::StrJoin(summed.workers, ",")));
      }
    }
  }
}

void ParameterServer::Impl::RecordDecisionLocked(const StepDecision& d, const std::vector<char>& outcome,
                                                 std::vector<CheckpointData>* saves) {
  for (int w : d.workers) {
    ++members_.stats(w).applied;
    if (!pending_accepted_[w]) continue;  // counted already (a rollback discarded it)
    pending_accepted_[w] = false;
    ++(outcome[w] == kApplied   ? accounting_.applied
       : outcome[w] == kSkipped ? accounting_.skipped_nonfinite
                                : accounting_.discarded);
  }
  if (d.delta) TakeDeltaLocked(d.step + 1, d.step + 1);  // between two updates, like the checkpoint below
  if (d.checkpoint) {
    if (checkpointing()) {
      saves->push_back(SnapshotLocked(d.step + 1, d.step + 1));
    } else {
      LOG_FIRST_N(WARNING, 1) << "ps task " << task_index() << ": ps task 0 saved a checkpoint at step "
                              << d.step + 1 << ", but this task has no --checkpoint_dir: its part is not saved";
    }
  }
  if (coordinator() && options_.on_step_applied) options_.on_step_applied(d);
}

}  // namespace dtrain::ps
