// Plain structs of the parameter-server protocol. The gRPC wire format (proto/dtrain.proto) is mapped to and
// from these in one place (ps/grpc_*); nothing else in ps/ or worker/ sees generated proto code.
//
// Vocabulary:
// - The model's parameters form one flat float buffer (see worker/models/model.h). It is cut into *slices*
//   (contiguous ranges, each inside one variable); each slice lives on one ps task and has a cluster-wide key.
// - ps task 0 also holds the *global step* and is the *coordinator*: in sync mode it decides which workers'
//   gradients make up each step (the first R to commit at that step); other ps tasks learn the decisions from
//   workers, who fetch them from ps 0 and pass them along when they pull (so no ps talks to another ps).
//
// Protocol for one worker step (worker w computed gradients on parameters pulled at step s):
//   1. Push(w, s, request_id, gradient slices) to every ps task except 0 (in parallel), then
//   2. Push(..., commit=true) to ps 0 with its slices: ps 0 records the commit. In sync mode, the first
//      R = replicas_to_aggregate commits at step s (s == global step) are accepted; when the R-th arrives ps 0
//      applies step s to its own slices and global_step becomes s+1. Commits for an already decided step are
//      dropped (counted as backup if for the step just decided, stale if older). In async mode each commit
//      applies at once on every shard (shards apply pushes on arrival) and increments the global step.
//   3. Pull(min_step = s+1 in sync, 0 in async, since_step = s) from ps 0: blocks until global_step >= min_step
//      (and, with bounded staleness, until w is no more than max_staleness commits ahead of the slowest active
//      worker); returns ps 0's slices, the global step G, and the sync decisions for steps [s, G).
//   4. Pull(decisions) from every other ps task: each applies the decisions it has not applied yet, in order,
//      then returns its slices.
// Retried pushes carry the same request_id and are not applied twice.
#ifndef DTRAIN_PS_PS_TYPES_H_
#define DTRAIN_PS_PS_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::ps {

// One slice of the flat parameter buffer held by a ps task.
struct SliceSpec {
  uint32_t key = 0;          // cluster-wide id (index in the placement's slice list)
  std::string variable;      // variable name, for logs and checkpoints
  int64_t flat_offset = 0;   // where the slice starts in the model's flat buffer
  int64_t length = 0;        // floats
  bool operator==(const SliceSpec& o) const {
    return key == o.key && variable == o.variable && flat_offset == o.flat_offset && length == o.length;
  }
};

struct OptimizerConfig {
  std::string name = "sgd";  // "sgd", "momentum", "adam"
  float learning_rate = 0.01f;
  // Exponential decay: lr * decay_rate ^ (step / decay_steps), floor()ed when staircase. decay_steps 0 = off.
  int64_t decay_steps = 0;
  float decay_rate = 1.0f;
  bool staircase = false;
  float momentum = 0.9f;    // "momentum"
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;  // "adam" (TensorFlow's defaults)
  bool operator==(const OptimizerConfig& o) const;
};

// What the chief sends when it registers; every other worker's must match (except `slices`, which each ps
// task receives for itself).
struct TrainConfig {
  std::string model_signature;  // models::Signature()
  std::string mode = "sync";    // "sync" or "async"
  int num_workers = 1;          // worker tasks in the cluster spec
  int replicas_to_aggregate = 0;  // sync: R (0 = num_workers)
  int total_num_replicas = 0;     // sync: T (0 = num_workers); T > R means backup workers
  int max_staleness = -1;         // async: bounded staleness s (-1 = unbounded)
  OptimizerConfig optimizer;
  float moving_average_decay = 0.0f;  // 0 = off; else decay = min(d, (1+step)/(10+step))
  std::vector<SliceSpec> slices;      // the slices this ps task holds
};

// A slice's floats in a request or response.
struct SliceData {
  uint32_t key = 0;
  std::vector<float> values;
};

// RegisterRequest::restore_step: which checkpoint a ps task without values restores when the chief registers
// (only with ParameterServerOptions::checkpoint.dir set; ignored once the task holds values).
inline constexpr int64_t kRestoreNewest = -1;  // the newest valid checkpoint of this task (the default)
inline constexpr int64_t kRestoreNone = -2;    // none: the chief initializes fresh values

