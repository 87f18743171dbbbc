// ParameterServer: the protocol of ps_types.h as a state machine over its parts. Choices the header leaves open:
// - Locks, always taken in this order when nested: apply_mu_ (serializes sync updates, the checkpoint snapshots
//   between them and rollbacks) → a worker's gradient buffer → mu_ (control state: config, step, membership,
//   commits, decisions, clocks) → the SliceStore's own locks. Slice data is copied into or out of the store
//   outside mu_, so uploads and pulls of different workers proceed in parallel.
// - Sync: every task buffers each worker's gradients for its current step (GradientBuffers). ps 0 decides a
//   step under mu_ (the global step advances at once, so Pull headers can go out), signs the decision, and the
//   thread that decided applies it, slice by slice in key order, under apply_mu_; Pulls stream each slice as
//   soon as the store has published it at the header's step. Other tasks check ps 0's signature on the
//   decisions a Pull relays, claim them under mu_ (their step advances at once) and that Pull's thread applies
//   them before streaming. Updates run in step order.
// - Async: with --nonfinite=apply a slice is applied as soon as it has arrived whole; otherwise the push is
//   checked whole and applied when its upload finishes. On ps 0 only a commit advances the global step and the
//   worker's clock; on other tasks every finished upload advances the task's own step (its learning-rate
//   schedule).
// - A Pull never waits when no other worker is active (nobody could move the step): it returns at once,
//   possibly with step < min_step. When no worker is left it returns with training_done.
// - Request ids are remembered per worker for the last 1024 finished uploads (not for uploads that failed, so
//   a retry after e.g. Unavailable is handled afresh); a retried async upload does not apply again the slices
//   its first attempt already applied.
// - Leases: a thread checks them a few times per lease; a worker declared lost counts as ended for "is anyone
//   left", and in sync mode no longer for R. The server is finished when nobody is left.
// - Rollback (Restore on a configured task): the state is replaced in place under apply_mu_ and mu_, every
//   session becomes void, and the epoch moves on: pulls waiting in the old epoch end with Aborted and decided
//   updates of the old epoch are dropped.
// - Checkpoints: whatever advances the step copies the state at the exact step due (sync: under apply_mu_,
//   between two updates); the same RPC thread writes the file after releasing its locks (through writer_, which
//   retries, serializes writes and orders the pruning), before it returns. Restore reads the file under mu_ inside Register: nothing
//   else can proceed before the values exist anyway.
#include "ps/parameter_server.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/cancellation.h"
#include "common/denormals.h"
#include "common/hmac.h"
#include "common/mutex_config.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps/checkpoint_dir.h"
#include "ps/checkpoint_writer.h"
#include "ps/checkpoint_scheduler.h"
#include "ps/gradient_buffers.h"
#include "ps/membership.h"
#include "ps/slice_store.h"
#include "ps/staleness_gate.h"
#include "ps/sync_coordinator.h"
#include "ps/train_config.h"

