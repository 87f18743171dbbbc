// The parameter server's logic, free of any transport: one ParameterServer per ps task holds that task's
// slices of the variables with their optimizer slots and moving averages, and its shard of every sparse
// embedding table (the ids ShardOfId gives it, ps/core/sparse_store.h), applies gradients (sync or async, see
// ps/api/ps_types.h for the protocol), and on task 0 keeps the global step and the sync decisions.
//
// Sparse tables: a pull's PullRequest::sparse ids get their rows after the slices, at the pull's step; a push's
// rows (SliceUpload::WriteSparse) are applied with its step: sync, summed per id over the step's workers and
// divided by R (the number of gradients in the step, whether or not a worker touched the row: TensorFlow's
// sparse accumulator), async, each push as it finishes. Duplicates and retries apply once, a rollback drops
// buffered rows, NaN/Inf rows follow --nonfinite like slices. Checkpoints hold the rows that exist. A table
// with initial values (SparseTableSpec::initial_values) gets every row this task owns from the chief's Initialize
// (WriteSparse on that upload: a row written twice keeps the last, a retried Initialize writes them anew, one
// after the task is initialized is ignored); Initialize fails with InvalidArgument while such a table lacks a row.
//
// Early apply (sync, ps 0 of a single task, one worker, no clipping, NaN/Inf not skipped): a commit whose header
// asks for it (PushHeader::apply_early) is applied as it arrives, chunk by chunk (SliceStore::ApplyTentative:
// the same chunks and bits as the update after the commit), because the step can only be this push. The pull
// behind it (PullRequest::after_push) does not wait for the push: it streams each chunk as it is applied, in the
// order they come (PullHeader::tentative), and ends OK only once the push became the step. A push that does not
// (it breaks off or ends unfinished, is refused, dropped or superseded by a retry, or the task rolls back) is
// taken back: values, slots and moving averages as they were, the version before; the tentative pull then ends
// with Unavailable (the worker pulls again). Checkpoints and deltas never hold a tentative update (the state is
// taken between updates, and SliceStore::ExportState leaves one in progress out).
//
// It implements PsInterface directly (the in-process ps of local mode and of tests); ps/rpc/grpc_ps_service.h
// exposes one over gRPC.
//
// Composition (each part in its own file): SliceStore (values, slots, moving averages, per-slice locks and
// versions), GradientBuffers (each worker's uploaded gradients), Membership (workers' states and statistics),
// SyncCoordinator (ps 0, sync: commits and decisions), StalenessGate (ps 0, async: clocks and the bound),
// CheckpointScheduler (when to save). The ParameterServer is the protocol state machine that ties them.
//
// Thread-safety: every method may be called concurrently from any thread (one gRPC handler thread per call).
// Pulls block (on condition variables, never polling) until their condition holds or their timeout passes.
// Errors: as listed in ps/api/ps_interface.h.
#ifndef DTRAIN_PS_CORE_PARAMETER_SERVER_H_
#define DTRAIN_PS_CORE_PARAMETER_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/trace_recorder.h"
#include "ps/checkpoint/checkpoint_format.h"
#include "ps/checkpoint/checkpoint_options.h"
#include "ps/checkpoint/delta_writer.h"
#include "ps/api/ps_interface.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

