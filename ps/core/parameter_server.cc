// ParameterServer, part 1: uploads (push, initialize) and the public class. The sync decisions and their
// application: parameter_server_sync.cc; pulls: parameter_server_pull.cc; registration, probe and restore,
// membership and the end of training, checkpoints: parameter_server_lifecycle.cc. The design and the lock order:
// parameter_server_impl.h.
#include "ps/core/parameter_server.h"

#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {

std::string DecisionBytes(const StepDecision& d) {
  // The delta mark is signed only when set: a decision without one signs as before.
  return absl::StrCat("dtrain-decision/v1|", d.step, "|", absl::StrJoin(d.workers, ","), "|", d.checkpoint ? 1 : 0,
                      d.delta ? "|delta" : "");
}

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
      LOG(INFO) << "ps task " << impl_->options_.task_index << ": already initialized, ignoring Initialize at step "
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
    LOG(INFO) << "ps task " << impl_->options_.task_index << ": initialized " << impl_->store_->num_slices()
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
      LOG(WARNING) << "ps task " << impl_->options_.task_index << ": worker " << header_.worker_id << "'s push "
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
                 impl_->options_.task_index, ": refused (--max_push_rows)"));
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
        absl::StrCat("ps task ", options_.task_index, " has no config yet: Register the chief first"));
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
        absl::StrCat("commit=true sent to ps task ", options_.task_index, "; only ps task 0 takes commits"));
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
                                                      header.step, ", but ps task ", options_.task_index,
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
  LOG(ERROR) << "ps task " << options_.task_index << ": step " << step << ": " << zeroed << " gradient value"
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
    LOG(WARNING) << "ps task " << options_.task_index << ": took back the early-applied push "
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
                                                     options_.task_index, ", --nonfinite=reject): nothing applied"));
    }
  }
  const bool skip = !bad_slice.empty() && options_.nonfinite == ParameterServerOptions::NonFinite::kSkip;
  PushResponse response{skip ? PushResponse::Outcome::kSkippedNonFinite : PushResponse::Outcome::kAccepted, step_};
  if (sync_) {
    if (header.step < step_) {
      // The step was decided while this upload was on its way.
      response.outcome = header.step == step_ - 1 ? PushResponse::Outcome::kDroppedBackup
                                                  : PushResponse::Outcome::kDroppedStale;
      CountNotTaken(w, response.outcome);
    } else if (header.commit && coordinator_->HasCommitted(w)) {
      response.outcome = PushResponse::Outcome::kDuplicate;
      CountNotTaken(w, response.outcome);
    } else if (header.commit && elastic_ != nullptr && !elastic_->InPlan(w)) {
      // An elastic job's step counts on its plan's workers (their batches): another worker's gradient is left out
      // as a backup's would be; it pulls the next step, whose plan has it.
      response.outcome = PushResponse::Outcome::kDroppedBackup;
      CountNotTaken(w, response.outcome);
    } else if (header.commit && MustRedoLocked(w)) {
      // A global step planned again while this worker computed its part of the old split: it computes the step
      // again with the new one (its pull answers at once).
      response.outcome = PushResponse::Outcome::kDroppedStale;
      CountNotTaken(w, response.outcome);
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
  } else if (coordinator() && header.commit && config_.train_steps > 0 && step_ >= config_.train_steps) {
    // Async: the last step was reached while this push was on its way (see StartPushLocked).
    response.outcome = PushResponse::Outcome::kDroppedStale;
    CountNotTaken(w, response.outcome);
  } else {
    if (!buffer.all_complete()) {
      ++accounting_.refused;
      return absl::FailedPreconditionError(absl::StrCat("worker ", w, "'s push for step ", header.step,
                                                        " ended without every slice of ps task ",
                                                        options_.task_index, "; missing: ",
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
  members_.recent_ids(w).Insert(header.request_id);
  cv_.SignalAll();  // a pull may wait for this push (PullRequest::after_push), or for the step
  response.global_step = step_;
  return response;
}

// ---- the public class -----------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(ParameterServerOptions options) {
  DisableMutexDeadlockDetection();  // see common/mutex_config.h
  if (options.num_ps < 1 || options.task_index < 0 || options.task_index >= options.num_ps) {
    return absl::InvalidArgumentError(absl::StrCat("ps task_index ", options.task_index, " is outside [0, ",
                                                   options.num_ps, ") (num_ps ", options.num_ps, ")"));
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_workers must be >= 1, got ", options.num_workers));
  }
  if (options.max_workers == 0) options.max_workers = options.num_workers;
  if (options.max_workers < options.num_workers || options.max_workers > kMaxWorkerSlots) {
    return absl::InvalidArgumentError(absl::StrCat("--max_workers=", options.max_workers, " must be between the "
                                                   "cluster spec's ", options.num_workers, " workers and ",
                                                   kMaxWorkerSlots));
  }
  RETURN_IF_ERROR(ValidateCheckpointOptions(options.checkpoint));
  if (options.worker_timeout < absl::ZeroDuration() || options.max_model_bytes <= 0) {
    return absl::InvalidArgumentError("worker_timeout must be >= 0 and max_model_bytes > 0");
  }
  if (options.apply_threads < 1) options.apply_threads = 1;
  if (options.journal_applied && !options.checkpoint.enabled()) {
    return absl::InvalidArgumentError("an applied journal (--journal_applied) is kept beside the checkpoints: it "
                                      "needs a checkpoint directory (--checkpoint_dir)");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->OpenJournal());
  return std::unique_ptr<ParameterServer>(new ParameterServer(std::move(impl)));
}

ParameterServer::ParameterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::string> ParameterServer::Control(const ControlRequest& request) {
  return impl_->Control(request);
}
ParameterServer::~ParameterServer() = default;

absl::StatusOr<RegisterResponse> ParameterServer::Register(const RegisterRequest& request) {
  // The clock midway through the call: a first registration configures the task (tens of milliseconds for a large
  // model), which a clock read at the answer would put all on the request's way.
  const int64_t entered = TraceRecorder::NowNs();
  absl::StatusOr<RegisterResponse> r = impl_->Register(request);
  if (r.ok()) r->clock_ns = entered + (TraceRecorder::NowNs() - entered) / 2;
  return r;
}
absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::StartInitialize(int worker_id) {
  return impl_->StartInitialize(worker_id);
}
absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::StartPush(const PushHeader& header) {
  return impl_->StartPush(header);
}
absl::Status ParameterServer::Pull(const PullRequest& request, PullReceiver* receiver) {
  return impl_->Pull(request, receiver);
}
absl::Status ParameterServer::Done(const DoneRequest& request) { return impl_->Done(request); }
void ParameterServer::EndRun(const std::string& why) { impl_->EndRun(why); }
absl::StatusOr<int64_t> ParameterServer::Heartbeat(int worker_id, uint64_t session) {
  return impl_->Heartbeat(worker_id, session);
}
absl::StatusOr<TrainingStats> ParameterServer::GetStats() { return impl_->GetStats(); }
absl::StatusOr<CheckpointProbe> ParameterServer::Probe(const TrainConfig& config) { return impl_->Probe(config); }
absl::Status ParameterServer::Restore(const TrainConfig& config, int worker_id, int64_t step) {
  return impl_->Restore(config, worker_id, step);
}
bool ParameterServer::finished() const { return impl_->finished(); }
bool ParameterServer::WaitUntilFinished(absl::Duration timeout) { return impl_->WaitUntilFinished(timeout); }
TrainingOutcome ParameterServer::outcome() const { return impl_->outcome(); }
void ParameterServer::CheckLeases() { impl_->CheckLeases(); }
void ParameterServer::FlushDeltas() { impl_->FlushDeltas(); }
absl::Status ParameterServer::final_checkpoint_status() const { return impl_->final_checkpoint_status(); }

absl::Status ParameterServer::WaitFinalCheckpoint(absl::Duration timeout) {
  return impl_->WaitFinalCheckpoint(timeout);
}

PushAccounting ParameterServer::accounting() const { return impl_->accounting(); }
int64_t ParameterServer::nonfinite_at_apply() const { return impl_->nonfinite_at_apply(); }

bool PushAccounting::Balanced() const {
  return received == accepted + duplicates + dropped_stale + dropped_backup + rejected_nonfinite + refused +
                         abandoned + in_flight &&
         accepted == applied + skipped_nonfinite + discarded + pending;
}

std::string PushAccounting::DebugString() const {
  return absl::StrCat("received=", received, " accepted=", accepted, " duplicates=", duplicates,
                      " dropped_stale=", dropped_stale, " dropped_backup=", dropped_backup,
                      " rejected_nonfinite=", rejected_nonfinite, " refused=", refused, " abandoned=", abandoned,
                      " in_flight=", in_flight, " applied=", applied, " skipped_nonfinite=", skipped_nonfinite,
                      " partly_applied=", partly_applied,
                      " discarded=", discarded, " pending=", pending, Balanced() ? " (balanced)" : " (UNBALANCED)");
}
int64_t ParameterServer::step() const { return impl_->step(); }
bool ParameterServer::configured() const { return impl_->configured(); }
absl::StatusOr<CheckpointData> ParameterServer::ExportState() { return impl_->ExportState(); }
bool ParameterServer::CheckpointDue(int64_t step) { return impl_->CheckpointDue(step); }
absl::Status ParameterServer::RecordInputPosition(int worker, int64_t step, std::string position) {
  return impl_->RecordInputPosition(worker, step, std::move(position));
}
absl::Status ParameterServer::ImportState(int64_t step, const std::vector<SliceState>& slices, bool save) {
  return impl_->ImportState(step, slices, save);
}

absl::StatusOr<ParameterServerOptions::NonFinite> ParseNonFinitePolicy(absl::string_view name) {
  if (name == "reject") return ParameterServerOptions::NonFinite::kReject;
  if (name == "skip") return ParameterServerOptions::NonFinite::kSkip;
  if (name == "apply") return ParameterServerOptions::NonFinite::kApply;
  return absl::InvalidArgumentError(absl::StrCat("--nonfinite=", name, ": expected reject, skip or apply"));
}

}  // namespace dtrain::ps