struct RegisterRequest {
  int worker_id = 0;
  bool is_chief = false;
  TrainConfig config;  // from every worker; the chief's is adopted if the ps has none yet
  // kRestoreNewest, kRestoreNone, or a step >= 0: exactly that step's checkpoint. The chief registers with
  // ps task 0 first (kRestoreNewest); if task 0 answers initialized=true at step k, the chief passes
  // restore_step = k to the other tasks, else kRestoreNone, so that all tasks restore the same step (sync: a
  // task that lacks a valid file for step k fails Register with FailedPrecondition/DataLoss; async: it falls
  // back to its newest valid checkpoint with a warning, consistency being best effort there).
  int64_t restore_step = kRestoreNewest;
};
struct RegisterResponse {
  bool initialized = false;  // values present (chief initialized them or a checkpoint was restored)
  int64_t global_step = 0;   // this task's step (the global step on ps 0)
};

struct InitializeRequest {
  int worker_id = 0;             // must be the chief
  std::vector<SliceData> slices; // initial values for every slice of this task
};

// A slice's floats held elsewhere (not owned), e.g. inside received wire messages.
struct SliceRef {
  uint32_t key = 0;
  const float* data = nullptr;
  int64_t length = 0;
};

struct PushRequest {
  int worker_id = 0;
  int64_t step = 0;         // global step at which the gradients were computed
  uint64_t request_id = 0;  // unique per (worker, push); a retry reuses it
  bool commit = false;      // ps 0 only: this worker's push for `step` is complete on all ps tasks
  std::vector<SliceData> gradients;
  // More gradients, not owned (valid for the duration of the call): the gRPC service points these into the
  // received messages instead of copying each slice out first.
  std::vector<SliceRef> gradient_refs;
  // Instead of `gradients`: every slice of the task (as registered) is read from this flat gradient buffer at
  // its flat_offset. Saves copies: the in-process ps reads it directly, the gRPC client chunks straight from it.
  const float* flat_gradients = nullptr;
};
struct PushResponse {
  enum class Outcome { kAccepted, kDuplicate, kDroppedStale, kDroppedBackup };
  Outcome outcome = Outcome::kAccepted;
  int64_t global_step = 0;  // after handling the push
};

// Sync decision: the workers whose gradients make up `step`.
struct StepDecision {
  int64_t step = 0;
  std::vector<int> workers;
  // ps 0 saved a checkpoint right after applying this step (at step + 1): every other task that applies the
  // decision saves one too, so the files of one step form a consistent checkpoint in sync mode.
  bool checkpoint = false;
};

struct PullRequest {
  int worker_id = 0;
  int64_t min_step = 0;    // block until this task's step >= min_step (ps 0: the global step)
  int64_t since_step = 0;  // ps 0: return decisions for [since_step, global_step)
  std::vector<StepDecision> decisions;  // other tasks: apply these first (those already applied are skipped)
  int64_t timeout_ms = 60000;           // give up waiting after this (DeadlineExceeded)
  // If set, the task's slices (as registered) are written straight into this flat parameter buffer at their
  // flat_offsets, and PullResponse::slices stays empty (the gRPC client writes the received chunks there).
  float* flat_out = nullptr;
  // Return the moving averages instead of the values (evaluation with averaged weights); FailedPrecondition
  // when the config keeps none (moving_average_decay 0).
  bool moving_averages = false;
};
struct PullResponse {
  int64_t step = 0;                     // this task's step after the pull
  std::vector<SliceData> slices;        // every slice of this task
  std::vector<StepDecision> decisions;  // ps 0, sync: decisions for [since_step, step)
  bool training_done = false;           // every worker has reported done
};

// What ps 0 reports at the end of training (and dtrain_worker prints on the chief).
struct WorkerStats {
  int worker_id = 0;
  int64_t applied = 0, dropped_stale = 0, dropped_backup = 0, duplicates = 0;
  double wait_seconds = 0.0;  // time spent blocked in Pull
  bool done = false;
};
struct TrainingStats {
  int64_t global_step = 0;
  std::vector<WorkerStats> workers;
  std::vector<int64_t> staleness_histogram;  // async: [k] = pushes applied with staleness k (last bucket: >=)
  int64_t max_staleness_seen = 0;
  int64_t bytes_received = 0, bytes_sent = 0;  // payload bytes (floats * 4) in pushes / pulls on this task
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_PS_TYPES_H_