// Checkpoints (ps/checkpoint/checkpoint_format.h has the file format, ps/checkpoint/checkpoint_dir.h the names
// and the restore policy). With checkpoint.dir set, each task writes
// <checkpoint.dir>/model.ckpt-<step>.ps<task>-of-<num_ps>:
// - Sync mode: ps 0 saves when the global step reaches a multiple of checkpoint.save_steps, or when
//   checkpoint.save_secs have passed since its last save, and marks that step's decision (StepDecision::
//   checkpoint); every other task saves when it applies a marked decision. So all tasks save the same steps
//   (their own save_* options are not used) and the files of one step form a consistent checkpoint.
// - Async mode: ps 0 saves by global step / time as above. Each other task saves on its own schedule: when its
//   estimate of the global step (the newest step seen in pushes, + 1) crosses a multiple of
//   checkpoint.save_steps (saved under that multiple), or by time (saved under the estimate). The tasks'
//   files of one step are therefore taken at slightly different moments: consistency across tasks is best
//   effort in async mode, as with TensorFlow's Saver on asynchronous training.
// - When no worker is left (each reported Done or was declared lost), or the run ends early (see below), each task
//   saves a final checkpoint (unless it just saved that step); finished() turns true only after it was written,
//   or failed (final_checkpoint_status() says which), and no worker is left. A worker that registers (or a
//   chief that probes) after that, while the task lingers, gets RunOverError with the outcome: it is not taken
//   back into a run that is over.
// - The run ends early (a job-ended state: every later call of a worker but Done and GetStats gets
//   JobEndedError(why), ps/api/ps_interface.h, and pulls waiting for a step are woken with it, so that waiting
//   workers stop at once) when the chief leaves stopped (a signal: it evaluated and exported first), failed or
//   refused; when a worker is refused in sync mode with every worker aggregated (R = num_workers: the run
//   cannot complete); when a worker reports that the run ended elsewhere (Leaving::kPeerFailed: another ps task
//   told it, so the tasks agree); or on EndRun (dtrain_ps got SIGTERM). No step is decided after that. Workers
//   that stay silent then are declared lost after worker_timeout (an unconfigured task: once none has called for
//   that long). Another worker that fails, is stopped or lost only leaves: the run goes on without it
//   (degraded, TrainingOutcome).
// - The state is copied between updates (sync: right after the step's update, before the next one starts);
//   the file is written outside any lock by the calling RPC thread through a CheckpointWriter
//   (ps/checkpoint/checkpoint_writer.h: atomically, retried checkpoint.max_attempts times with backoff), then all
//   but the newest checkpoint.keep files of this task are deleted. A periodic save that still fails is logged
//   (LOG(ERROR)) and training goes on; the previous checkpoint stays intact.
// - Restore: when the chief registers and the task holds no values, it restores the checkpoint chosen by
//   RegisterRequest::restore_step (see FindCheckpointToRestore) before answering, so Register returns
//   initialized=true with the restored step, and the chief skips Initialize. A corrupt newest file is skipped
//   with a warning (the previous one is used); a checkpoint of another model, optimizer or layout fails
//   Register with FailedPrecondition and the task stays unconfigured.
// The most workers a task keeps (--max_workers).
inline constexpr int kMaxWorkerSlots = 4096;

struct ParameterServerOptions {
  int task_index = 0;  // 0 = coordinator (global step, sync decisions)
  int num_ps = 1;
  int num_workers = 1;  // from the cluster spec; the server is finished when all of them reported Done
  // Elastic jobs (dtrain_ps --max_workers): workers num_workers .. max_workers - 1 may join while the job runs
  // (ps/core/membership.h, ps/core/elastic_plan.h); 0: num_workers. The chief's config must then say how a step's
  // batch follows the workers (TrainConfig::elastic_batch), or Register refuses it.
  int max_workers = 0;
  // CPU threads (OpenMP) for applying the update to large slices. dtrain_ps keeps 1 (its host's cores belong to
  // the workers, and updates of different slices overlap with sending); an in-process ps in local mode uses the
  // worker's --threads.
  int apply_threads = 1;
  CheckpointOptions checkpoint;  // dir empty = no checkpoints (neither saved nor restored)
  // Test hook: called on the coordinator after each step is applied (step, contributing workers), in step
  // order, from the thread that applied it. It must not call back into the ParameterServer.
  std::function<void(const StepDecision&)> on_step_applied;
  // Time source for time-based checkpoints and leases (default absl::Now); tests inject a fake clock.
  std::function<absl::Time()> clock;
  // Profiling (dtrain_worker --profile_out): called after each update this task applies, from the thread that
  // applied it, with what it cost: a sync step's dense slices (floats, gradients summed into them) and its tables'
  // rows, or one async slice. It must not call back into the ParameterServer. Null: nothing is timed.
  struct TimedUpdate {
    int64_t floats = 0;   // dense floats updated
    int gradients = 0;    // gradients summed into each (sync: the step's workers; async: 1)
    int64_t rows = 0;     // sparse rows updated (every table)
    double dense_seconds = 0, sparse_seconds = 0;
  };
  std::function<void(const TimedUpdate&)> on_update_timed;
  // Timelines (--trace_steps): the pushes received (each piece of a slice), the commits, the sum and apply of
  // each slice, the waits of pulls for their step (sync: for the other workers), the pulls served, the sparse
  // lookups and row updates and the checkpoint writes of the steps in the recorder's window, on the threads that
  // did them. Not owned; null: none.
  TraceRecorder* trace = nullptr;

