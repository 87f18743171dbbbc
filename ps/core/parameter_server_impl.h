// Internal to the ParameterServer (parameter_server.cc: the public class; _uploads.cc: uploads; _push.cc: a push's
// end, the early, async and sparse applies; _sync.cc: decisions; _pull.cc; _lifecycle.cc: registration, restore,
// membership, the end; _control.cc: dtrain_ctl's commands, the elastic plan, the ps set; _state.cc: checkpoints,
// deltas): the class behind ParameterServer. Nothing else includes this header.
//
// ParameterServer: the protocol of ps/api/ps_types.h as a state machine over its parts. Choices the header
// leaves open:
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
// - Gradient clipping (clip_norm > 0): a push's norm (SetGradientNorm, after its slices) is kept in the worker's
//   buffer; the push is refused at Finish without it. Each worker's gradient is scaled by its own factor: sync,
//   as a weight in the decision's sum (SliceStore::Apply); async, when the push finishes (never slice by slice
//   on arrival, even with --nonfinite=apply, since the norm comes last).
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
// - Sparse tables (SparseStore, beside the SliceStore): a push's rows go into the worker's GradientBuffers with
//   its dense gradients. Sync: the decision's thread applies them after the slices, summed per id over the
//   decided workers (in decision order) with scale 1/R (the workers summed, as for slices: a row one worker
//   touched is divided by R too, TensorFlow's sparse accumulator), then publishes the tables' version; a pull
//   streams its rows after the slices once that version has reached its step. Async: the rows of a push are
//   applied (scale 1) when it finishes, under mu_ like its slices. Rows are read and updated under the
//   store's sub-shard locks, which come after mu_ in the lock order.
// - Checkpoints: whatever advances the step copies the state at the exact step due (sync: under apply_mu_,
//   between two updates); the same RPC thread writes the file after releasing its locks (through writer_, which
//   retries, serializes writes and orders the pruning), before it returns. Restore reads the file under mu_
//   inside Register: nothing else can proceed before the values exist anyway.
#ifndef DTRAIN_PS_CORE_PARAMETER_SERVER_IMPL_H_
#define DTRAIN_PS_CORE_PARAMETER_SERVER_IMPL_H_

#include "ps/core/parameter_server.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>
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
#include "ps/checkpoint/applied_journal.h"
#include "ps/checkpoint/checkpoint_dir.h"
#include "ps/checkpoint/checkpoint_reshard.h"
#include "ps/checkpoint/checkpoint_writer.h"
#include "ps/checkpoint/checkpoint_scheduler.h"
#include "ps/checkpoint/delta_chain.h"
#include "ps/core/gradient_buffers.h"
#include "ps/core/membership.h"
#include "ps/core/slice_store.h"
#include "ps/core/sparse_store.h"
#include "ps/core/staleness_gate.h"
#include "ps/core/sync_coordinator.h"
#include "ps/core/elastic_plan.h"
#include "ps/core/ps_set_plan.h"
#include "ps/core/train_config.h"

