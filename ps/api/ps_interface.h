// PsInterface: one ps task as a worker sees it, whatever the transport. ParameterServer implements it in process
// (local mode, tests); ps/rpc/grpc_ps_client.h implements it over gRPC; ps/rpc/grpc_ps_service.h serves a
// ParameterServer through it. ps/client/worker_client.h runs the protocol of ps_types.h over a set of them.
//
// Thread-safety: implementations are thread-safe: every method may be called concurrently, and uploads and
// pulls of different workers proceed in parallel. An upload object belongs to one thread.
//
// Errors (all implementations):
//   InvalidArgument     malformed request (unknown key, range outside a slice, bad worker id)
//   FailedPrecondition  config mismatch with the chief's (the message names the differing field), push for a
//                       future step, decisions missing for a step the task needs, non-chief Initialize, an
//                       incomplete commit, a checkpoint that does not fit the chief's config
//   DataLoss            (Register, sync) the checkpoint of the step ps task 0 restored is corrupt on this task
//   Unavailable         not configured / not initialized yet, or the task cannot be reached (retry with backoff)
//   DeadlineExceeded    Pull waited longer than its timeout
//   Aborted             the task has no session for the worker (it restarted or rolled back, or declared the
//                       worker lost): register again (and, on the chief, restore the tasks), then pull
//   PermissionDenied    another process registered as this worker since; or a decision not signed by ps 0
//   ResourceExhausted   a limit (the message names the flag: --max_model_bytes, ...)
//   Unauthenticated     (gRPC) the call lacked the cluster's token
//   OutOfRange          the run has ended before its end (JobEndedError: a peer failed, was refused or stopped;
//                       the message says which): nothing more will happen, the worker stops (exit code 4); or
//                       (Register, Probe) the task has finished the run and only lingers (RunOverError): the
//                       worker ends with the run's outcome instead of training again
#ifndef DTRAIN_PS_API_PS_INTERFACE_H_
#define DTRAIN_PS_API_PS_INTERFACE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ps/api/ps_types.h"
#include "ps/api/slice_io.h"

namespace dtrain::ps {

class PsInterface {
 public:
  virtual ~PsInterface() = default;
  virtual absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) = 0;
  // The chief's initial values for every slice of the task (ignored, successfully, once the task holds values).
  virtual absl::StatusOr<std::unique_ptr<SliceUpload>> StartInitialize(int worker_id) = 0;
  // One worker's gradients for one step (see ps_types.h).
  virtual absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& header) = 0;
  // Waits as the request says, then delivers the header and every slice of the task, in key order, each as
  // soon as it is up to date, then the rows of request.sparse (SparseDestination), to `receiver`. A receiver
  // error ends the pull with that error.
  virtual absl::Status Pull(const PullRequest& request, PullReceiver* receiver) = 0;
  // The worker leaves the cluster: it completed its training, or not (request.leaving says how, request.reason
  // why). Sync: the coordinator stops expecting its commits (R becomes min(R, active workers)), and a pending step
  // that now has enough commits is decided; a refused worker with R = all workers, or the chief stopped or
  // failed, ends the run instead (ps/core/parameter_server.h). `session` must be the worker's current one if it
  // has one here (PermissionDenied otherwise); a worker without one (never registered, refused, forgotten) may
  // leave with any. `global_step`: the step the worker reached (0: unknown); a task that restarted after training
  // ended compares it with its newest checkpoint (ParameterServerOptions).
  virtual absl::Status Done(const DoneRequest& request) = 0;
  // The same without a reason: completed, or failed (tests, tools).
  absl::Status Done(int worker_id, uint64_t session, bool completed, int64_t global_step) {
    DoneRequest request;
    request.worker_id = worker_id;
    request.session = session;
    request.leaving = completed ? Leaving::kCompleted : Leaving::kFailed;
    request.global_step = global_step;
    return Done(request);
  }
  // Renews the worker's lease (any call does; this one does nothing else). Returns the task's step.
  virtual absl::StatusOr<int64_t> Heartbeat(int worker_id, uint64_t session) = 0;
  virtual absl::StatusOr<TrainingStats> GetStats() = 0;
  // What the task holds and could restore under `config` (the chief's, with this task's slices).
  virtual absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& config) = 0;
  // Chief only: (re)configures the task with `config` and restores its checkpoint of `step`, replacing whatever
  // it holds; every worker's session is void afterwards. NotFound when that checkpoint is missing (not written
  // yet), FailedPrecondition/DataLoss when it does not fit or is corrupt (the task is left as it was). A config for
  // another number of ps tasks (TrainConfig::num_ps) moves the job onto them (ps/core/ps_set_plan.h).
  virtual absl::Status Restore(const TrainConfig& config, int worker_id, int64_t step) = 0;
  // An operator's command (dtrain_ctl, over the cluster's authenticated channel): "remove-worker" (ps 0: worker
  // `worker` leaves the job at its next call, RemovedError; the chief cannot be removed: drain), "drain" (the run
  // ends here: this task's state now is saved as its final checkpoint and every worker is told to stop, as on
  // SIGTERM; `reason` says who asked). Returns one line saying what was done; InvalidArgument for an unknown
  // command, FailedPrecondition for one the task cannot do (a worker not active, the chief). Unimplemented where
  // the task does not take commands.
  virtual absl::StatusOr<std::string> Control(const ControlRequest& request) {
    return absl::UnimplementedError(absl::StrCat("'", request.command, "' is not taken here"));
  }

  // Whether uploads and pulls on this task take only as long as the ps's own work (no network in between: a
  // task reached through shared memory, ps/shm/): a caller may then run them in its own thread rather than hand
  // them to another (WorkerClient does), saving the hand-offs. May change over time (an attachment made or
  // lost); any thread.
  virtual bool PrefersInlineCalls() const { return false; }
};