  // Membership: a worker silent (no call, no heartbeat) for longer than this is declared lost: sync mode stops
  // waiting for it (R shrinks for the steps that follow) until it registers again. Zero: never (local mode).
  absl::Duration worker_timeout = absl::ZeroDuration();
  // An unconfigured task (just started, or restarted and not registered again) waits this long for a chief to
  // register; then it finishes, failed ("no chief registered ..."). Infinite: waits for ever (local mode, tests).
  // While unconfigured, a worker that reports Done(completed) proves that training ended on the other tasks
  // while this one was down: the task then finishes as soon as every worker has ended or none has called it for
  // worker_timeout (registration_timeout when that is zero), succeeded; its final_checkpoint_status() is
  // DataLoss when its newest checkpoint file is older than the global step the workers reported (the updates
  // since were lost with the process that held them).
  absl::Duration registration_timeout = absl::InfiniteDuration();
  // The cluster's token: ps 0 signs its step decisions with it and every other task applies only signed ones
  // (empty: decisions are not signed; the cluster then trusts its network).
  std::string decision_key;
  // Ps 0: the job's ps tasks (host:port, task 0 first: the cluster spec's --ps_hosts), the set dtrain_ctl add-ps /
  // remove-ps change while the job runs (ps/core/ps_set_plan.h). Empty: such changes are refused.
  std::vector<std::string> ps_hosts;
  // Gradients with NaN or Inf: kReject refuses the push (InvalidArgument naming the slice; nothing applied),
  // kSkip counts it and leaves it out (the step goes on without it), both count it in WorkerStats::nonfinite;
  // kApply applies it without looking (no scan of the gradients).
  enum class NonFinite { kReject, kSkip, kApply };
  NonFinite nonfinite = NonFinite::kReject;
  // The largest model (bytes of this task's slices, plus max_rows rows of each bounded sparse table) Register
  // accepts: ResourceExhausted naming the flag beyond.
  int64_t max_model_bytes = int64_t{4} << 30;
  // The most rows of one table a push may carry to this task (dtrain_ps --max_push_rows): a push past it is
  // refused (ResourceExhausted naming the limit), before its ids are copied, so that one peer cannot make the
  // task's gradient buffers grow without bound. A step's unique ids of a table are far fewer.
  int64_t max_push_rows = int64_t{1} << 22;
  // The most rows of one table a pull may ask this task for (dtrain_ps --max_pull_rows): a pull past it is
  // refused (ResourceExhausted naming the limit); the shm and TCP servers check it before they copy the ids.
  int64_t max_pull_rows = int64_t{1} << 22;
  // A bound on the rows of every sparse table on this task, whatever the chief's max_rows (0: none; see
  // SparseStoreOptions::max_rows_cap).
  int64_t sparse_max_rows = 0;
  // Keep an applied journal in checkpoint.dir (ps/checkpoint/applied_journal.h): every push accepted and applied,
  // every checkpoint taken and restored, so that scripts/check_updates.py can prove nothing acknowledged was
  // lost or applied twice. One write(2) per push; needs checkpoint.dir (InvalidArgument otherwise).
  bool journal_applied = false;
  // Deltas (ps/checkpoint/delta_format.h): every delta.every_secs (or every_steps) the task writes what changed
  // since its previous delta to delta.dir, on a thread of its own: its dense state whole, the sparse rows created
  // or updated (with their optimizer slots) and the ids of the rows removed. Sync mode: ps 0 decides when and
  // marks that step's decision (StepDecision::delta), and every task writes its delta of that step, so the
  // deltas of one step form one consistent state; async mode: each task on its own clock, labelled like its
  // checkpoints. A task restores (at the chief's Register, Probe and Restore) its newest checkpoint and the
  // deltas after it in delta.dir whenever that directory is set, written by this run or an earlier one; the
  // deltas after the step it restored are deleted (a future that will not happen), and those behind the second
  // newest checkpoint once a checkpoint is written.
  DeltaOptions delta;
};