namespace dtrain::ps {

// What ps 0 signs of a decision: everything a task acts on.
std::string DecisionBytes(const StepDecision& d);

class ParameterServer::Impl {
 public:
  explicit Impl(ParameterServerOptions options)
      : options_(std::move(options)),
        members_(options_.max_workers, options_.task_index, options_.num_workers),
        complete_step_(options_.max_workers, -1),
        commit_ids_(options_.max_workers, 0),
        elastic_seen_(options_.max_workers, -1),
        pending_accepted_(options_.max_workers, false),
        checkpoints_(options_.checkpoint.save_steps, options_.checkpoint.save_secs, options_.clock),
        ps_plan_(options_.ps_hosts) {
    num_ps_.store(options_.num_ps);
    task_index_.store(options_.task_index);
    if (options_.task_index < static_cast<int>(options_.ps_hosts.size())) {
      own_address_ = options_.ps_hosts[options_.task_index];
    }
    if (checkpointing()) {
      writer_ = std::make_unique<CheckpointWriter>(options_.checkpoint, options_.task_index, options_.num_ps);
    }
    if (options_.delta.enabled()) {
      delta_writer_ = std::make_unique<DeltaWriter>(options_.delta, options_.checkpoint.env, options_.task_index,
                                                    options_.num_ps);
    }
    unconfigured_since_ = last_contact_ = last_delta_time_ = Now();
    if (options_.worker_timeout > absl::ZeroDuration() || options_.registration_timeout < absl::InfiniteDuration()) {
      lease_thread_ = std::thread([this] { LeaseLoop(); });
    }
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
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPushLocked(const PushHeader& header)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Pull(const PullRequest& request, PullReceiver* receiver);
  absl::Status Done(const DoneRequest& request);
  void EndRun(const std::string& why);
  absl::StatusOr<int64_t> Heartbeat(int worker_id, uint64_t session);
  absl::StatusOr<TrainingStats> GetStats();
  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& config);
  absl::Status Restore(const TrainConfig& config, int worker_id, int64_t step);
  absl::StatusOr<std::string> Control(const ControlRequest& request);
  bool finished() const;
  bool WaitUntilFinished(absl::Duration timeout);
  TrainingOutcome outcome() const;
  absl::Status final_checkpoint_status() const {
    absl::MutexLock lock(&mu_);
    return FinalCheckpointStatusLocked();
  }
  absl::Status WaitFinalCheckpoint(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    struct Args {
      const Impl* impl;
      static bool Settled(Args* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->impl->mu_) {
        return !a->impl->final_save_started_ || a->impl->final_save_done_;
      }
    } args{this};
    mu_.AwaitWithTimeout(absl::Condition(&Args::Settled, &args), timeout);
    return FinalCheckpointStatusLocked();
  }
  absl::Status FinalCheckpointStatusLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (final_save_started_ && !final_save_done_) {
      return absl::UnavailableError(absl::StrCat("ps task ", task_index(),
                                                 ": the final checkpoint is still being written"));
    }
    return final_checkpoint_status_;
  }
  // With options_.journal_applied: opens the journal (ParameterServer::Create, before any call).
  absl::Status OpenJournal() {
    if (!options_.journal_applied) return absl::OkStatus();
    ASSIGN_OR_RETURN(journal_, AppliedJournal::Open(options_.checkpoint.env, options_.checkpoint.dir,
                                                    options_.task_index, options_.num_ps));
    return absl::OkStatus();
  }
  int64_t nonfinite_at_apply() const { return nonfinite_at_apply_.load(); }
  PushAccounting accounting() const {
    absl::MutexLock lock(&mu_);
    PushAccounting a = accounting_;
    for (bool p : pending_accepted_) a.pending += p ? 1 : 0;
    return a;
  }
  void CheckLeases();
  void FlushDeltas() {
    if (deltas()) delta_writer_->Flush();
  }
  int64_t step() const;
  bool configured() const {
    absl::MutexLock lock(&mu_);
    return configured_;
  }
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

