// Test helpers for ParameterServer tests: an in-process cluster of ps tasks (no sockets), a simulated worker that
// runs the protocol through the one WorkerClient (ps/client/worker_client.h) against it, and helpers that upload
// or pull whole slices of one task directly (for tests of a single ParameterServer's request handling).
//
// Thread-safety: SimCluster is immutable after Start (its ParameterServers are thread-safe); each SimWorker
// belongs to one thread.
#ifndef DTRAIN_PS_TESTING_PS_TEST_UTIL_H_
#define DTRAIN_PS_TESTING_PS_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/testing/fault_injecting_ps.h"
#include "ps/core/parameter_server.h"
#include "ps/client/placement.h"
#include "ps/api/ps_types.h"
#include "ps/client/worker_client.h"

namespace dtrain::ps::testing {

// A TrainConfig for tests: sgd at `learning_rate`, no slices (SimCluster fills them per task).
TrainConfig MakeConfig(const std::string& mode, int num_workers, int replicas_to_aggregate,
                       float learning_rate = 0.5f);

// ---- one task, whole slices -----------------------------------------------------------------------------------
using Slices = std::map<uint32_t, std::vector<float>>;  // key -> values

// Sparse gradients of one table: ids and their rows (ids.size() * dim floats).
struct SparseRows {
  uint32_t table = 0;
  std::vector<int64_t> ids;
  std::vector<float> rows;
};

// Uploads every slice whole (one Write each, in key order), then the sparse rows (one WriteSparse each), and
// finishes the upload.
absl::StatusOr<PushResponse> PushSlices(PsInterface& ps, const PushHeader& header, const Slices& slices,
                                        const std::vector<SparseRows>& sparse = {});
absl::Status InitializeSlices(PsInterface& ps, int worker_id, const Slices& slices);
// Pulls into a map (checks that every slice arrives whole and in order); the rows of request.sparse land in
// `rows` (table -> the rows of its ids, in request order).
struct Pulled {
  PullHeader header;
  Slices slices;
  std::map<uint32_t, std::vector<float>> rows;
};
absl::StatusOr<Pulled> PullSlices(PsInterface& ps, const PullRequest& request);

// ---- a cluster ------------------------------------------------------------------------------------------------
struct SimClusterOptions {
  std::vector<VariableInfo> variables;
  int num_ps = 1;
  PlacementOptions placement;
  TrainConfig config;          // slices are filled per task
  std::vector<float> initial;  // flat initial values
  std::vector<InitialRows> initial_rows;  // of the tables with initial values
  std::function<void(const StepDecision&)> on_step_applied;  // ps 0's hook
  // Checkpoints (ParameterServerOptions); with a checkpoint.dir, Start restores like WorkerClient::Connect.
  CheckpointOptions checkpoint;
  DeltaOptions delta;  // ParameterServerOptions::delta of every task
  std::function<absl::Time()> clock;
  absl::Duration worker_timeout = absl::ZeroDuration();  // ParameterServerOptions::worker_timeout (0: no leases)
  std::string decision_key;  // ParameterServerOptions::decision_key of every task
  int max_workers = 0;       // ParameterServerOptions::max_workers of every task (workers past config's join)
  int64_t max_push_rows = int64_t{1} << 22;  // ParameterServerOptions::max_push_rows of every task
  int64_t max_pull_rows = int64_t{1} << 22;  // ParameterServerOptions::max_pull_rows of every task
};

class SimCluster {
 public:
  // Creates the ps tasks and connects every worker (the chief, worker 0, first), which registers them and
  // initializes the values (or restores a checkpoint: the chief's WorkerClient brings every task to the newest
  // step they can all restore).
  static absl::StatusOr<std::unique_ptr<SimCluster>> Start(SimClusterOptions options);

  // The step the tasks restored (-1: none; they were initialized from options.initial).
  int64_t restored_step() const { return restored_step_; }

  int num_ps() const { return static_cast<int>(tasks_.size()); }
  int num_workers() const { return num_workers_; }
  ParameterServer& task(int i) { return *tasks_[i]; }
  const Placement& placement() const { return placement_; }
  int64_t total_floats() const { return total_floats_; }
  const TrainConfig& config() const { return config_; }
  const std::vector<float>& initial() const { return initial_; }

  // Registers `worker` with task `t` again and returns its new session (for tests that call a task directly;
  // the worker's earlier session on that task is void afterwards).
  uint64_t Session(int t, int worker);

  // The slices of task `t` cut out of a flat buffer.
  Slices SlicesFor(int t, const std::vector<float>& flat) const;
  // Writes slices pulled from a task into a flat buffer (resized to total_floats()).
  void Scatter(const Slices& slices, std::vector<float>* flat) const;

 private:
  Placement placement_;
  TrainConfig config_;
  std::vector<float> initial_;
  std::vector<std::unique_ptr<ParameterServer>> tasks_;
  int num_workers_ = 0;
  int64_t total_floats_ = 0;
  int64_t restored_step_ = -1;
};

// One worker speaking the protocol through a WorkerClient (inline, no threads).
class SimWorker {
 public:
  // With `faults`, every task is reached through a FaultInjectingPs. `step_timeout`: how long a pull waits.
  SimWorker(SimCluster* cluster, int worker_id, FaultInjectingPs::Faults faults = {},
            absl::Duration step_timeout = absl::Seconds(20));

  // Pulls (ps 0 blocking until min_step and returning decisions since since_step, then every other task with
  // those decisions) into `params` (resized) and returns ps 0's step.
  absl::StatusOr<int64_t> Pull(int64_t min_step, int64_t since_step, std::vector<float>* params);
  // Pushes a flat gradient computed at `step` to every task (committing on ps 0); returns ps 0's outcome.
  absl::StatusOr<PushResponse::Outcome> Push(int64_t step, const std::vector<float>& grad);
  absl::Status Done();

  bool training_done() const { return training_done_; }
  WorkerClient& client() { return *client_; }

 private:
  SimCluster* cluster_;
  std::vector<std::unique_ptr<FaultInjectingPs>> faulty_;
  std::unique_ptr<WorkerClient> client_;
  absl::Status connected_;
  std::vector<float> grad_;
  bool training_done_ = false;
};

// A deterministic gradient that depends on the worker, the step and the parameters.
std::vector<float> TestGradient(int worker, int64_t step, const std::vector<float>& params);

}  // namespace dtrain::ps::testing

#endif  // DTRAIN_PS_TESTING_PS_TEST_UTIL_H_
