// The parameter server's logic, free of any transport: one ParameterServer per ps task holds that task's
// slices of the variables with their optimizer slots and moving averages, applies gradients (sync or async,
// see ps_types.h for the protocol), and on task 0 keeps the global step and the sync decisions.
//
// PsInterface is what a worker talks to. ParameterServer implements it directly (the in-process client);
// ps/grpc_ps_client.h implements it over gRPC; ps/grpc_ps_service.h exposes a ParameterServer over gRPC.
//
// Thread-safety: every method of ParameterServer may be called concurrently from any thread (one gRPC handler
// thread per call). Pull blocks (on a condition variable, never polling) until its condition holds or its
// timeout passes.
//
// Errors:
//   InvalidArgument     malformed request (unknown key, wrong length, bad worker id)
//   FailedPrecondition  config mismatch with the chief's (the message names the differing field), push for a
//                       future step, decisions missing for a step this shard needs, non-chief Initialize,
//                       a checkpoint in checkpoint.dir that does not fit the chief's config, a Pull of moving
//                       averages that are not kept
//   DataLoss            (Register, sync) the checkpoint of the step ps task 0 restored is corrupt on this task
//   Unavailable         not configured / not initialized yet (the caller retries with backoff)
//   DeadlineExceeded    Pull waited longer than its timeout
#ifndef DTRAIN_PS_PARAMETER_SERVER_H_
#define DTRAIN_PS_PARAMETER_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ps/checkpoint_options.h"
#include "ps/ps_types.h"

namespace dtrain::ps {

class PsInterface {
 public:
  virtual ~PsInterface() = default;
  virtual absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) = 0;
  virtual absl::Status Initialize(const InitializeRequest& request) = 0;
  virtual absl::StatusOr<PushResponse> Push(const PushRequest& request) = 0;
  virtual absl::StatusOr<PullResponse> Pull(const PullRequest& request) = 0;
  // The worker has finished training. Sync: the coordinator stops expecting its commits (R becomes
  // min(R, active workers)), and a pending step that now has enough commits is decided.
  virtual absl::Status Done(int worker_id) = 0;
  virtual absl::StatusOr<TrainingStats> GetStats() = 0;
};

// Checkpoints (ps/checkpoint_format.h has the file format, ps/checkpoint_dir.h the names and the restore
// policy). With checkpoint.dir set, each task writes <checkpoint.dir>/model.ckpt-<step>.ps<task>-of-<num_ps>:
// - Sync mode: ps 0 saves when the global step reaches a multiple of checkpoint.save_steps, or when
//   checkpoint.save_secs have passed since its last save, and marks that step's decision (StepDecision::
//   checkpoint); every other task saves when it applies a marked decision. So all tasks save the same steps
//   (their own save_* options are not used) and the files of one step form a consistent checkpoint.
// - Async mode: ps 0 saves by global step / time as above. Each other task saves on its own schedule: when its
//   estimate of the global step (the newest step seen in pushes, + 1) crosses a multiple of
//   checkpoint.save_steps (saved under that multiple), or by time (saved under the estimate). The tasks'
//   files of one step are therefore taken at slightly different moments: consistency across tasks is best
//   effort in async mode, as with TensorFlow's Saver on asynchronous training.
// - When every worker has reported Done, each task saves a final checkpoint (unless it just saved that step);
//   finished() turns true only after it was written, or failed: final_checkpoint_status() says which.
// - State is copied under the lock; the file is written outside it by the calling RPC thread through a
//   CheckpointWriter (ps/checkpoint_writer.h: atomically, retried checkpoint.max_attempts times with backoff),
//   then all but the newest checkpoint.keep files of this task are deleted. A periodic save that still fails
//   is logged (LOG(ERROR)) and training goes on; the previous checkpoint stays intact.
// - Restore: when the chief registers and the task holds no values, it restores the checkpoint chosen by
//   RegisterRequest::restore_step (see FindCheckpointToRestore) before answering, so Register returns
//   initialized=true with the restored step, and the chief skips Initialize. A corrupt newest file is skipped
//   with a warning (the previous one is used); a checkpoint of another model, optimizer or layout fails
//   Register with FailedPrecondition and the task stays unconfigured.
struct ParameterServerOptions {
  int task_index = 0;  // 0 = coordinator (global step, sync decisions)
  int num_ps = 1;
  int num_workers = 1;  // from the cluster spec; the server is finished when all of them reported Done
  // CPU threads (OpenMP) for applying the update to large slices. dtrain_ps keeps 1 (its host's cores belong to
  // the workers); an in-process ps in local mode uses the worker's --threads.
  int apply_threads = 1;
  CheckpointOptions checkpoint;  // dir empty = no checkpoints (neither saved nor restored)
  // Test hook: called on the coordinator each time a step is applied (step, contributing workers).
  std::function<void(const StepDecision&)> on_step_applied;
};

class ParameterServer : public PsInterface {
 public:
  explicit ParameterServer(ParameterServerOptions options);
  ~ParameterServer() override;

  absl::StatusOr<RegisterResponse> Register(const RegisterRequest& request) override;
  absl::Status Initialize(const InitializeRequest& request) override;
  absl::StatusOr<PushResponse> Push(const PushRequest& request) override;
  absl::StatusOr<PullResponse> Pull(const PullRequest& request) override;
  absl::Status Done(int worker_id) override;
  absl::StatusOr<TrainingStats> GetStats() override;

  // True once every worker of the cluster has called Done. WaitUntilFinished blocks until then or timeout;
  // returns whether finished.
  bool finished() const;
  bool WaitUntilFinished(absl::Duration timeout);

  int64_t step() const;  // this task's applied step (global step on task 0)

  // OK, or why the final checkpoint (saved when every worker was done) could not be written even after its
  // retries. Meaningful once finished(); a binary exits non-zero when it is not OK, since the end of training
  // is then not on disk.
  absl::Status final_checkpoint_status() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_PARAMETER_SERVER_H_