  bool coordinator() const { return task_index() == 0; }
  // This task's index among the job's ps tasks: the spec's, or another once a change of the ps set renumbered it
  // (a task other than the last left: the last one takes its place), which Restore makes holding both locks.
  // ps 0 is never renumbered.
  int task_index() const { return task_index_.load(std::memory_order_acquire); }
  // The index `config` gives this task: where its address stands in config.ps_hosts (a chief's config after a
  // change of the ps set), else task_index().
  int IndexIn(const TrainConfig& config) const {
    if (!own_address_.empty()) {
      for (size_t i = 0; i < config.ps_hosts.size(); ++i) {
        if (config.ps_hosts[i] == own_address_) return static_cast<int>(i);
      }
    }
    return task_index();
  }
  // The number of ps tasks the job runs on: the spec's, or another after a live change (ps_set_plan.h), which
  // Restore makes holding both locks.
  int num_ps() const { return num_ps_.load(std::memory_order_acquire); }
  // A config that states another number of ps tasks than this task runs among (TrainConfig::num_ps).
  bool OtherPsSet(const TrainConfig& config) const { return config.num_ps != 0 && config.num_ps != num_ps(); }
  // CompareTrainConfigs, but a config for another number of ps tasks (a move) may place other slices here.
  absl::Status CompareModelLocked(const TrainConfig& config, int worker_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Control's add-ps / remove-ps on ps 0.
  absl::StatusOr<std::string> ChangePsSet(const ControlRequest& r, const std::string& who);
  // Control's steps of an async job's move: stop-for-move, cut (ps 0), save-for-move (any task).
  absl::StatusOr<std::string> MoveAsync(const ControlRequest& r, const std::string& who);
  // Saves this task's part of an async move's checkpoint, labelled `label`, and takes no push from then on. `cut`
  // (ps 0): once every active worker stopped pushing (Unavailable before), labelled with its step.
  absl::StatusOr<std::string> SaveForMove(int64_t label, bool cut) ABSL_LOCKS_EXCLUDED(mu_, apply_mu_);
  // Control's retire: a task the job no longer uses (after remove-ps) ends.
  absl::StatusOr<std::string> Retire(const std::string& who);
  std::string RetireLocked(const std::string& who, std::shared_ptr<Cancellation>* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, apply_mu_);
  int slots() const { return options_.max_workers; }  // workers this task keeps (the spec's, or --max_workers)
  // R for the coordinator: the config's, or (0) every worker: the spec's, or the plan's in an elastic job.
  int ReplicasToAggregateLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (config_.elastic_batch.empty()) return ResolvedReplicasToAggregate(config_);
    return config_.replicas_to_aggregate > 0 ? config_.replicas_to_aggregate : slots();
  }
  // After workers joined, left or were lost or were lost: the async membership line; a "global" sync step whose plan lost a worker
  // that had not committed is planned again (its commits set aside, ElasticPlan::Replan).
  void MembershipChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ps 0 of a "global" elastic job: `worker` computed the current step with a plan it saw before the step was
  // planned again; it computes it again (its commit is dropped, its pull of the next step answers at once).
  bool MustRedoLocked(int worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The elastic plan of a configured ps 0 (null elsewhere), started at step_ with the active workers.
  void StartElasticLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a restore: the plan starts again from the active workers, the cursor from the checkpoint's.
  void RestoreElasticCursorLocked(const std::map<int, std::string>& positions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool checkpointing() const { return options_.checkpoint.enabled(); }
  // Deltas are written (options_.delta.enabled()); a task restores from options_.delta.dir whenever it is set.
  bool deltas() const { return delta_writer_ != nullptr; }
  bool restorable() const { return checkpointing() || !options_.delta.dir.empty(); }
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  absl::Status CheckReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // JobEndedError once the run ended early, OK before.
  absl::Status CheckRunning() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return job_ended_.empty() ? absl::OkStatus() : JobEndedError(job_ended_);
  }
  // RunOverError once the task has finished the run (it only lingers): a worker registering or probing then
  // hears how the run ended instead of starting again against a task about to exit. OK before.
  absl::Status CheckNotOver() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return finished_ ? RunOverError(outcome_.kind, outcome_.global_step, outcome_.message) : absl::OkStatus();
  }
  // The run ends early: no more steps, waiting pulls are woken (parameter_server.h).
  void EndRunLocked(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `request`'s leaving ends the run ("" when the run goes on without the worker).
  std::string WhyLeavingEndsRunLocked(const DoneRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every worker has ended and the final checkpoint is written: the outcome, finished_.
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, apply_mu_);
  bool MustWait(const PullRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t CheckpointLabel() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the task configured with `config` (a new store etc.): Register and Restore of an unconfigured task.
  absl::Status ConfigureLocked(const TrainConfig& config, int chief) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, apply_mu_);
  // Every session void, decided updates of the old epoch dropped. Returns the old epoch's cancellation: the
  // caller cancels it after releasing the locks (its callbacks, which end the pulls of the old epoch, take mu_;
  // cancelling it under mu_ deadlocked a task rolled back while a pull waited on it).
  std::shared_ptr<Cancellation> NewEpochLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, apply_mu_);