// "reject", "skip" or "apply" (the --nonfinite flag); InvalidArgument naming the flag otherwise.
absl::StatusOr<ParameterServerOptions::NonFinite> ParseNonFinitePolicy(absl::string_view name);

// How training ended, once the ParameterServer is finished (every worker done or lost). dtrain_ps prints the
// message as its summary line and exits by the kind (common/exit_codes.h).
struct TrainingOutcome {
  // kComplete, kDegraded, kRefused (a configuration the run cannot do without), or kEndedEarly (the chief
  // stopped or failed, EndRun, nobody left).
  using Kind = RunOutcome;
  Kind kind = Kind::kEndedEarly;
  bool succeeded = false;  // the run reached its end: kComplete or kDegraded
  int64_t global_step = 0;  // this task's estimate of the global step at the end
  std::vector<int> lost_workers;
  std::vector<int> failed_workers;  // left without completing, other than lost (failed, refused, stopped)
  std::string job_ended;   // kEndedEarly by a peer or EndRun: why (as JobEndedError says)
  // One line: "run complete: ...", "run degraded: ... without worker 1 (lost at step 120: ...)", "run ended
  // early at step S of N: ...".
  std::string message;
};

// What became of the pushes this task received since it started: each push is counted once when it arrives
// (received) and once by what the task answered; each accepted gradient once more by what became of it.
//   received == accepted + duplicates + dropped_stale + dropped_backup + rejected_nonfinite + refused + abandoned
//               + in_flight
//   accepted == applied + skipped_nonfinite + discarded + pending
// Balanced() checks both. Counted on every task (a task other than 0 gets each worker's gradient part for it).
struct PushAccounting {
  int64_t received = 0;            // StartPush calls
  int64_t accepted = 0;            // gradients taken for a step (sync: for a decision; async: applied at once)
  int64_t duplicates = 0;          // a retry of a push already handled, or a second commit for the step
  int64_t dropped_stale = 0;       // for a step decided long ago (sync), or refused by the staleness bound
  int64_t dropped_backup = 0;      // for the step just decided without it (sync backup workers)
  int64_t rejected_nonfinite = 0;  // NaN/Inf under --nonfinite=reject
  int64_t refused = 0;             // answered with another error (no session, not ready, protocol errors)
  int64_t abandoned = 0;           // uploads that ended unfinished (the client cancelled, died or lost its link)
  int64_t in_flight = 0;           // uploads still open
  int64_t applied = 0;             // accepted gradients that went into the parameters
  int64_t skipped_nonfinite = 0;   // accepted, left out of their step (--nonfinite=skip)
  int64_t discarded = 0;           // accepted (sync), never applied: a rollback, or overwritten
  int64_t pending = 0;             // accepted (sync), waiting for their step's decision
  // Of the abandoned: async uploads under --nonfinite=apply (no clipping) whose slices are applied as each
  // arrives whole, cut off with some applied already (the applied journal's P record names them). Not atomic by
  // design: the apply overlaps the upload; such a push is never acknowledged.
  int64_t partly_applied = 0;
  bool Balanced() const;
  std::string DebugString() const;  // one line: "received=... accepted=... ... pending=..."
};