namespace dtrain::ps {
namespace {

// What ps 0 signs of a decision: everything a task acts on.
std::string DecisionBytes(const StepDecision& d) {
  return absl::StrCat("dtrain-decision/v1|", d.step, "|", absl::StrJoin(d.workers, ","), "|", d.checkpoint ? 1 : 0);
}

}  // namespace

class ParameterServer::Impl {
 public:
  explicit Impl(ParameterServerOptions options)
      : options_(std::move(options)),
        members_(options_.num_workers, options_.task_index),
        complete_step_(options_.num_workers, -1),
        checkpoints_(options_.checkpoint.save_steps, options_.checkpoint.save_secs, options_.clock) {
    if (checkpointing()) {
      writer_ = std::make_unique<CheckpointWriter>(options_.checkpoint, options_.task_index, options_.num_ps);
    }
    if (options_.worker_timeout > absl::ZeroDuration()) lease_thread_ = std::thread([this] { LeaseLoop(); });
  }
  ~Impl() {
    {
      absl::MutexLock lock(&lease_mu_);
      stopping_ = true;
    }
    if (lease_thread_.joinable()) lease_thread_.join();
  }

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request);
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartInitialize(int worker_id);
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& header);
  absl::Status Pull(const PullRequest& request, PullReceiver* receiver);
  absl::Status Done(int worker_id, uint64_t session, bool completed);
  absl::StatusOr<int64_t> Heartbeat(int worker_id, uint64_t session);
  absl::StatusOr<TrainingStats> GetStats();
  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& config);
  absl::Status Restore(const TrainConfig& config, int worker_id, int64_t step);
  bool finished() const;
  bool WaitUntilFinished(absl::Duration timeout);
  TrainingOutcome outcome() const;
  absl::Status final_checkpoint_status() const {
    absl::MutexLock lock(&mu_);
    return final_checkpoint_status_;
  }
  void CheckLeases();
  int64_t step() const;
  // State trained outside the ps (parameter_server.h).
  absl::StatusOr<CheckpointData> ExportState();
  bool CheckpointDue(int64_t step);
  absl::Status ImportState(int64_t step, const std::vector<SliceState>& slices, bool save);
  absl::Status RecordInputPosition(int worker, int64_t step, std::string position) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(members_.CheckWorker(worker));
    if (position.size() > kMaxInputPositionBytes) {
      return absl::InvalidArgumentError(absl::StrCat("input position of ", position.size(), " bytes, more than ",
                                                     kMaxInputPositionBytes));
    }
    if (coordinator()) members_.RecordInputPosition(worker, step, std::move(position));
    return absl::OkStatus();
  }

 private:
  class InitializeUpload;
  class PushUpload;
  class DiscardUpload;

  bool coordinator() const { return options_.task_index == 0; }
  bool checkpointing() const { return options_.checkpoint.enabled(); }
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  absl::Status CheckReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool MustWait(const PullRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t CheckpointLabel() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the task configured with `config` (a new store etc.): Register and Restore of an unconfigured task.
  absl::Status ConfigureLocked(const TrainConfig& config, int chief) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, apply_mu_);
  // Every session void, pulls of the old epoch ended, decided updates of the old epoch dropped.
  void NewEpochLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, apply_mu_);

  // Push: what a finished upload does (the caller holds the worker's buffer).
  absl::StatusOr<PushResponse> FinishPush(const PushHeader& header, GradientBuffers::Buffer& buffer,
                                          std::optional<StepDecision>* decided, int64_t* epoch,
                                          std::vector<CheckpointData>* saves) ABSL_LOCKS_EXCLUDED(mu_);
  // Async: applies slice i of `buffer` (whole) once per upload.
  void ApplyAsync(int i, GradientBuffers::Buffer& buffer) ABSL_LOCKS_EXCLUDED(mu_);

  // Sync.
  std::optional<StepDecision> DecideLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<StepDecision>> ClaimDecisions(const std::vector<StepDecision>& decisions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyDecision(const StepDecision& d, int64_t epoch, std::vector<CheckpointData>* saves)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Membership: after a worker ended (done or lost), apply what its leaving decided and finish when nobody is
  // left (after the final checkpoint).
  void AfterWorkersLeft(std::optional<StepDecision> decided, int64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  void LeaseLoop();

  // Checkpoints.
  // The task's whole state under checkpoint `label` (nothing else changes).
  CheckpointData StateLocked(int64_t label, int64_t task_step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CheckpointData SnapshotLocked(int64_t label, int64_t task_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes checkpoints taken under the locks (CheckpointWriter: retried, then logged; it prunes the oldest beyond
  // checkpoint.keep). Returns the status of the newest one: the caller decides whether it matters (the final
  // save); a periodic save that failed was logged, and training goes on with the previous checkpoint.
  absl::Status WriteCheckpoints(std::vector<CheckpointData> saves) ABSL_LOCKS_EXCLUDED(mu_);

  const ParameterServerOptions options_;

  absl::Mutex apply_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int64_t applied_through_ ABSL_GUARDED_BY(apply_mu_) = 0;  // sync: steps whose update is complete

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // signalled whenever the step, a clock, membership, the epoch or finished_ changes

  bool configured_ ABSL_GUARDED_BY(mu_) = false;
  TrainConfig config_ ABSL_GUARDED_BY(mu_);
  int chief_ ABSL_GUARDED_BY(mu_) = -1;
  bool initialized_ ABSL_GUARDED_BY(mu_) = false;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  TrainingOutcome outcome_ ABSL_GUARDED_BY(mu_);
  // Rollbacks: epoch_ counts them (read without the lock by ApplyDecision's wait); epoch_cancel_ is cancelled
  // when the epoch ends, waking the pulls of that epoch.
  std::atomic<int64_t> epoch_{0};
  std::shared_ptr<Cancellation> epoch_cancel_ ABSL_GUARDED_BY(mu_) = std::make_shared<Cancellation>();

  // Set under mu_ (and apply_mu_) before configured_ turns true, then never replaced: readers that have seen
  // configured_ (CheckReady under mu_) may use them without the lock. A rollback changes the store's contents
  // in place, never the objects.
  bool sync_ = true;
  std::unique_ptr<SliceStore> store_;
  std::unique_ptr<GradientBuffers> buffers_;
  std::unique_ptr<SyncCoordinator> coordinator_;  // object and state: under mu_
  std::unique_ptr<StalenessGate> gate_;           // object and state: under mu_

  Membership members_ ABSL_GUARDED_BY(mu_);
  // Sync: the step of each worker's last finished upload that held every slice (-1: none).
  std::vector<int64_t> complete_step_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> bytes_sent_{0};

  CheckpointScheduler checkpoints_ ABSL_GUARDED_BY(mu_);
  int64_t step_hint_ ABSL_GUARDED_BY(mu_) = 0;  // async, tasks > 0: newest global step seen in pushes
  int64_t written_label_ ABSL_GUARDED_BY(mu_) = 0;  // step of the newest checkpoint written (or restored)
  bool final_save_started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_checkpoint_status_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CheckpointWriter> writer_;  // set once in the constructor when checkpointing; thread-safe

  absl::Mutex lease_mu_;
  bool stopping_ ABSL_GUARDED_BY(lease_mu_) = false;
  std::thread lease_thread_;
};

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
    impl_->store_->ResetSlotsAndAverages(impl_->step_);
    impl_->initialized_ = true;
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
  PushUpload(Impl* impl, const PushHeader& header) : impl_(impl), header_(header) {}

  absl::Status Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override {
    impl_->bytes_received_ += n * DtypeBytes(dtype);
    if (!status_.ok()) return status_;
    absl::StatusOr<int> i = impl_->store_->IndexOf(key);
    if (!i.ok()) return status_ = i.status();
    const bool check = impl_->options_.nonfinite != ParameterServerOptions::NonFinite::kApply;
    GradientBuffers::Locked buffer = impl_->buffers_->Lock(header_.worker_id);
    buffer->Claim(header_.step, header_.request_id);
    status_ = buffer->Write(*i, offset, n, dtype, data, check);
    if (status_.ok() && !check && !impl_->sync_ && buffer->complete(*i) && !buffer->applied(*i)) {
      impl_->ApplyAsync(*i, *buffer);
    }
    return status_;
  }

  absl::StatusOr<PushResponse> Finish() override {
    if (!status_.ok()) return status_;
    std::optional<StepDecision> decided;
    int64_t epoch = 0;
    std::vector<CheckpointData> saves;
    absl::StatusOr<PushResponse> response;
    {
      GradientBuffers::Locked buffer = impl_->buffers_->Lock(header_.worker_id);
      buffer->Claim(header_.step, header_.request_id);
      response = impl_->FinishPush(header_, *buffer, &decided, &epoch, &saves);
    }
    // The thread that decided a step applies it (slice by slice; pulls stream each slice as it is done).
    if (decided) impl_->ApplyDecision(*decided, epoch, &saves);
    impl_->WriteCheckpoints(std::move(saves)).IgnoreError();  // logged by the writer; training goes on
    return response;
  }

 private:
  Impl* impl_;
  const PushHeader header_;
  absl::Status status_;
};

absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::Impl::StartInitialize(int worker_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(members_.CheckWorker(worker_id));
  if (!configured_) {
    return absl::UnavailableError(
        absl::StrCat("ps task ", options_.task_index, " has no config yet: Register the chief first"));
  }
  if (worker_id != chief_) {
    return absl::FailedPreconditionError(absl::StrCat("Initialize from worker ", worker_id,
                                                      ", but only the chief (worker ", chief_, ") initializes"));
  }
  return std::unique_ptr<SliceUpload>(new InitializeUpload(this));
}

absl::StatusOr<std::unique_ptr<SliceUpload>> ParameterServer::Impl::StartPush(const PushHeader& header) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(members_.CheckWorker(header.worker_id));
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
  WorkerStats& stats = members_.stats(header.worker_id);
  auto discard = [&](PushResponse::Outcome outcome) -> std::unique_ptr<SliceUpload> {
    return std::make_unique<DiscardUpload>(this, PushResponse{outcome, step_});
  };
  if (members_.recent_ids(header.worker_id).Contains(header.request_id)) {
    ++stats.duplicates;
    return discard(PushResponse::Outcome::kDuplicate);
  }
  if (sync_) {
    if (header.step < step_) {
      // Every step below step_ has been decided; the one just decided is where backup workers land.
      members_.recent_ids(header.worker_id).Insert(header.request_id);
      cv_.SignalAll();
      if (header.step == step_ - 1) {
        ++stats.dropped_backup;
        return discard(PushResponse::Outcome::kDroppedBackup);
      }
      ++stats.dropped_stale;
      return discard(PushResponse::Outcome::kDroppedStale);
    }
    if (header.commit && coordinator_->HasCommitted(header.worker_id)) {
      ++stats.duplicates;  // a second commit for the same step under a new request id
      return discard(PushResponse::Outcome::kDuplicate);
    }
  }
  if (header.step > step_ && (sync_ || coordinator())) {
    return absl::FailedPreconditionError(absl::StrCat("push from worker ", header.worker_id, " for step ",
                                                      header.step, ", but ps task ", options_.task_index,
                                                      " is at step ", step_, " (pull before pushing)"));
  }
  return std::unique_ptr<SliceUpload>(new PushUpload(this, header));
}

void ParameterServer::Impl::ApplyAsync(int i, GradientBuffers::Buffer& buffer) {
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    step = step_;
  }
  const float* grad = buffer.data(i);
  store_->Apply(i, step, &grad, 1, 1.0f, store_->version(i) + 1);
  buffer.set_applied(i);
}

absl::StatusOr<PushResponse> ParameterServer::Impl::FinishPush(const PushHeader& header,
                                                               GradientBuffers::Buffer& buffer,
                                                               std::optional<StepDecision>* decided, int64_t* epoch,
                                                               std::vector<CheckpointData>* saves) {
  absl::MutexLock lock(&mu_);
  const int w = header.worker_id;
  // The task may have rolled back, or declared the worker lost, while the gradients were on their way.
  RETURN_IF_ERROR(members_.CheckSession(w, header.session, Now()));
  *epoch = epoch_;
  // The worker drew this step's batches whatever becomes of its gradient.
  if (header.commit && coordinator() && !header.input_position.empty()) {
    members_.RecordInputPosition(w, header.step, header.input_position);
  }
  WorkerStats& stats = members_.stats(w);
  if (members_.recent_ids(w).Contains(header.request_id)) {  // a concurrent retry finished first
    ++stats.duplicates;
    return PushResponse{PushResponse::Outcome::kDuplicate, step_};
  }
  // Non-finite gradients (checked as they arrived unless --nonfinite=apply).
  const std::string& bad_slice = buffer.nonfinite_slice();
  if (!bad_slice.empty()) {
    ++stats.nonfinite;
    if (options_.nonfinite == ParameterServerOptions::NonFinite::kReject) {
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
      ++(header.step == step_ - 1 ? stats.dropped_backup : stats.dropped_stale);
    } else if (header.commit && coordinator_->HasCommitted(w)) {
      ++stats.duplicates;
      response.outcome = PushResponse::Outcome::kDuplicate;
    } else if (header.commit && !buffer.all_complete()) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", w, " committed step ", header.step,
                                                        " without every slice of ps task 0; missing: ",
                                                        buffer.DescribeMissing()));
    } else {
      // A skipped gradient still counts as this worker's part of the step (the step goes on); ApplyDecision
      // leaves it out of the average.
      if (buffer.all_complete()) complete_step_[w] = header.step;
      if (header.commit) {
        coordinator_->AddCommit(w);
        *decided = DecideLocked();
      }
    }
  } else {
    if (!buffer.all_complete()) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", w, "'s push for step ", header.step,
                                                        " ended without every slice of ps task ",
                                                        options_.task_index, "; missing: ",
                                                        buffer.DescribeMissing()));
    }
    if (!skip) {
      // Checked whole first (unless --nonfinite=apply, which applied each slice on arrival).
      for (int i = 0; i < store_->num_slices(); ++i) {
        if (buffer.applied(i)) continue;
        const float* grad = buffer.data(i);
        store_->Apply(i, step_, &grad, 1, 1.0f, store_->version(i) + 1);
        buffer.set_applied(i);
      }
      if (!coordinator()) {
        ++step_;  // the task's own count of updates, for its learning-rate schedule
        ++stats.applied;
        step_hint_ = std::max(step_hint_, header.step + 1);
        if (std::optional<int64_t> label = checkpointing() ? checkpoints_.Due(step_hint_) : std::nullopt) {
          saves->push_back(SnapshotLocked(*label, step_));
        }
      } else if (header.commit) {
        gate_->RecordCommit(w, step_ - header.step);
        ++stats.applied;
        StepDecision applied{step_, {w}, false, ""};
        ++step_;
        if (std::optional<int64_t> label = checkpointing() ? checkpoints_.Due(step_) : std::nullopt) {
          applied.checkpoint = true;
          saves->push_back(SnapshotLocked(*label, step_));
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

// ---- sync ---------------------------------------------------------------------------------------------------

std::optional<StepDecision> ParameterServer::Impl::DecideLocked() {
  std::optional<StepDecision> d = coordinator_->MaybeDecide(step_, members_.num_active());
  if (!d) return std::nullopt;
  ++step_;
  if (checkpointing() && checkpoints_.Due(step_)) {
    // The other tasks save this step too when they apply the decision; the state is copied once applied.
    d->checkpoint = true;
    checkpoints_.Saved(step_);
  }
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
                                                        options_.task_index, " (got one for step ", d.step, ")"));
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
      if (complete_step_[w] != d.step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "decision for step ", d.step, " includes worker ", w, ", but ps task ", options_.task_index,
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
  {
    // Buffers are locked in worker order (one lock order for every step) and summed in decision order.
    std::vector<int> by_id = d.workers;
    std::sort(by_id.begin(), by_id.end());
    std::vector<GradientBuffers::Locked> held;
    std::vector<GradientBuffers::Buffer*> buffer_of(options_.num_workers, nullptr);
    for (int w : by_id) {
      held.push_back(buffers_->Lock(w));
      buffer_of[w] = &*held.back();
    }
    std::vector<GradientBuffers::Buffer*> summed;
    for (int w : d.workers) {
      GradientBuffers::Buffer* b = buffer_of[w];
      // Only a worker that broke the protocol (pushing step s+1 before pulling it) can have overwritten them.
      if (b->step() != d.step || !b->all_complete()) {
        LOG(ERROR) << "ps task " << options_.task_index << ": worker " << w << "'s gradients for step " << d.step
                   << " were overwritten (buffer holds step " << b->step() << "); step applied without them";
        continue;
      }
      if (!b->nonfinite_slice().empty() && options_.nonfinite == ParameterServerOptions::NonFinite::kSkip) {
        LOG(WARNING) << "ps task " << options_.task_index << ": step " << d.step << " without worker " << w
                     << "'s gradient (NaN/Inf in '" << b->nonfinite_slice() << "', --nonfinite=skip)";
        continue;
      }
      summed.push_back(b);
    }
    std::vector<const float*> grads(summed.size());
    const float scale = summed.empty() ? 0.0f : 1.0f / static_cast<float>(summed.size());
    for (int i = 0; i < store_->num_slices(); ++i) {
      for (size_t k = 0; k < summed.size(); ++k) grads[k] = summed[k]->data(i);
      if (grads.empty()) {
        store_->Apply(i, d.step, nullptr, 0, 0.0f, d.step + 1);  // publishes the version, changes nothing
      } else {
        store_->Apply(i, d.step, grads.data(), static_cast<int>(grads.size()), scale, d.step + 1);
      }
    }
  }
  applied_through_ = d.step + 1;
  absl::MutexLock lock(&mu_);
  for (int w : d.workers) ++members_.stats(w).applied;
  if (d.checkpoint) {
    if (checkpointing()) {
      saves->push_back(SnapshotLocked(d.step + 1, d.step + 1));
    } else {
      LOG_FIRST_N(WARNING, 1) << "ps task " << options_.task_index << ": ps task 0 saved a checkpoint at step "
                              << d.step + 1 << ", but this task has no --checkpoint_dir: its part is not saved";
    }
  }
  if (coordinator() && options_.on_step_applied) options_.on_step_applied(d);
}

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
  config_ = config;
  sync_ = config_.mode == "sync";
  store_ = std::move(store);
  buffers_ = std::make_unique<GradientBuffers>(options_.num_workers, *store_);
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
            << " floats)";
  return absl::OkStatus();
}

absl::StatusOr<RegisterResponse> ParameterServer::Impl::Register(const RegisterRequest& request) {
  absl::MutexLock apply_lock(&apply_mu_);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(members_.CheckWorker(request.worker_id));
  if (!configured_) {
    if (!request.is_chief) {
      return absl::UnavailableError(absl::StrCat("ps task ", options_.task_index,
                                                 " is waiting for the chief to register its config (worker ",
                                                 request.worker_id, " is not the chief)"));
    }
    // Restore before adopting anything, so a refused checkpoint leaves the task waiting for a chief.
    RETURN_IF_ERROR(ValidateTrainConfig(request.config, options_.num_workers));
    ASSIGN_OR_RETURN(std::optional<RestorableCheckpoint> restored,
                     FindCheckpointToRestore(options_.checkpoint.env, options_.checkpoint.dir, request.config, options_.task_index,
                                             options_.num_ps, request.restore_step));
    if (restored.has_value()) step_ = restored->data.task_step;
    RETURN_IF_ERROR(ConfigureLocked(request.config, request.worker_id));
    if (restored.has_value()) {
      absl::Status s = store_->ImportState(restored->data.slices, restored->data.task_step);
      if (!s.ok()) {
        configured_ = false;
        step_ = 0;
        return absl::FailedPreconditionError(absl::StrCat("cannot restore ", restored->path, ": ", s.message()));
      }
      step_hint_ = restored->data.global_step;
      checkpoints_.Saved(restored->data.global_step);
      written_label_ = restored->data.global_step;
      members_.RestoreInputPositions(restored->data.input_positions, restored->data.global_step);
      initialized_ = true;
      LOG(INFO) << "ps task " << options_.task_index << ": restored " << restored->path << " (step "
                << restored->data.global_step << ", " << restored->data.slices.size() << " slices)";
    }
  } else {
    RETURN_IF_ERROR(CompareTrainConfigs(config_, request.config, request.worker_id));
    if (request.is_chief && request.worker_id != chief_) {
      return absl::FailedPreconditionError(absl::StrCat("worker ", request.worker_id,
                                                        " registers as chief, but the chief is worker ", chief_));
    }
  }
  RegisterResponse response{initialized_, step_, members_.Register(request.worker_id, Now()),
                            absl::ToInt64Milliseconds(options_.worker_timeout),
                            members_.RestoredInputPosition(request.worker_id)};
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
  if (!checkpointing()) return probe;
  // Every file of this task that reads back valid and fits the config (read outside the lock: it takes time).
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(options_.checkpoint.env, options_.checkpoint.dir));
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
  return probe;
}