  // Push: counts a push left out (a duplicate, or dropped as backup or stale) in the worker's stats and the
  // task's accounting.
  void CountNotTaken(int worker, PushResponse::Outcome outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Push: what a finished upload does (the caller holds the worker's buffer).
  absl::StatusOr<PushResponse> FinishPush(const PushHeader& header, GradientBuffers::Buffer& buffer,
                                          std::optional<StepDecision>* decided, int64_t* epoch,
                                          std::vector<CheckpointData>* saves) ABSL_LOCKS_EXCLUDED(mu_);
  // FinishPush's two modes, after its checks: what the push becomes (`response`), or its refusal.
  absl::Status FinishSyncPushLocked(const PushHeader& header, GradientBuffers::Buffer& buffer, bool skip,
                                    PushResponse* response, std::optional<StepDecision>* decided)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FinishAsyncPushLocked(const PushHeader& header, GradientBuffers::Buffer& buffer, bool skip,
                                     PushResponse* response, std::vector<CheckpointData>* saves)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Early apply (parameter_server.h). Whether `header`'s push may be applied as it arrives: it asks, and its step
  // can only be itself (sync, ps 0 of one task, one worker, no clipping, NaN/Inf not skipped), and no tentative
  // update is open.
  bool EarlyApplyLocked(const PushHeader& header) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The upload `writer` (of `header`, started in `epoch`) wrote more of slice i into `buffer`: the tentative update
  // applies what arrived (starting it on the first piece, when the previous step is applied), or is taken back
  // when the upload was superseded, the task rolled back or a slice started again.
  void ApplyTentativeLocked(uint64_t writer, int64_t epoch, const PushHeader& header, int i,
                            const GradientBuffers::Buffer& buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // Ends upload `writer`'s tentative update (nothing when it has none open): confirmed (it is its step's update)
  // or taken back; the tentative pull behind it hears which.
  void EndTentativeLocked(uint64_t writer, bool confirmed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  void EndTentative(uint64_t writer) ABSL_LOCKS_EXCLUDED(apply_mu_, mu_) {
    absl::MutexLock apply_lock(&apply_mu_);
    EndTentativeLocked(writer, /*confirmed=*/false);
  }
  // How slice i of `b` is read at apply: from a checked copy when it is lent (the worker's shared memory, which it
  // may change after its check at arrival) and NaN/Inf are not to be applied (SliceStore::Apply's guard).
  ApplyGuard GuardFor(const GradientBuffers::Buffer& b, int i) const {
    return options_.nonfinite != ParameterServerOptions::NonFinite::kApply && b.lent(i) ? ApplyGuard::kCopyFinite
                                                                                       : ApplyGuard::kNone;
  }
  // Logs (and counts in nonfinite_at_apply_) `zeroed` values of slice i that were finite at their check and not
  // at their apply, applied as 0 at `step`; `workers` names whose gradients they were.
  void NoteNonFiniteAtApply(int64_t zeroed, int64_t step, int i, const std::string& workers);
  // Async: applies slice i of `buffer` (whole) once per upload.
  void ApplyAsync(int i, GradientBuffers::Buffer& buffer) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the config clips gradients (OptimizerConfig::clip_norm > 0), and the factor a worker's gradient is
  // scaled by (1 without clipping or without its norm). Read from the store's optimizer, which changes only
  // when the task is (re)configured, as the store itself.
  bool clipping() const { return store_->optimizer().params().clip_norm > 0.0f; }
  // The trace when `step` is in its window (--trace_steps; ParameterServerOptions::trace), else null.
  TraceRecorder* Tracing(int64_t step) const {
    return options_.trace != nullptr && options_.trace->InWindow(step) ? options_.trace : nullptr;
  }
  float ClipFactorOf(const GradientBuffers::Buffer& b) const {
    return b.has_gradient_norm() ? kernels::ClipFactor(store_->optimizer().params().clip_norm, b.gradient_norm())
                                 : 1.0f;
  }
  // Applies the sparse rows of `buffers` at `step`: summed per id (in the order given), times `scale`.
  void ApplySparse(const std::vector<GradientBuffers::Buffer*>& buffers, int64_t step, float scale);
  // Pull: InvalidArgument for sparse ids the task does not hold (or a table asked twice).
  absl::Status CheckSparseRequest(const PullRequest& request) const;
  // Pull's steps (parameter_server_pull.cc), over the one pull they serve.
  struct PullCall {
    const PullRequest& request;
    PullReceiver* receiver;
    absl::Time deadline{};
    std::shared_ptr<Cancellation> epoch_cancel{};  // the epoch the pull began in
    TraceRecorder* trace = nullptr;              // when the pull is traced
    int64_t traced_step = 0;
    int64_t sent = 0;  // bytes streamed
    // Cancelled, or its epoch ended (a rollback). Reads only atomics: a store's waits evaluate it.
    bool stopped() const;
  };
  // Aborted (the epoch ended: register again) or Cancelled, for a pull that stopped().
  absl::Status PullStoppedError(const PullCall& call) const;
  // The request's own checks: worker, session, the task's state, parts, steps.
  absl::Status CheckPullLocked(const PullRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the pull may stream `request`'s worker's push as it is applied (early apply).
  bool TentativeOpenLocked(const PullRequest& request) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits (under mu_, releasing it) until the pull may be answered, and makes its header. Returns the writer of
  // the tentative update it streams (0: none).
  absl::StatusOr<uint64_t> AwaitPullLocked(PullCall& call, PullHeader* header, std::vector<StepDecision>* to_apply,
                                           int64_t* epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The values: a tentative update's chunks as they are applied, then its decision; or each slice of the
  // request's part at `version`; then the sparse rows.
  absl::Status StreamTentativePull(PullCall& call, uint64_t tentative_writer, int64_t version)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StreamSlices(PullCall& call, int64_t version) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status StreamSparseRows(PullCall& call, int64_t version) ABSL_LOCKS_EXCLUDED(mu_);

  // Sync.
  std::optional<StepDecision> DecideLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<StepDecision>> ClaimDecisions(const std::vector<StepDecision>& decisions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyDecision(const StepDecision& d, int64_t epoch, std::vector<CheckpointData>* saves)
      ABSL_LOCKS_EXCLUDED(mu_);
  // ApplyDecision's steps. What became of a worker's gradient in a decided step (outcome[w], by worker).
  enum DecisionOutcome : char { kApplied, kSkipped, kDiscarded };
  // The gradients a step sums (in worker order) and the workers they are of.
  struct SummedGradients {
    std::vector<GradientBuffers::Buffer*> buffers;
    std::vector<int> workers;
  };
  // Sums the step's gradients and applies its update (the slices, then the tables), the workers' buffers locked
  // meanwhile; fills in outcome[w] for those applied or skipped.
  void ApplyDecidedGradientsLocked(const StepDecision& d, int64_t epoch, std::vector<char>* outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // Of the step's locked buffers (buffer_of[w], for w in by_id, sorted), the gradients it sums: not one that was
  // overwritten, nor (--nonfinite=skip) one with NaN/Inf; each left out is logged.
  SummedGradients ChooseSummedGradients(const StepDecision& d, const std::vector<int>& by_id,
                                        const std::vector<GradientBuffers::Buffer*>& buffer_of,
                                        std::vector<char>* outcome) const;
  // Early apply: whether the tentative update in the store is exactly this step's; any other is taken back.
  bool KeepTentativeUpdateLocked(const StepDecision& d, int64_t epoch, const SummedGradients& summed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(apply_mu_);
  // The step's update of each slice (its gradients summed times `scale`, each by weights[k] when given), or
  // only its version when `tentative` (applied already) or nothing was summed. Under apply_mu_.
  void ApplyDenseSlices(int64_t step, const SummedGradients& summed, float scale, const float* weights,
                        bool tentative, TraceRecorder* trace);
  // The step's counts (per worker and the task's accounting), its delta and checkpoint, on_step_applied.
  void RecordDecisionLocked(const StepDecision& d, const std::vector<char>& outcome,
                            std::vector<CheckpointData>* saves) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Membership: after a worker ended (done or lost) or the run ended early, apply what the leaving decided,
  // write the final checkpoint when nobody is left or the run ended, and finish when nobody is left (after it).
  void AfterWorkersLeft(std::optional<StepDecision> decided, int64_t epoch) ABSL_LOCKS_EXCLUDED(mu_);
  void LeaseLoop();
  // An unconfigured task: finished when no chief registered within options_.registration_timeout, or when
  // training ended elsewhere (a completed Done) and the workers have ended or gone quiet (parameter_server.h).
  void CheckUnconfiguredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes an unconfigured task whose workers reported the end of training (global step ended_step_).
  void FinishAfterEndLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Checkpoints.
  // The task's whole state under checkpoint `label` (nothing else changes).
  // Without `tables`, the sparse tables' rows are left out (a delta takes their changes instead).
  CheckpointData StateLocked(int64_t label, int64_t task_step, bool tables = true) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  CheckpointData SnapshotLocked(int64_t label, int64_t task_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes checkpoints taken under the locks (CheckpointWriter: retried, then logged; it prunes the oldest beyond
  // checkpoint.keep). Returns the status of the newest one: the caller decides whether it matters (the final
  // save); a periodic save that failed was logged, and training goes on with the previous checkpoint.
  absl::Status WriteCheckpoints(std::vector<CheckpointData> saves) ABSL_LOCKS_EXCLUDED(mu_);

  // Deltas. Whether one is due now: its interval has passed and the writer is free (ps 0 in sync mode, every task
  // in async mode); records it as taken.
  bool DeltaDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the changes since the previous delta as the delta of step `label` (task step `task_step`) and queues it
  // for writing (nothing when label is not past the previous one). Between updates (sync: under apply_mu_).
  void TakeDeltaLocked(int64_t label, int64_t task_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the state of step `step` was restored: the next delta applies to it; deltas after it are dropped.
  void RestoredLocked(int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sparse tables' expiry clock at the step being applied; then a sweep when one is due.
  void AdvanceSparseClock(int64_t step);

  const ParameterServerOptions options_;

  absl::Mutex apply_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int64_t applied_through_ ABSL_GUARDED_BY(apply_mu_) = 0;  // sync: steps whose update is complete
  // Early apply: the upload whose tentative update is in the store (writer 0: none), its step, request and the
  // epoch it started in; and the last upload that started one (it does not start again once ended).
  struct Tentative {
    uint64_t writer = 0;
    int64_t step = -1;
    uint64_t request_id = 0;
    int64_t epoch = -1;
  };
  Tentative tentative_ ABSL_GUARDED_BY(apply_mu_);
  uint64_t tentative_started_ ABSL_GUARDED_BY(apply_mu_) = 0;

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
  bool sparse_async_ = false;  // sync mode with TrainConfig::sparse_mode "async": rows applied as pushes arrive
  std::unique_ptr<SliceStore> store_;
  std::unique_ptr<SparseStore> sparse_;  // every table's shard on this task (no tables: none)
  std::unique_ptr<GradientBuffers> buffers_;
  std::unique_ptr<SyncCoordinator> coordinator_;  // object and state: under mu_
  std::unique_ptr<StalenessGate> gate_;           // object and state: under mu_

  Membership members_ ABSL_GUARDED_BY(mu_);
  // Ps 0 of an elastic job (TrainConfig::elastic_batch set): each step's workers and input (elastic_plan.h).
  std::unique_ptr<ElasticPlan> elastic_ ABSL_GUARDED_BY(mu_);
  // Sync: the step of each worker's last finished upload that held every slice (-1: none).
  std::vector<int64_t> complete_step_ ABSL_GUARDED_BY(mu_);
  // Ps 0, sync: the request id of each worker's commit for the current step (the applied journal's V records).
  std::vector<uint64_t> commit_ids_ ABSL_GUARDED_BY(mu_);
  // Ps 0 of an elastic job: the plan version each worker's last pull header carried (-1: none yet).
  std::vector<int64_t> elastic_seen_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> next_writer_{1};  // numbers the push uploads (a retried upload is another writer)
  // Early apply. The newest push upload (a tentative update holds only while its upload is the newest: a retry
  // supersedes it); the newest upload whose tentative update was taken back (its pull stops waiting).
  std::atomic<uint64_t> newest_writer_{0};
  std::atomic<uint64_t> undone_writer_{0};
  // The tentative update a pull may stream (writer 0: none yet): announced when its upload starts, then open
  // until confirmed or taken back.
  struct TentativeNote {
    enum State { kOpen, kConfirmed, kUndone };
    uint64_t writer = 0;
    int worker = -1;
    uint64_t request_id = 0;
    int64_t step = -1;
    State state = kUndone;
  };
  TentativeNote tentative_note_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> nonfinite_at_apply_{0};  // NoteNonFiniteAtApply
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> bytes_sent_{0};
  // The push accounting (parameter_server.h); `pending` is computed from pending_accepted_: sync, whether each
  // worker has an accepted gradient that no decision has applied yet.
  PushAccounting accounting_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> pending_accepted_ ABSL_GUARDED_BY(mu_);

  CheckpointScheduler checkpoints_ ABSL_GUARDED_BY(mu_);
  int64_t step_hint_ ABSL_GUARDED_BY(mu_) = 0;  // async, tasks > 0: newest global step seen in pushes
  int64_t written_label_ ABSL_GUARDED_BY(mu_) = 0;  // step of the newest checkpoint written (or restored)
  bool final_save_started_ ABSL_GUARDED_BY(mu_) = false;
  bool final_save_done_ ABSL_GUARDED_BY(mu_) = false;  // written (or failed, or nothing to save)
  // Why the run ended early (parameter_server.h); empty while it has not.
  std::string job_ended_ ABSL_GUARDED_BY(mu_);
  absl::Status final_checkpoint_status_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<CheckpointWriter> writer_;  // set once in the constructor when checkpointing; thread-safe
  // Set before any call with journal_applied; thread-safe. A live change of the ps set opens another (its file
  // names the new number of tasks) holding both locks; the old ones stay open (a call may still hold them).
  std::unique_ptr<AppliedJournal> journal_;
  std::vector<std::unique_ptr<AppliedJournal>> old_journals_;
  std::atomic<int> num_ps_{1};
  std::atomic<int> task_index_{0};
  std::string own_address_;  // the spec's (or --join's) address of this task; empty when not told
  // Ps 0: the job's ps tasks and a change of them asked for (ps_set_plan.h).
  PsSetPlan ps_plan_ ABSL_GUARDED_BY(mu_);
  // An async job's move (parameter_server_control.cc): ps 0, the workers that stopped pushing to the old set; any
  // task, whether its part of the move's checkpoint is taken (it takes no push until the move restores it).
  std::set<int> stopped_for_move_ ABSL_GUARDED_BY(mu_);
  bool saved_for_move_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<DeltaWriter> delta_writer_;  // set once in the constructor when writing deltas; thread-safe
  int64_t delta_prev_step_ ABSL_GUARDED_BY(mu_) = -1;  // the step the next delta applies to (-1: a fresh start)
  absl::Time last_delta_time_ ABSL_GUARDED_BY(mu_);
  int64_t last_delta_step_ ABSL_GUARDED_BY(mu_) = 0;
  // While unconfigured: since when, the last call of a worker, and the global step a completed Done reported
  // (-1: none; training ended elsewhere when >= 0).
  absl::Time unconfigured_since_ ABSL_GUARDED_BY(mu_);
  absl::Time last_contact_ ABSL_GUARDED_BY(mu_);
  int64_t ended_step_ ABSL_GUARDED_BY(mu_) = -1;

  absl::Mutex lease_mu_;
  bool stopping_ ABSL_GUARDED_BY(lease_mu_) = false;
  std::thread lease_thread_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_PARAMETER_SERVER_IMPL_H_
