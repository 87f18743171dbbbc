// ParameterServer, the pulls: when one may be answered (MustWait), its header, the values and rows it streams.
// The rest: parameter_server.cc, _uploads.cc, _push.cc, _sync.cc, _lifecycle.cc; the design and the lock order:
// parameter_server_impl.h.
#include "ps/core/parameter_server_impl.h"

namespace dtrain::ps {

// ---- pull ---------------------------------------------------------------------------------------------------

bool ParameterServer::Impl::MustWait(const PullRequest& request) const {
  if (finished_) return false;
  // The worker's own push first: it may still be on its way on another stream.
  if (request.after_push != 0 && !members_.recent_ids(request.worker_id).Contains(request.after_push)) return true;
  if (!members_.AnotherActive(request.worker_id)) return false;
  // A global elastic step planned again after this worker computed it: the worker computes it again, now.
  if (sync_ && coordinator() && request.min_step == step_ + 1 && MustRedoLocked(request.worker_id)) return false;
  if (step_ < request.min_step) return true;
  // Sync: a worker whose commit for the current step is recorded pulls the next step, whatever min_step says (a
  // worker process restarted after its commit: computing the step again would only be dropped as a duplicate,
  // and would read a batch the uninterrupted run reads a step later).
  if (sync_ && coordinator() && coordinator_->HasCommitted(request.worker_id)) return true;
  // A pending move of the ps tasks stops the workers (async): none waits for the staleness gate meanwhile.
  return !sync_ && coordinator() && !ps_plan_.pending() && gate_->MustWait(request.worker_id, members_);
}

absl::Status ParameterServer::Impl::Pull(const PullRequest& request, PullReceiver* receiver) {
  PullCall call{request, receiver};
  call.deadline = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, request.timeout_ms));
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(CheckPullLocked(request));
    call.epoch_cancel = epoch_cancel_;
  }
  RETURN_IF_ERROR(CheckSparseRequest(request));
  const std::shared_ptr<Cancellation>& epoch_cancel = call.epoch_cancel;
  // A cancelled pull, or one of an epoch that ended (a rollback), is woken wherever it waits and ends.
  auto wake = [this] {
    {
      absl::MutexLock lock(&mu_);
      cv_.SignalAll();
    }
    store_->WakeWaiters();
    sparse_->WakeWaiters();
  };
  const int64_t request_id = request.cancel != nullptr ? request.cancel->Register(wake) : 0;
  const int64_t epoch_id = epoch_cancel->Register(wake);
  auto deregister = absl::MakeCleanup([&] {
    if (request.cancel != nullptr) request.cancel->Deregister(request_id);
    epoch_cancel->Deregister(epoch_id);
  });
  PullHeader header;
  std::vector<StepDecision> to_apply;
  int64_t epoch = 0;
  // Traced by the step the worker computed before it (sync: min_step - 1; async: this task's step now).
  int64_t pull_began_ns = 0;
  if (options_.trace != nullptr) {
    absl::MutexLock lock(&mu_);
    call.traced_step = sync_ && request.min_step > 0 ? request.min_step - 1 : step_;
    call.trace = Tracing(call.traced_step);
    if (call.trace != nullptr) {
      call.trace->NameThread("ps handler");
      pull_began_ns = TraceRecorder::NowNs();
    }
  }
  auto trace_pull = absl::MakeCleanup([&] {
    if (call.trace != nullptr) {
      call.trace->Complete(absl::StrCat("pull served to worker ", request.worker_id), "ps pull", pull_began_ns,
                           TraceRecorder::NowNs(), call.traced_step);
    }
  });
  // Early apply: the pull behind a push applied as it arrives streams the push's update as it is applied, before
  // the step is decided (a tentative pull, PullHeader::tentative).
  uint64_t tentative_writer = 0;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(tentative_writer, AwaitPullLocked(call, &header, &to_apply, &epoch));
  }
  if (!to_apply.empty()) {
    std::vector<CheckpointData> saves;
    for (const StepDecision& d : to_apply) ApplyDecision(d, epoch, &saves);
    WriteCheckpoints(std::move(saves)).IgnoreError();  // logged by the writer; training goes on
  }
  if (call.stopped()) return PullStoppedError(call);
  RETURN_IF_ERROR(receiver->OnHeader(header));
  // Sync: the values of the header's step; each chunk is sent as soon as it is published, so an update in
  // progress is streamed right behind it. Async: whatever the values are now.
  const int64_t version = sync_ ? header.step : 0;
  if (tentative_writer != 0) {
    RETURN_IF_ERROR(StreamTentativePull(call, tentative_writer, version));
  } else {
    RETURN_IF_ERROR(StreamSlices(call, version));
  }
  if (!request.sparse.empty() && request.part == 0) RETURN_IF_ERROR(StreamSparseRows(call, version));
  bytes_sent_ += call.sent;
  return absl::OkStatus();
}

