// ParameterServer: uploads, the pieces of a push or of the chief's initial values as they arrive (the upload
// classes and where they start). A push's end: parameter_server_push.cc. The design: parameter_server_impl.h.
#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {

// ---- uploads ----------------------------------------------------------------------------------------------

// An upload whose data is not needed (a duplicate, or gradients for a step already decided): its bytes are
// counted and dropped, Finish reports the outcome decided when it started.
class ParameterServer::Impl::DiscardUpload : public SliceUpload {
 public:
  DiscardUpload(Impl* impl, PushResponse response) : impl_(impl), response_(response) {}
  absl::Status Write(uint32_t, int64_t, int64_t n, WireDtype dtype, const void*) override {
    impl_->bytes_received_ += n * DtypeBytes(dtype);
    return absl::OkStatus();
  }
  absl::Status WriteSparse(uint32_t, const int64_t*, int64_t n, int dim, WireDtype dtype, const void*) override {
    impl_->bytes_received_ += n * (8 + int64_t{dim} * DtypeBytes(dtype));
    return absl::OkStatus();
  }
  absl::Status SetGradientNorm(double) override { return absl::OkStatus(); }
  absl::StatusOr<PushResponse> Finish() override { return response_; }

 private:
  Impl* impl_;
  PushResponse response_;
};

// The chief's initial values, written straight into the store (under mu_: nothing else runs before the task
// is initialized, and a concurrent retry must not write after it is).
class ParameterServer::Impl::InitializeUpload : public SliceUpload {
 public:
  explicit InitializeUpload(Impl* impl) : impl_(impl), received_(impl->store_->num_slices(), 0) {}

  absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
    impl_->bytes_received_ += n * DtypeBytes(dtype);
    ASSIGN_OR_RETURN(int i, impl_->store_->IndexOf(key));
    absl::MutexLock lock(&impl_->mu_);
    if (impl_->initialized_) return absl::OkStatus();  // a restarted chief initializes again: ignored
    if (offset != 0 && offset != received_[i]) {
      return absl::InvalidArgumentError(absl::StrCat("initial values of '", impl_->store_->spec(i).variable,
                                                     "': floats from ", offset, " after ", received_[i]));
    }
    RETURN_IF_ERROR(impl_->store_->WriteValues(i, offset, n, dtype, data));
    received_[i] = offset + n;
    return absl::OkStatus();
  }

  // The initial rows of tables with initial values (each id this task owns, once or again: a row written again
  // is overwritten, so a retried upload may send everything anew).
  absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                           const void* rows) override {
    impl_->bytes_received_ += n * (8 + int64_t{dim} * DtypeBytes(dtype));
    absl::MutexLock lock(&impl_->mu_);
    if (impl_->initialized_) return absl::OkStatus();  // a restarted chief initializes again: ignored
    return impl_->sparse_->WriteRows(table, ids, n, dim, dtype, rows);
  }

  absl::StatusOr<PushResponse> Finish() override {
    absl::MutexLock lock(&impl_->mu_);
    if (impl_->initialized_) {
      LOG(INFO) << "ps task " << impl_->task_index() << ": already initialized, ignoring Initialize at step "
                << impl_->step_;
      return PushResponse{PushResponse::Outcome::kAccepted, impl_->step_};
    }
    for (int i = 0; i < impl_->store_->num_slices(); ++i) {
      const SliceSpec& spec = impl_->store_->spec(i);
      if (received_[i] != spec.length) {
        return absl::InvalidArgumentError(absl::StrCat("no complete initial values for slice key ", spec.key, " ('",
                                                       spec.variable, "'): ", received_[i], " of ", spec.length,
                                                       " floats"));
      }
    }
    RETURN_IF_ERROR(impl_->sparse_->CheckInitialRows());
    impl_->store_->ResetSlotsAndAverages(impl_->step_);
    // Tables without initial values were emptied when the upload started: their rows come from their
    // initializer as they are first touched.
    impl_->sparse_->SetVersion(impl_->step_);
    impl_->initialized_ = true;
    if (impl_->journal_) impl_->journal_->Initialized();
    LOG(INFO) << "ps task " << impl_->task_index() << ": initialized " << impl_->store_->num_slices()
              << " slices";
    return PushResponse{PushResponse::Outcome::kAccepted, impl_->step_};
  }

 private:
  Impl* impl_;
  std::vector<int64_t> received_;
};