absl::Status ParameterServer::Impl::Restore(const TrainConfig& config, int worker_id, int64_t step) {
  if (worker_id != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Restore from worker ", worker_id, ": only the chief (worker 0) restores the ps tasks"));
  }
  if (!checkpointing()) {
    return absl::FailedPreconditionError(absl::StrCat("ps task ", options_.task_index,
                                                      " has no --checkpoint_dir: it cannot restore step ", step));
  }
  // Read and check the file first: a bad one leaves the task as it was.
  const std::string path = CheckpointPath(options_.checkpoint.dir, step, options_.task_index, options_.num_ps);
  ASSIGN_OR_RETURN(CheckpointData data, ReadCheckpoint(options_.checkpoint.env, path));
  RETURN_IF_ERROR(CheckCompatible(data, path, config, options_.task_index, options_.num_ps));
  absl::MutexLock apply_lock(&apply_mu_);
  absl::MutexLock lock(&mu_);
  if (!configured_) {
    step_ = data.task_step;
    RETURN_IF_ERROR(ConfigureLocked(config, worker_id));
  } else {
    RETURN_IF_ERROR(CompareTrainConfigs(config_, config, worker_id));
  }
  RETURN_IF_ERROR(store_->ImportState(data.slices, data.task_step));
  const int64_t was = step_;
  step_ = data.task_step;
  step_hint_ = data.global_step;
  initialized_ = true;
  applied_through_ = step_;
  coordinator_ = std::make_unique<SyncCoordinator>(ResolvedReplicasToAggregate(config_));
  coordinator_->StartAt(step_);
  gate_ = std::make_unique<StalenessGate>(options_.num_workers, config_.max_staleness);
  std::fill(complete_step_.begin(), complete_step_.end(), -1);
  checkpoints_.Saved(data.global_step);
  written_label_ = data.global_step;
  members_.RestoreInputPositions(data.input_positions, data.global_step);
  NewEpochLocked();
  LOG(WARNING) << "ps task " << options_.task_index << ": restored " << path << " on the chief's request (was at step "
               << was << ", now " << step_ << "); every worker registers again";
  return absl::OkStatus();
}