bool ParameterServer::Impl::PullCall::stopped() const {
  return (request.cancel != nullptr && request.cancel->cancelled()) || epoch_cancel->cancelled();
}

absl::Status ParameterServer::Impl::PullStoppedError(const PullCall& call) const {
  if (call.epoch_cancel->cancelled()) {
    return absl::AbortedError(absl::StrCat("ps task ", task_index(),
                                           " was restored to another step while the pull waited: register again"));
  }
  return absl::CancelledError(absl::StrCat("Pull by worker ", call.request.worker_id, " on ps task ",
                                           task_index(), " cancelled"));
}

absl::Status ParameterServer::Impl::CheckPullLocked(const PullRequest& request) {
  RETURN_IF_ERROR(members_.CheckWorker(request.worker_id));
  RETURN_IF_ERROR(CheckRunning());
  RETURN_IF_ERROR(members_.CheckSession(request.worker_id, request.session, Now()));  // first: see StartPush
  RETURN_IF_ERROR(CheckReady());
  if (request.moving_averages && !store_->has_moving_averages()) {
    return absl::FailedPreconditionError(absl::StrCat("ps task ", task_index(),
                                                      " keeps no moving averages (the chief's "
                                                      "moving_average_decay is 0): cannot pull them"));
  }
  if (request.parts < 1 || request.parts > kMaxPullParts || request.part < 0 || request.part >= request.parts) {
    return absl::InvalidArgumentError(absl::StrCat("pull part ", request.part, " of ", request.parts,
                                                   " (parts must be in [1, ", kMaxPullParts, "])"));
  }
  if (request.min_step < 0 || request.since_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("pull with negative min_step (", request.min_step,
                                                   ") or since_step (", request.since_step, ")"));
  }
  return absl::OkStatus();
}

bool ParameterServer::Impl::TentativeOpenLocked(const PullRequest& request) const {
  const TentativeNote& n = tentative_note_;
  return sync_ && coordinator() && request.after_push != 0 && request.parts == 1 && !request.moving_averages &&
         n.state == TentativeNote::kOpen && n.request_id == request.after_push &&
         n.worker == request.worker_id && n.step + 1 == request.min_step;
}

absl::StatusOr<uint64_t> ParameterServer::Impl::AwaitPullLocked(PullCall& call, PullHeader* header,
                                                                std::vector<StepDecision>* to_apply,
                                                                int64_t* epoch) {
  const PullRequest& request = call.request;
  TraceRecorder* const trace = call.trace;
  const auto tentative_open = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return TentativeOpenLocked(request); };
  const auto stopped = [&call] { return call.stopped(); };
  uint64_t tentative_writer = 0;
  if (sync_ && !coordinator()) {
    ASSIGN_OR_RETURN(*to_apply, ClaimDecisions(request.decisions));
  }
  const absl::Time wait_start = absl::Now();
  const int64_t wait_began_ns = trace != nullptr ? TraceRecorder::NowNs() : 0;
  // A condition of mu_, not cv_: cv_ is signalled by every push, and with W workers' pulls waiting on it each
  // push woke all W (at 64 sync workers, 76 context switches per push against 9 at 8 workers, and a third more
  // of the task's CPU per push). The mutex evaluates each waiter's condition when it is released and wakes only
  // a pull that may go on. (The condition reads only what mu_ guards, and atomics.)
  const auto may_go_on = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !MustWait(request) || tentative_open() || stopped() || !job_ended_.empty();
  };
  const bool timed_out =
      !mu_.AwaitWithDeadline(absl::Condition(&may_go_on), call.deadline) && MustWait(request) && !tentative_open();
  if (!timed_out && MustWait(request) && tentative_open()) {
    tentative_writer = tentative_note_.writer;
    LOG_FIRST_N(INFO, 1) << "ps task " << task_index() << ": worker " << request.worker_id
                         << "'s pushes are applied as they arrive and its pulls stream them back (early apply)";
  }
  members_.stats(request.worker_id).wait_seconds += absl::ToDoubleSeconds(absl::Now() - wait_start);
  if (trace != nullptr) {
    // Sync: the wait for the step's other workers (and its apply); async: for the staleness gate.
    trace->Complete(sync_ ? "wait for step (other workers)" : "wait (staleness)", "ps wait", wait_began_ns,
                    TraceRecorder::NowNs(), call.traced_step, absl::StrCat("worker ", request.worker_id));
  }
  if (stopped()) return PullStoppedError(call);
  RETURN_IF_ERROR(CheckRunning());  // the run ended while the pull waited: the worker stops
  if (timed_out) {
    std::string waiting_for;
    if (request.after_push != 0 && !members_.recent_ids(request.worker_id).Contains(request.after_push)) {
      waiting_for = absl::StrCat("its push ", request.after_push, " to arrive");
    } else if (step_ < request.min_step) {
      waiting_for = absl::StrCat("step >= ", request.min_step, " (at step ", step_, ")");
    } else if (sync_ && coordinator() && coordinator_->HasCommitted(request.worker_id)) {
      waiting_for = absl::StrCat("step ", step_, ", which its commit is part of, to be decided");
    } else {
      waiting_for = gate_->DescribeWait(request.worker_id, members_);
    }
    return absl::DeadlineExceededError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                                    task_index(), " timed out after ", request.timeout_ms,
                                                    " ms waiting for ", waiting_for));
  }
  header->step = tentative_writer != 0 ? tentative_note_.step + 1 : step_;
  header->training_done = finished_;
  header->tentative = tentative_writer != 0;
  if (sync_ && coordinator()) header->decisions = coordinator_->DecisionsSince(request.since_step, step_);
  if (elastic_ != nullptr && !request.sparse_read_only && !request.moving_averages) {
    // Async: each step's pull (its part 0) takes the next batch of the input for this worker.
    header->elastic =
        elastic_->View(header->step, request.worker_id, !sync_ && request.part == 0, request.elastic_read_ahead);
    elastic_seen_[request.worker_id] = header->elastic.version;
  }
  if (coordinator()) header->ps_set = ps_plan_.View(header->step);
  *epoch = epoch_;
  return tentative_writer;
}