class ParameterServer : public PsInterface {
 public:
  // InvalidArgument naming the bad option (task_index outside [0, num_ps), num_workers < 1, negative save
  // intervals).
  static absl::StatusOr<std::unique_ptr<ParameterServer>> Create(ParameterServerOptions options);
  ~ParameterServer() override;

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) override;
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartInitialize(int worker_id) override;
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& header) override;
  absl::Status Pull(const PullRequest& request, PullReceiver* receiver) override;
  absl::Status Done(const DoneRequest& request) override;
  using PsInterface::Done;
  absl::StatusOr<int64_t> Heartbeat(int worker_id, uint64_t session) override;
  absl::StatusOr<TrainingStats> GetStats() override;
  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& config) override;
  absl::Status Restore(const TrainConfig& config, int worker_id, int64_t step) override;
  // "remove-worker" (ps 0; other tasks answer that there is nothing to do) and "drain" (EndRun): see PsInterface.
  absl::StatusOr<std::string> Control(const ControlRequest& request) override;

  // True once no worker is left (each reported Done or was declared lost) and the final checkpoint is written.
  // WaitUntilFinished blocks until then or timeout; returns whether finished.
  bool finished() const;
  bool WaitUntilFinished(absl::Duration timeout);
  // Valid once finished().
  TrainingOutcome outcome() const;
  // Ends the run before its end (dtrain_ps on SIGTERM/SIGINT): no more steps; the final checkpoint of this
  // task's state now is written before it returns; every later call of a worker gets JobEndedError(why); the
  // task finishes once every worker has left or gone silent. Nothing happens when the run already ended.
  void EndRun(const std::string& why);
  // Declares lost the workers whose lease ran out (a thread of the ParameterServer calls it a few times per
  // lease; tests call it after moving their fake clock).
  void CheckLeases();
  // Waits until every delta taken so far is on disk (written or failed): tests, and readers in one process.
  void FlushDeltas();

  int64_t step() const;  // this task's step (global step on task 0)
  bool configured() const;  // a chief's config adopted (registered, or restored by the chief)

  // ---- State trained outside the ps (local mode with GPU towers: worker/train/resident_steps.h) ----
  // The worker keeps the variables, optimizer slots and moving averages on its devices and trains them there;
  // this in-process ps stays the owner of checkpoint policy and files (same format, so resume and dtrain_eval
  // work unchanged). Only for a ps that no worker pushes to while these are used: nothing else may touch the
  // slices meanwhile. Unavailable (as for pushes) before the chief has registered and the values exist
  // (restored or initialized).
  //
  // The task's whole state now: every slice's values, optimizer slots and moving averages (empty when off),
  // with global_step = task_step = step(). Nothing is written.
  absl::StatusOr<CheckpointData> ExportState();
  // Whether this task's schedule (save_checkpoint_steps / save_checkpoint_secs) saves a checkpoint at global
  // step `step` (as it would when a pushed step brings the global step there); false without checkpoint_dir.
  bool CheckpointDue(int64_t step);
  // Replaces the state of every slice with `slices` (as ExportState returns them; InvalidArgument when they
  // do not match the task's slices and nothing changes) and makes `step` the task's step. With `save` (and a
  // checkpoint_dir), writes it as the checkpoint of that step before returning, as a scheduled save does.
  absl::Status ImportState(int64_t step, const std::vector<SliceState>& slices, bool save);
  // What a commit's PushHeader::input_position does, for steps that are not pushed: worker `worker`'s input
  // stream after the batches of `step` (kept for checkpoints on task 0). InvalidArgument if too large.
  absl::Status RecordInputPosition(int worker, int64_t step, std::string position);

  class Impl;

  // OK, or why the final checkpoint (saved when every worker was done) could not be written even after its
  // retries. Meaningful once finished(); a binary exits non-zero when it is not OK, since the end of training
  // is then not on disk. While another thread is still writing it: Unavailable ("... still being written").
  absl::Status final_checkpoint_status() const;
  // Waits up to `timeout` for a final checkpoint being written (by whichever thread ended the run) to be on disk
  // or to fail; then final_checkpoint_status(). OK at once when none was begun.
  absl::Status WaitFinalCheckpoint(absl::Duration timeout);
  // A snapshot of the push accounting (see PushAccounting); any thread.
  PushAccounting accounting() const;
  // Gradient values that passed the NaN/Inf check at arrival and were not finite when applied (lent shared memory
  // changed in between): applied as 0, each logged. 0 unless a worker broke the protocol.
  int64_t nonfinite_at_apply() const;

 private:
  explicit ParameterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_PARAMETER_SERVER_H_