void ParameterServer::Impl::NewEpochLocked() {
  members_.ResetSessions(Now());
  ++epoch_;
  epoch_cancel_->Cancel();
  epoch_cancel_ = std::make_shared<Cancellation>();
  cv_.SignalAll();
  if (store_) store_->WakeWaiters();
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

// ---- pull ---------------------------------------------------------------------------------------------------

bool ParameterServer::Impl::MustWait(const PullRequest& request) const {
  if (finished_) return false;
  // The worker's own push first: it may still be on its way on another stream.
  if (request.after_push != 0 && !members_.recent_ids(request.worker_id).Contains(request.after_push)) return true;
  if (!members_.AnotherActive(request.worker_id)) return false;
  if (step_ < request.min_step) return true;
  return !sync_ && coordinator() && gate_->MustWait(request.worker_id, members_);
}

absl::Status ParameterServer::Impl::Pull(const PullRequest& request, PullReceiver* receiver) {
  const absl::Time deadline = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, request.timeout_ms));
  std::shared_ptr<Cancellation> epoch_cancel;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(members_.CheckWorker(request.worker_id));
    RETURN_IF_ERROR(members_.CheckSession(request.worker_id, request.session, Now()));  // first: see StartPush
    RETURN_IF_ERROR(CheckReady());
    if (request.moving_averages && !store_->has_moving_averages()) {
      return absl::FailedPreconditionError(absl::StrCat("ps task ", options_.task_index,
                                                        " keeps no moving averages (the chief's "
                                                        "moving_average_decay is 0): cannot pull them"));
    }
    if (request.min_step < 0 || request.since_step < 0) {
      return absl::InvalidArgumentError(absl::StrCat("pull with negative min_step (", request.min_step,
                                                     ") or since_step (", request.since_step, ")"));
    }
    epoch_cancel = epoch_cancel_;
  }
  // A cancelled pull, or one of an epoch that ended (a rollback), is woken wherever it waits and ends.
  auto wake = [this] {
    {
      absl::MutexLock lock(&mu_);
      cv_.SignalAll();
    }
    store_->WakeWaiters();
  };
  const int64_t request_id = request.cancel != nullptr ? request.cancel->Register(wake) : 0;
  const int64_t epoch_id = epoch_cancel->Register(wake);
  auto deregister = absl::MakeCleanup([&] {
    if (request.cancel != nullptr) request.cancel->Deregister(request_id);
    epoch_cancel->Deregister(epoch_id);
  });
  auto stopped = [&] {
    return (request.cancel != nullptr && request.cancel->cancelled()) || epoch_cancel->cancelled();
  };
  const auto stopped_error = [&] {
    if (epoch_cancel->cancelled()) {
      return absl::AbortedError(absl::StrCat("ps task ", options_.task_index,
                                             " was restored to another step while the pull waited: register again"));
    }
    return absl::CancelledError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                             options_.task_index, " cancelled"));
  };
  PullHeader header;
  std::vector<StepDecision> to_apply;
  int64_t epoch = 0;
  {
    absl::MutexLock lock(&mu_);
    if (sync_ && !coordinator()) {
      ASSIGN_OR_RETURN(to_apply, ClaimDecisions(request.decisions));
    }
    const absl::Time wait_start = absl::Now();
    bool timed_out = false;
    while (MustWait(request) && !stopped()) {
      if (cv_.WaitWithDeadline(&mu_, deadline)) {
        timed_out = MustWait(request);
        break;
      }
    }
    members_.stats(request.worker_id).wait_seconds += absl::ToDoubleSeconds(absl::Now() - wait_start);
    if (stopped()) return stopped_error();
    if (timed_out) {
      std::string waiting_for;
      if (request.after_push != 0 && !members_.recent_ids(request.worker_id).Contains(request.after_push)) {
        waiting_for = absl::StrCat("its push ", request.after_push, " to arrive");
      } else if (step_ < request.min_step) {
        waiting_for = absl::StrCat("step >= ", request.min_step, " (at step ", step_, ")");
      } else {
        waiting_for = gate_->DescribeWait(request.worker_id, members_);
      }
      return absl::DeadlineExceededError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                                      options_.task_index, " timed out after ", request.timeout_ms,
                                                      " ms waiting for ", waiting_for));
    }
    header.step = step_;
    header.training_done = finished_;
    if (sync_ && coordinator()) header.decisions = coordinator_->DecisionsSince(request.since_step, step_);
    epoch = epoch_;
  }
  if (!to_apply.empty()) {
    std::vector<CheckpointData> saves;
    for (const StepDecision& d : to_apply) ApplyDecision(d, epoch, &saves);
    WriteCheckpoints(std::move(saves)).IgnoreError();  // logged by the writer; training goes on
  }
  if (stopped()) return stopped_error();
  RETURN_IF_ERROR(receiver->OnHeader(header));
  // Sync: the values of the header's step; each chunk is sent as soon as it is published, so an update in
  // progress is streamed right behind it. Async: whatever the values are now.
  const int64_t version = sync_ ? header.step : 0;
  int64_t sent = 0;
  for (int i = 0; i < store_->num_slices(); ++i) {
    const SliceSpec& spec = store_->spec(i);
    for (int64_t offset = 0; offset < spec.length; offset += SliceStore::kChunkFloats) {
      const int64_t n = std::min(SliceStore::kChunkFloats, spec.length - offset);
      if (!store_->WaitReadable(i, offset + n, version, absl::InfinitePast())) {
        RETURN_IF_ERROR(receiver->Flush());  // send what is ready before waiting for the update
      }
      if (!store_->WaitReadable(i, offset + n, version, deadline, stopped)) {
        if (stopped()) return stopped_error();
        return absl::DeadlineExceededError(absl::StrCat("Pull by worker ", request.worker_id, " on ps task ",
                                                        options_.task_index, " timed out after ",
                                                        request.timeout_ms, " ms waiting for '", spec.variable,
                                                        "' to be updated to step ", version));
      }
      ASSIGN_OR_RETURN(PullReceiver::Buffer dst, receiver->Destination(spec.key, offset, n));
      if (dst.data != nullptr) store_->Read(i, request.moving_averages, offset, n, dst.dtype, dst.data);
      RETURN_IF_ERROR(receiver->Written(spec.key, offset, n));
      sent += n * DtypeBytes(dst.dtype);
    }
    RETURN_IF_ERROR(receiver->Flush());  // a slice is whole: the worker may be waiting for it
  }
  bytes_sent_ += sent;
  return absl::OkStatus();
}

