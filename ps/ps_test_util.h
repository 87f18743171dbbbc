// Test helpers for ParameterServer tests: an in-process cluster of ps tasks (no sockets) and a simulated
// worker that speaks the protocol of ps_types.h against it, with parameters and gradients as flat buffers.
//
// Thread-safety: SimCluster is immutable after Start (its ParameterServers are thread-safe); each SimWorker
// belongs to one thread.
#ifndef DTRAIN_PS_PS_TEST_UTIL_H_
#define DTRAIN_PS_PS_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/parameter_server.h"
#include "ps/placement.h"
#include "ps/ps_types.h"

namespace dtrain::ps::testing {

// A TrainConfig for tests: sgd at `learning_rate`, no slices (SimCluster fills them per task).
TrainConfig MakeConfig(const std::string& mode, int num_workers, int replicas_to_aggregate,
                       float learning_rate = 0.5f);

struct SimClusterOptions {
  std::vector<VariableInfo> variables;
  int num_ps = 1;
  PlacementOptions placement;
  TrainConfig config;          // slices are filled per task
  std::vector<float> initial;  // flat initial values
  std::function<void(const StepDecision&)> on_step_applied;  // ps 0's hook
  // Checkpoints (ParameterServerOptions); with a checkpoint.dir, Start restores like PsGroup::Connect.
  CheckpointOptions checkpoint;
};

class SimCluster {
 public:
  // Creates the ps tasks, registers every worker (the chief, worker 0, first) and initializes the values.
  // Like PsGroup::Connect, the chief registers with task 0 first: if task 0 restored a checkpoint at step k,
  // the other tasks are asked to restore step k (RegisterRequest::restore_step), else none.
  static absl::StatusOr<std::unique_ptr<SimCluster>> Start(SimClusterOptions options);

  // The step the tasks restored (-1: none; they were initialized from options.initial).
  int64_t restored_step() const { return restored_step_; }

  int num_ps() const { return static_cast<int>(tasks_.size()); }
  int num_workers() const { return num_workers_; }
  ParameterServer& task(int i) { return *tasks_[i]; }
  const Placement& placement() const { return placement_; }
  int64_t total_floats() const { return total_floats_; }

  // The slices of task `t` cut out of a flat buffer.
  std::vector<SliceData> SlicesFor(int t, const std::vector<float>& flat) const;
  // Writes slices pulled from a task into a flat buffer.
  void Scatter(const std::vector<SliceData>& slices, std::vector<float>* flat) const;

 private:
  Placement placement_;
  std::vector<std::unique_ptr<ParameterServer>> tasks_;
  int num_workers_ = 0;
  int64_t total_floats_ = 0;
  int64_t restored_step_ = -1;
};

class SimWorker {
 public:
  SimWorker(SimCluster* cluster, int worker_id) : cluster_(cluster), worker_id_(worker_id) {}

  // Pulls from ps 0 (blocking until min_step, returning decisions since since_step), then from every other
  // task passing those decisions. Fills `params` (flat) and returns ps 0's step.
  absl::StatusOr<int64_t> Pull(int64_t min_step, int64_t since_step, std::vector<float>* params,
                               int64_t timeout_ms = 20000);
  // Pushes a flat gradient computed at `step`: to every task but 0, then with commit to ps 0. Returns ps 0's
  // outcome. With send_twice every push is sent a second time with the same request id (a retry).
  absl::StatusOr<PushResponse::Outcome> Push(int64_t step, const std::vector<float>& grad, bool send_twice = false);
  // Done on every task.
  absl::Status Done();

  bool training_done() const { return training_done_; }

 private:
  SimCluster* cluster_;
  int worker_id_;
  uint64_t next_request_id_ = 1;
  bool training_done_ = false;
};

// A deterministic gradient that depends on the worker, the step and the parameters.
std::vector<float> TestGradient(int worker, int64_t step, const std::vector<float>& params);

}  // namespace dtrain::ps::testing

#endif  // DTRAIN_PS_PS_TEST_UTIL_H_