// A PsInterface that hands every call to `target` (not owned; it must outlive this): the base of decorators,
// which override the calls they change. As thread-safe as the target.
class ForwardingPs : public PsInterface {
 public:
  explicit ForwardingPs(PsInterface* target) : target_(target) {}

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) override {
    return target_->Register(request);
  }
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartInitialize(int worker_id) override {
    return target_->StartInitialize(worker_id);
  }
  absl::StatusOr<std::unique_ptr<SliceUpload>> StartPush(const PushHeader& header) override {
    return target_->StartPush(header);
  }
  absl::Status Pull(const PullRequest& request, PullReceiver* receiver) override {
    return target_->Pull(request, receiver);
  }
  using PsInterface::Done;
  absl::Status Done(const DoneRequest& request) override { return target_->Done(request); }
  absl::StatusOr<int64_t> Heartbeat(int worker_id, uint64_t session) override {
    return target_->Heartbeat(worker_id, session);
  }
  absl::StatusOr<TrainingStats> GetStats() override { return target_->GetStats(); }
  absl::StatusOr<CheckpointProbe> Probe(const TrainConfig& config) override { return target_->Probe(config); }
  absl::Status Restore(const TrainConfig& config, int worker_id, int64_t step) override {
    return target_->Restore(config, worker_id, step);
  }
  absl::StatusOr<std::string> Control(const ControlRequest& request) override { return target_->Control(request); }
  bool PrefersInlineCalls() const override { return target_->PrefersInlineCalls(); }

 protected:
  PsInterface* target() const { return target_; }

 private:
  PsInterface* const target_;
};

// The error every call of a worker removed from the job (PsInterface::Control "remove-worker") gets from ps 0
// (FailedPrecondition, `why` in the message): the worker leaves (Leaving::kStopped) and exits 0; the run goes on.
absl::Status RemovedError(absl::string_view why);
// Whether `s` is (or wraps, with a transport's prefix) a RemovedError; RemovedReason: its `why`.
bool IsRemoved(const absl::Status& s);
std::string RemovedReason(const absl::Status& s);

// The answer of a ps task to a worker whose config places the variables on another number of ps tasks than the
// job now has (it missed a change of the ps set, PsSet): Aborted, with the set in the message ("the job's ps
// tasks changed (version 2 at step 840): localhost:2222,localhost:2225"), so that it crosses any transport. The
// worker connects to that set (ParsePsSetChanged) and registers again. Version 0 is the spec's set: ps 0's answer to
// a worker that heard of a change the job lost (ps 0 restarted before the chief moved the state).
absl::Status PsSetChangedError(const PsSet& set);
// The set a PsSetChangedError carries (also with a transport's prefix); nullopt for any other status.
std::optional<PsSet> ParsePsSetChanged(const absl::Status& s);

// The error every call of a worker gets once the run has ended before its end (OutOfRange, `why` in the
// message). A worker that gets it stops at once.
absl::Status JobEndedError(absl::string_view why);
// Whether `s` is (or wraps, with a transport's prefix) a JobEndedError.
bool IsJobEnded(const absl::Status& s);
// The `why` of a JobEndedError (without a transport's prefix); the whole message for any other status.
std::string JobEndedReason(const absl::Status& s);

// The answer of a task that has finished the run (every worker done or lost; it serves a short while longer)
// to a worker that registers or probes then, e.g. a chief restarted just after the others completed: OutOfRange,
// with the run's outcome in the message ("the run is over (complete at step 400): run complete: ..."), so that it
// crosses any transport. Such a worker ends with that outcome (and its exit code) rather than train again
// against a task about to exit.
absl::Status RunOverError(RunOutcome kind, int64_t global_step, absl::string_view line);
struct RunOver {
  RunOutcome kind = RunOutcome::kComplete;
  int64_t global_step = 0;
  std::string line;  // the ps's summary line
};
// The outcome a RunOverError carries (also with a transport's prefix); nullopt for any other status.
std::optional<RunOver> ParseRunOver(const absl::Status& s);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_API_PS_INTERFACE_H_