absl::Status ParameterServer::Impl::StreamTentativePull(PullCall& call, uint64_t tentative_writer, int64_t version) {
  const PullRequest& request = call.request;
  PullReceiver* const receiver = call.receiver;
  const auto stopped = [&call] { return call.stopped(); };
  // Each slice's chunks in the order the push's update applies them (the worker pushes the last layers first),
  // then the decision: the values hold only if it is this update's.
  const auto undone = [&] { return undone_writer_.load() == tentative_writer; };
  const auto taken_back = [&] {
    return absl::UnavailableError(absl::StrCat("ps task ", task_index(), " took back the update of worker ",
                                               request.worker_id, "'s push ", request.after_push, " for step ",
                                               version - 1, ", which this pull streamed as it arrived (the push "
                                               "did not become the step): pull again"));
  };
  const int num = store_->num_slices();
  std::vector<int64_t> streamed(num, 0);
  const auto stop = [&] { return stopped() || undone(); };
  for (int whole = 0; whole < num;) {
    int64_t end = 0;
    int k = store_->WaitAnyReadable(streamed, version, absl::InfinitePast(), stop, &end);
    if (k < 0) {
      RETURN_IF_ERROR(receiver->Flush());  // send what is ready before waiting for the update
      k = store_->WaitAnyReadable(streamed, version, call.deadline, stop, &end);
    }
    if (k < 0) {
      if (stopped()) return PullStoppedError(call);
      if (undone()) return taken_back();
      return absl::DeadlineExceededError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                                      task_index(), " timed out after ", request.timeout_ms,
                                                      " ms waiting for its push's update of step ", version - 1));
    }
    const SliceSpec& spec = store_->spec(k);
    for (int64_t offset = streamed[k]; offset < end; offset += SliceStore::kChunkFloats) {
      const int64_t n = std::min(SliceStore::kChunkFloats, end - offset);
      ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver->Destination(spec.key, offset, n));
      if (dst.data != nullptr) store_->Read(k, false, offset, n, dst.dtype, dst.data);
      RETURN_IF_ERROR(receiver->Written(spec.key, offset, n));
      call.sent += n * DtypeBytes(dst.dtype);
    }
    streamed[k] = end;
    if (end == spec.length) ++whole;
  }
  absl::MutexLock lock(&mu_);
  const auto resolved = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return tentative_note_.writer != tentative_writer || tentative_note_.state != TentativeNote::kOpen;
  };
  const auto resolved_or_ended = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return resolved() || stopped() || !job_ended_.empty();
  };
  mu_.AwaitWithDeadline(absl::Condition(&resolved_or_ended), call.deadline);  // (as above: a condition, not cv_)
  if (stopped()) return PullStoppedError(call);
  RETURN_IF_ERROR(CheckRunning());
  if (!resolved()) {
    return absl::DeadlineExceededError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                                    task_index(), " timed out after ", request.timeout_ms,
                                                    " ms waiting for step ", version - 1, " to be decided"));
  }
  if (tentative_note_.writer != tentative_writer || tentative_note_.state != TentativeNote::kConfirmed) {
    return taken_back();
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::Impl::StreamSlices(PullCall& call, int64_t version) {
  const PullRequest& request = call.request;
  PullReceiver* const receiver = call.receiver;
  const auto stopped = [&call] { return call.stopped(); };
  for (int i = request.part; i < store_->num_slices(); i += request.parts) {
    const SliceSpec& spec = store_->spec(i);
    for (int64_t offset = 0; offset < spec.length; offset += SliceStore::kChunkFloats) {
      const int64_t n = std::min(SliceStore::kChunkFloats, spec.length - offset);
      if (!store_->WaitReadable(i, offset + n, version, absl::InfinitePast())) {
        RETURN_IF_ERROR(receiver->Flush());  // send what is ready before waiting for the update
      }
      if (!store_->WaitReadable(i, offset + n, version, call.deadline, stopped)) {
        if (stopped()) return PullStoppedError(call);
        return absl::DeadlineExceededError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                                        task_index(), " timed out after ",
                                                        request.timeout_ms, " ms waiting for '", spec.variable,
                                                        "' to be updated to step ", version));
      }
      ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver->Destination(spec.key, offset, n));
      if (dst.data != nullptr) store_->Read(i, request.moving_averages, offset, n, dst.dtype, dst.data);
      RETURN_IF_ERROR(receiver->Written(spec.key, offset, n));
      call.sent += n * DtypeBytes(dst.dtype);
    }
    RETURN_IF_ERROR(receiver->Flush());  // a slice is whole: the worker may be waiting for it
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::Impl::StreamSparseRows(PullCall& call, int64_t version) {
  const PullRequest& request = call.request;
  PullReceiver* const receiver = call.receiver;
  const auto stopped = [&call] { return call.stopped(); };
  // The rows at the same step as the slices, once the tables' update (after the slices') is done; the hybrid
  // (rows async) reads them as they are.
  const int64_t row_version = sparse_async_ ? 0 : version;
  if (!sparse_->WaitReadable(row_version, absl::InfinitePast())) RETURN_IF_ERROR(receiver->Flush());
  if (!sparse_->WaitReadable(row_version, call.deadline, stopped)) {
    if (stopped()) return PullStoppedError(call);
    return absl::DeadlineExceededError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                                    task_index(), " timed out after ", request.timeout_ms,
                                                    " ms waiting for the sparse tables to be updated to step ",
                                                    version));
  }
  int64_t ids = 0;
  TraceSpan lookups(call.trace, request.sparse_read_only ? "sparse peeks" : "sparse lookups", "ps pull",
                    call.traced_step);
  for (const SparseIds& e : request.sparse) {
    const int dim = sparse_->spec(e.table).dim;
    const int64_t per_piece = std::max<int64_t>(1, SliceStore::kChunkFloats / dim);
    const int64_t n = static_cast<int64_t>(e.ids.size());
    ids += n;
    for (int64_t first = 0; first < n; first += per_piece) {
      const int64_t m = std::min(per_piece, n - first);
      ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver->SparseDestination(e.table, first, m, dim));
      if (dst.data != nullptr) {
        if (request.sparse_read_only) {
          sparse_->Peek(e.table, e.ids.data() + first, m, dst.dtype, dst.data);
        } else {
          sparse_->Lookup(e.table, e.ids.data() + first, m, dst.dtype, dst.data);
        }
      }
      RETURN_IF_ERROR(receiver->SparseWritten(e.table, first, m));
      call.sent += m * dim * DtypeBytes(dst.dtype);
    }
    RETURN_IF_ERROR(receiver->Flush());
  }
  bytes_received_ += ids * 8;  // the ids came with the request
  return absl::OkStatus();
}

absl::Status ParameterServer::Impl::CheckSparseRequest(const PullRequest& request) const {
  std::vector<char> asked(sparse_->num_tables(), 0);
  for (const SparseIds& e : request.sparse) {
    RETURN_IF_ERROR(CheckPullRows(options_.max_pull_rows, request.worker_id, task_index(), e.table,
                                  static_cast<int64_t>(e.ids.size())));
    RETURN_IF_ERROR(sparse_->CheckIds(e.table, e.ids.data(), static_cast<int64_t>(e.ids.size())));
    if (asked[e.table]++) {
      return absl::InvalidArgumentError(absl::StrCat("pull asks for sparse table ", e.table, " twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace dtrain::ps
