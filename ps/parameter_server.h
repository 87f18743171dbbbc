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
//                       future step, decisions missing for a step this shard needs, non-chief Initialize
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

struct ParameterServerOptions {
  int task_index = 0;  // 0 = coordinator (global step, sync decisions)
  int num_ps = 1;
  int num_workers = 1;  // from the cluster spec; the server is finished when all of them reported Done
  // Checkpoints (issue 5): empty dir = none.
  std::string checkpoint_dir;
  int64_t save_checkpoint_steps = 0;  // 0 = off
  double save_checkpoint_secs = 0;    // 0 = off
  int keep_checkpoints = 5;
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

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_PARAMETER_SERVER_H_
