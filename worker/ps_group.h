// A worker's connection to all ps tasks. It maps the model's flat parameter/gradient buffer onto the slices
// placed on each task and runs the step protocol of ps/ps_types.h (push to every task, commit on task 0, pull
// from task 0 then from the others with the sync decisions). Talks to any PsInterface: gRPC clients in a real
// cluster, in-process ParameterServers in local mode and in tests.
//
// Thread-safety: one training thread uses a PsGroup; internally it calls the tasks in parallel.
#ifndef DTRAIN_WORKER_PS_GROUP_H_
#define DTRAIN_WORKER_PS_GROUP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ps/parameter_server.h"
#include "ps/ps_types.h"

namespace dtrain::worker {

struct PullResult {
  int64_t step = 0;           // global step of the parameters pulled
  bool training_done = false; // every worker reported done
};

class PsGroup {
 public:
  // tasks[i] talks to ps task i (not owned); placement[i] = slices held by task i (from ps/placement.h).
  // Pushes and pulls pass the flat buffers themselves (PushRequest::flat_gradients, PullRequest::flat_out): an
  // in-process task reads/writes them directly, a gRPC client chunks from / assembles into them.
  PsGroup(std::vector<ps::PsInterface*> tasks, std::vector<std::vector<ps::SliceSpec>> placement,
          int worker_id, bool is_chief);

  // Registers with every task (the chief's config is adopted by each task; others' are checked) and makes sure
  // every task holds values: the chief initializes the tasks that have none with `initial_params` (flat buffer);
  // other workers wait until the chief has. Waits for late ps tasks and for the chief with backoff, logging what
  // it waits for, up to `wait`. FailedPrecondition on config mismatch (not retried).
  absl::Status Connect(const ps::TrainConfig& config, const float* initial_params, absl::Duration wait);

  // Pushes the flat gradient buffer computed at `step`. Returns ps 0's verdict on the commit.
  absl::StatusOr<ps::PushResponse> Push(int64_t step, const float* grads);

  // Pulls the flat parameter buffer. `min_step`: wait until the global step reaches it (sync mode: last
  // pushed step + 1). `since_step`: the step of the previous pull (decisions from it on are relayed).
  // `moving_averages`: fetch the variables' moving averages instead of their values (for evaluation).
  absl::StatusOr<PullResult> Pull(int64_t min_step, int64_t since_step, float* params,
                                  absl::Duration timeout = absl::Seconds(120), bool moving_averages = false);

  absl::Status Done();
  absl::StatusOr<ps::TrainingStats> Stats(int task);  // stats of one task (0 = coordinator)
  int num_tasks() const { return static_cast<int>(tasks_.size()); }

 private:
  std::vector<ps::SliceData> Gather(int task, const float* flat) const;

  std::vector<ps::PsInterface*> tasks_;
  std::vector<std::vector<ps::SliceSpec>> placement_;
  int worker_id_;
  bool is_chief_;
  bool sync_ = true;
  uint64_t next_request_id_;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_PS_GROUP_H_