// One worker's gradients for one step: pieces go into the worker's buffer; async pushes under
// --nonfinite=apply are applied slice by slice as they complete. Finish records the upload (on ps 0 the commit).
class ParameterServer::Impl::PushUpload : public SliceUpload {
 public:
  // Constructed under mu_ (StartPushLocked), which counts it in flight.
  PushUpload(Impl* impl, const PushHeader& header)
      : impl_(impl), header_(header), writer_(impl->next_writer_++), trace_(impl->Tracing(header.step)),
        began_ns_(trace_ != nullptr ? TraceRecorder::NowNs() : 0) {}
  ~PushUpload() override {
    if (early_) impl_->EndTentative(writer_);  // an upload that did not finish as its step: taken back
    // Lent gradients are held only while their step waits for its decision (ApplyDecision lets go of them then).
    if (lent_ && !awaits_decision_) impl_->buffers_->Lock(header_.worker_id)->Unlend(writer_);
    absl::MutexLock lock(&impl_->mu_);
    --impl_->accounting_.in_flight;
    if (!finished_) ++impl_->accounting_.abandoned;
    if (!finished_ && applied_slices_ > 0) {
      // Async, --nonfinite=apply: the slices that arrived whole are in the parameters; the rest never will be.
      ++impl_->accounting_.partly_applied;
      if (impl_->journal_) {
        impl_->journal_->PartlyApplied(header_.worker_id, header_.step, header_.request_id, applied_slices_,
                                       impl_->store_->num_slices());
      }
      LOG(WARNING) << "ps task " << impl_->task_index() << ": worker " << header_.worker_id << "'s push "
                   << header_.request_id << " for step " << header_.step << " was cut off with " << applied_slices_
                   << " of " << impl_->store_->num_slices() << " slices applied (async, --nonfinite=apply: each "
                   << "slice is applied as it arrives whole)";
    }
  }

  absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
    impl_->bytes_received_ += n * DtypeBytes(dtype);
    const int64_t began = trace_ != nullptr ? TraceRecorder::NowNs() : 0;
    absl::Status s = Take(key, [&](int i, bool check, GradientBuffers::Buffer* b) {
      return b->Write(i, offset, n, dtype, data, check);
    });
    if (trace_ != nullptr) TracePiece(key, offset, n, began);
    return s;
  }
  absl::Status WriteInPlace(uint32_t key, int64_t offset, int64_t n, const float* data,
                            std::shared_ptr<const void> keep) override {
    impl_->bytes_received_ += n * 4;
    lent_ = true;
    const int64_t began = trace_ != nullptr ? TraceRecorder::NowNs() : 0;
    absl::Status s = Take(key, [&](int i, bool check, GradientBuffers::Buffer* b) {
      return b->Borrow(i, offset, n, data, std::move(keep), check, writer_);
    });
    if (trace_ != nullptr) TracePiece(key, offset, n, began);
    return s;
  }

  absl::Status SetGradientNorm(double norm) override {
    if (!status_.ok()) return status_;
    if (norm < 0.0) {
      return status_ = absl::InvalidArgumentError(absl::StrCat("worker ", header_.worker_id,
                                                               " sent a negative gradient norm ", norm));
    }
    GradientBuffers::Locked buffer = impl_->buffers_->Lock(header_.worker_id);
    buffer->Claim(header_.step, header_.request_id);
    buffer->set_gradient_norm(norm);
    return absl::OkStatus();
  }

  absl::Status WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                           const void* rows) override {
    if (!status_.ok()) return status_;
    if (table >= static_cast<uint32_t>(impl_->sparse_->num_tables())) {
      return status_ = impl_->sparse_->CheckIds(table, ids, 0);  // names the table that does not exist
    }
    const bool check = impl_->options_.nonfinite != ParameterServerOptions::NonFinite::kApply;
    GradientBuffers::Locked buffer = impl_->buffers_->Lock(header_.worker_id);
    buffer->Claim(header_.step, header_.request_id);
    // Bounded before anything is copied: what one push may make this task hold.
    const int64_t limit = impl_->options_.max_push_rows;
    const int64_t held = static_cast<int64_t>(buffer->sparse_ids(static_cast<int>(table)).size());
    if (n < 0 || n > limit - held) {
      return status_ = absl::ResourceExhaustedError(absl::StrCat(
                 "worker ", header_.worker_id, "'s push carries more than ", limit, " rows of sparse table '",
                 impl_->sparse_->spec(table).name, "' (", held, " held, ", n, " more) to ps task ",
                 impl_->task_index(), ": refused (--max_push_rows)"));
    }
    if (dim != impl_->sparse_->spec(table).dim) {
      const SparseTableSpec& spec = impl_->sparse_->spec(table);
      return status_ = absl::InvalidArgumentError(absl::StrCat("sparse gradients of '", spec.name, "' with ", dim,
                                                               " values a row, the table has ", spec.dim));
    }
    impl_->bytes_received_ += n * (8 + int64_t{dim} * DtypeBytes(dtype));
    // Read once: the ids may lie in the worker's memory (shared memory lends them in place) and change after the
    // check; what is checked is what is stored. (The rows are decoded once, and checked, in the buffer.)
    ids_.assign(ids, ids + n);
    ids = ids_.data();
    status_ = impl_->sparse_->CheckIds(table, ids, n);
    if (!status_.ok()) return status_;
    return status_ = buffer->WriteSparse(static_cast<int>(table), ids, n, dtype, rows, check, writer_);
  }

  absl::StatusOr<PushResponse> Finish() override {
    finished_ = true;
    if (!status_.ok()) {
      absl::MutexLock lock(&impl_->mu_);
      ++impl_->accounting_.refused;
      return status_;
    }
    std::optional<StepDecision> decided;
    int64_t epoch = 0;
    std::vector<CheckpointData> saves;
    absl::StatusOr<PushResponse> response;
    {
      TraceSpan span(trace_, header_.commit ? "commit" : "push end", "ps push", header_.step);
      GradientBuffers::Locked buffer = impl_->buffers_->Lock(header_.worker_id);
      buffer->Claim(header_.step, header_.request_id);
      response = impl_->FinishPush(header_, *buffer, &decided, &epoch, &saves);
    }
    // The thread that decided a step applies it (slice by slice; pulls stream each slice as it is done).
    if (decided) impl_->ApplyDecision(*decided, epoch, &saves);
    awaits_decision_ = impl_->sync_ && response.ok() && response->outcome == PushResponse::Outcome::kAccepted;
    // A tentative update that did not become the step's (the push refused, dropped or not decided) is taken back.
    if (early_) impl_->EndTentative(writer_);
    impl_->WriteCheckpoints(std::move(saves)).IgnoreError();  // logged by the writer; training goes on
    if (trace_ != nullptr) {
      // The whole push as this task saw it: from its header to its answer (the wire's time included).
      trace_->Complete(absl::StrCat("push from worker ", header_.worker_id), "ps push", began_ns_,
                       TraceRecorder::NowNs(), header_.step);
    }
    return response;
  }

  uint64_t writer() const { return writer_; }
  // Under mu_ at the start: this upload may be applied as it arrives (EarlyApplyLocked), in `epoch`.
  void set_early(int64_t epoch) {
    early_ = true;
    epoch_ = epoch;
  }

 private:
  // A piece of slice `key` into the worker's buffer (`put`: Write or Borrow), then applied where it may be at once
  // (the early apply; async pushes under --nonfinite=apply).
  template <typename Put>
  absl::Status Take(uint32_t key, Put put) {
    if (!status_.ok()) return status_;
    absl::StatusOr<int> i = impl_->store_->IndexOf(key);
    if (!i.ok()) return status_ = i.status();
    const bool check = impl_->options_.nonfinite != ParameterServerOptions::NonFinite::kApply;
    if (early_) {
      // The apply lock before the buffer's, as ApplyDecision takes them.
      absl::MutexLock apply_lock(&impl_->apply_mu_);
      GradientBuffers::Locked buffer = impl_->buffers_->Lock(header_.worker_id);
      buffer->Claim(header_.step, header_.request_id);
      status_ = put(*i, check, &*buffer);
      if (status_.ok()) impl_->ApplyTentativeLocked(writer_, epoch_, header_, *i, *buffer);
      return status_;
    }
    GradientBuffers::Locked buffer = impl_->buffers_->Lock(header_.worker_id);
    buffer->Claim(header_.step, header_.request_id);
    status_ = put(*i, check, &*buffer);
    // Clipping needs the worker's norm, which comes after the slices: such pushes are applied when they finish.
    if (status_.ok() && !check && !impl_->sync_ && !impl_->clipping() && buffer->complete(*i) &&
        !buffer->applied(*i)) {
      impl_->ApplyAsync(*i, *buffer);
      ++applied_slices_;
    }
    return status_;
  }

  // Tracing: one piece (a chunk) of a slice received into the worker's buffer.
  void TracePiece(uint32_t key, int64_t offset, int64_t n, int64_t began) {
    trace_->NameThread("ps handler");
    trace_->Complete(absl::StrCat("recv slice ", key), "ps push", began, TraceRecorder::NowNs(), header_.step,
                     absl::StrCat("worker ", header_.worker_id, ", floats [", offset, ", ", offset + n, ")"));
  }

  Impl* impl_;
  const PushHeader header_;
  const uint64_t writer_;  // this attempt, for the sparse rows (a retry is another)
  TraceRecorder* const trace_;  // the push's step is in the trace's window (null: not traced)
  const int64_t began_ns_;
  std::vector<int64_t> ids_;  // WriteSparse's copy of the ids it checks
  int applied_slices_ = 0;    // async, --nonfinite=apply: slices applied as they arrived
  absl::Status status_;
  bool finished_ = false;
  bool lent_ = false;             // WriteInPlace lent slices to the buffer
  bool awaits_decision_ = false;  // Finish accepted it in sync mode: applied when its step is decided
  bool early_ = false;
  int64_t epoch_ = 0;
};

absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::Impl::StartInitialize(int worker_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(members_.CheckWorker(worker_id));
  RETURN_IF_ERROR(CheckRunning());
  if (!configured_) {
    return absl::UnavailableError(
        absl::StrCat("ps task ", task_index(), " has no config yet: Register the chief first"));
  }
  if (worker_id != chief_) {
    return absl::FailedPreconditionError(absl::StrCat("Initialize from worker ", worker_id,
                                                      ", but only the chief (worker ", chief_, ") initializes"));
  }
  // Every row goes (a previous attempt's too): tables with initial values are filled by this upload, the others
  // start empty.
  if (!initialized_) {
    sparse_->Clear(step_);
    delta_prev_step_ = -1;  // the first delta applies to empty tables
  }
  return std::unique_ptr<SliceUpload>(new InitializeUpload(this));
}

void ParameterServer::Impl::CountNotTaken(int worker, PushResponse::Outcome outcome) {
  WorkerStats& stats = members_.stats(worker);
  switch (outcome) {
    case PushResponse::Outcome::kDuplicate:
      ++stats.duplicates;
      ++accounting_.duplicates;
      break;
    case PushResponse::Outcome::kDroppedBackup:
      ++stats.dropped_backup;
      ++accounting_.dropped_backup;
      break;
    case PushResponse::Outcome::kDroppedStale:
      ++stats.dropped_stale;
      ++accounting_.dropped_stale;
      break;
    default:
      LOG(DFATAL) << "CountNotTaken: not an outcome of a push left out";
  }
}

absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::Impl::StartPush(const PushHeader& header) {
  absl::MutexLock lock(&mu_);
  ++accounting_.received;
  absl::StatusOr<std::unique_ptr<SliceUpload>> upload = StartPushLocked(header);
  if (!upload.ok()) ++accounting_.refused;
  return upload;
}

absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::Impl::StartPushLocked(const PushHeader& header) {
  RETURN_IF_ERROR(members_.CheckWorker(header.worker_id));
  RETURN_IF_ERROR(CheckRunning());
  // The session first: a task that restarted has no config and no sessions, and its workers must hear "register
  // again" (Aborted) rather than "wait" (Unavailable): nobody else would configure it again.
  RETURN_IF_ERROR(members_.CheckSession(header.worker_id, header.session, Now()));
  RETURN_IF_ERROR(CheckReady());
  if (header.commit && !coordinator()) {
    return absl::InvalidArgumentError(
        absl::StrCat("commit=true sent to ps task ", task_index(), "; only ps task 0 takes commits"));
  }
  if (header.input_position.size() > kMaxInputPositionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", header.worker_id, "'s input position takes ",
                                                   header.input_position.size(), " bytes, more than the ",
                                                   kMaxInputPositionBytes, " allowed"));
  }
  if (header.step < 0) return absl::InvalidArgumentError(absl::StrCat("push for negative step ", header.step));
  auto discard = [&](PushResponse::Outcome outcome) -> std::unique_ptr<SliceUpload> {
    CountNotTaken(header.worker_id, outcome);
    return std::make_unique<DiscardUpload>(this, PushResponse{outcome, step_});
  };
  if (members_.recent_ids(header.worker_id).Contains(header.request_id)) {
    return discard(PushResponse::Outcome::kDuplicate);
  }
  // Async: the run's last step is reached; a push computed before it (or, on another task, at it or after) is
  // too late, so the global step ends at train_steps and not a push or two beyond.
  if (!sync_ && config_.train_steps > 0 &&
      (coordinator() ? step_ >= config_.train_steps : header.step >= config_.train_steps)) {
    members_.recent_ids(header.worker_id).Insert(header.request_id);
    cv_.SignalAll();
    // ps 0's drop is the push's outcome; the other tasks may have applied their parts on arrival (the checker
    // counts them, not as doubled).
    if (coordinator() && journal_) journal_->DroppedAfterEnd(header.worker_id, header.step, header.request_id);
    return discard(PushResponse::Outcome::kDroppedStale);
  }
  if (sync_) {
    if (header.step < step_) {
      // Every step below step_ has been decided; the one just decided is where backup workers land.
      members_.recent_ids(header.worker_id).Insert(header.request_id);
      cv_.SignalAll();
      return discard(header.step == step_ - 1 ? PushResponse::Outcome::kDroppedBackup
                                              : PushResponse::Outcome::kDroppedStale);
    }
    if (header.commit && coordinator_->HasCommitted(header.worker_id)) {
      // A second commit for the same step under a new request id.
      return discard(PushResponse::Outcome::kDuplicate);
    }
  }
  if (header.step > step_ && (sync_ || coordinator())) {
    return absl::FailedPreconditionError(absl::StrCat("push from worker ", header.worker_id, " for step ",
                                                      header.step, ", but ps task ", task_index(),
                                                      " is at step ", step_, " (pull before pushing)"));
  }
  ++accounting_.in_flight;
  auto upload = std::make_unique<PushUpload>(this, header);
  newest_writer_.store(upload->writer());
  if (EarlyApplyLocked(header)) {
    upload->set_early(epoch_);
    tentative_note_ = TentativeNote{upload->writer(), header.worker_id, header.request_id, header.step,
                                    TentativeNote::kOpen};
    cv_.SignalAll();  // a pull behind this push may stream it now
  }
  return std::unique_ptr<SliceUpload>(std::move(upload));
}

}  // namespace dtrain::ps