// ---- membership: done, heartbeats, leases, the end --------------------------------------------------------------

absl::Status ParameterServer::Impl::Done(int worker_id, uint64_t session, bool completed) {
  std::optional<StepDecision> decided;
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(members_.CheckWorker(worker_id));
    RETURN_IF_ERROR(members_.CheckLeave(worker_id, session));
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
    return absl::AbortedError(absl::StrCat("ps task ", options_.task_index, " has no config (it restarted): register again"));
  }
  RETURN_IF_ERROR(members_.CheckSession(worker_id, session, Now()));
  return step_;
}

void ParameterServer::Impl::CheckLeases() {
  if (options_.worker_timeout <= absl::ZeroDuration()) return;
  std::optional<StepDecision> decided;
  int64_t epoch;
  {
    absl::MutexLock lock(&mu_);
    if (!configured_ || finished_) return;
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

void ParameterServer::Impl::LeaseLoop() {
  SetFlushDenormals();  // deciding a step here applies it here
  const absl::Duration every =
      std::clamp(options_.worker_timeout / 4, absl::Milliseconds(20), absl::Seconds(1));
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
    if (members_.all_ended() && !finished_ && !final_save_started_) {
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
      if (checkpointing() && configured_ && initialized_) {
        final_save_started_ = true;
        finish_after_write = true;
        const int64_t label = o.global_step;
        // Saved again unless this step is on disk already, or about to be written by this very call (a periodic
        // save of the same step that failed, or runs on another thread, does not count).
        const bool pending_here = !saves.empty() && saves.back().global_step == label;
        if (label != written_label_ && !pending_here) saves.push_back(SnapshotLocked(label, sync_ ? label : step_));
      } else {
        finished_ = true;
      }
    }
    cv_.SignalAll();
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

CheckpointData ParameterServer::Impl::StateLocked(int64_t label, int64_t task_step) const {
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
  RETURN_IF_ERROR(ValidateCheckpointOptions(options.checkpoint));
  if (options.worker_timeout < absl::ZeroDuration() || options.max_model_bytes <= 0) {
    return absl::InvalidArgumentError("worker_timeout must be >= 0 and max_model_bytes > 0");
  }
  if (options.apply_threads < 1) options.apply_threads = 1;
  return std::unique_ptr<ParameterServer>(new ParameterServer(std::make_unique<Impl>(std::move(options))));
}

ParameterServer::ParameterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ParameterServer::~ParameterServer() = default;

absl::StatusOr<RegisterResponse> ParameterServer::Register(const RegisterRequest& request) {
  return impl_->Register(request);
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
absl::Status ParameterServer::Done(int worker_id, uint64_t session, bool completed) {
  return impl_->Done(worker_id, session, completed);
}
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
absl::Status ParameterServer::final_checkpoint_status() const { return impl_->final_checkpoint_status(); }
int64_t ParameterServer::step() const { return impl_->step(); }
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
