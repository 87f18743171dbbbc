// Plain structs of the parameter-server protocol. The gRPC wire format (proto/dtrain.proto) is mapped to and
// from these in one place (ps/rpc/wire_format.h); nothing else in ps/ or worker/ sees generated proto code.
//
// Vocabulary:
// - The model's parameters form one flat float buffer (see worker/models/model.h). It is cut into *slices*
//   (contiguous ranges, each inside one variable); each slice lives on one ps task and has a cluster-wide key.
//   Keys follow the flat buffer, which follows the layers: key order is forward order.
// - Tensor data travels as *pieces*: floats [offset, offset + n) of one slice (ps/api/slice_io.h). Uploads
//   (Initialize, Push) and downloads (Pull) move pieces; that is the only payload shape.
// - ps task 0 also holds the *global step* and is the *coordinator*: in sync mode it decides which workers'
//   gradients make up each step (the first R to commit at that step); other ps tasks learn the decisions from
//   workers, who fetch them from ps 0 and pass them along when they pull (so no ps talks to another ps).
//
// Protocol for one worker step (worker w computed gradients on parameters pulled at step s):
//   1. Push(w, s, request_id) to every ps task, streaming each layer's gradient slices as soon as backward has
//      produced them (last layer first). The upload to ps 0 carries commit=true and is finished only after the
//      uploads to every other task have finished: a committed push is complete everywhere.
//   2. ps 0 records the commit. In sync mode, the first R = replicas_to_aggregate commits at step s
//      (s == global step) are accepted; the R-th decides step s: the global step becomes s+1 and ps 0 applies
//      the average of the decided workers' gradients slice by slice, in key order. Commits for an already
//      decided step are dropped (counted as backup if for the step just decided, stale if older). In async mode
//      every task applies each slice as soon as it has arrived whole, and a commit on ps 0 increments the
//      global step.
//   3. Pull(min_step = s+1 in sync, 0 in async, since_step = s, after_push = the commit's request id) from ps 0,
//      sent right behind the commit and held until the commit has been handled: the header (global step G, the sync
//      decisions for steps [s, G)) comes once the step is reached (and, with bounded staleness, once w is no
//      more than max_staleness commits ahead of the slowest active worker); then the slices, each as soon as
//      it has been updated to step G, in key order — so a worker can start its next forward pass on the first
//      layers while later ones are still being applied and sent.
//   4. Pull(decisions) from every other ps task (started as soon as ps 0's header has arrived): each applies
//      the decisions it has not applied yet, in order, streaming each slice as soon as it is updated.
// Retried pushes carry the same request_id and are not applied twice, not even in part.
#ifndef DTRAIN_PS_API_PS_TYPES_H_
#define DTRAIN_PS_API_PS_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {
class Cancellation;  // common/cancellation.h
}  // namespace dtrain

namespace dtrain::ps {

enum class WireDtype : uint8_t;  // ps/api/slice_io.h

// One slice of the flat parameter buffer held by a ps task.
struct SliceSpec {
  uint32_t key = 0;          // cluster-wide id (index in the placement's slice list)
  std::string variable;      // variable name, for logs and checkpoints
  int64_t flat_offset = 0;   // where the slice starts in the model's flat buffer
  int64_t length = 0;        // floats
  // false: state, not trained (BatchNorm's running statistics): a pushed "gradient" g is applied as the plain
  // change value -= g (averaged over the step's workers in sync mode, each push as it comes in async mode),
  // whatever the optimizer; no optimizer slots move, no learning rate or decay applies, and its moving average
  // is the value itself.
  bool trainable = true;
  bool operator==(const SliceSpec& o) const {
    return key == o.key && variable == o.variable && flat_offset == o.flat_offset && length == o.length &&
           trainable == o.trainable;
  }
};

// The dense variables' optimizer (its arithmetic: kernels/optimizer_math.h). The defaults below are the fields'
// generic ones; ps::DefaultOptimizerConfig(name) (ps/core/optimizer.h) gives each name its framework's defaults
// (what dtrain_worker's flags start from).
//
// Gradient clipping by global norm (clip_norm > 0), in a cluster: each worker computes the L2 norm of its whole
// dense gradient (the trainable slices of every ps task; not the sparse tables' rows) once backward is done, and
// sends that one number with its upload to every task (SliceUpload::SetGradientNorm); every task scales that
// worker's gradient by min(1, clip_norm / (norm + 1e-6)), so all tasks use the same factor without talking to
// each other. Async: each push is clipped as torch.nn.utils.clip_grad_norm_ clips one step's gradient. Sync:
// the R clipped gradients are averaged (TensorFlow 1.x's clip_by_global_norm before SyncReplicasOptimizer, not
// DDP's clip of the average; with R = 1, and in local mode, the two are the same). A push without its norm is
// refused (FailedPrecondition) while the config clips.
struct OptimizerConfig {
  // "sgd", "momentum" (tf.train.MomentumOptimizer = torch.optim.SGD with momentum, dampening 0), "adam"
  // (TensorFlow's), "pytorch_adam" (torch.optim.Adam's), "adamw" (torch.optim.AdamW: decoupled weight decay),
  // "adagrad" / "pytorch_adagrad" (one update, TensorFlow's / PyTorch's defaults), "rmsprop" (TensorFlow's:
  // epsilon inside the sqrt, ms starting at 1) and "pytorch_rmsprop" (torch.optim.RMSprop's).
  std::string name = "sgd";
  float learning_rate = 0.01f;
  // The learning-rate schedule (kernels/optimizer_math.h): "exponential" (lr * decay_rate ^ (step / decay_steps),
  // floor()ed when staircase; decay_steps 0 = constant) or "cosine" (from learning_rate to min_learning_rate over
  // decay_steps steps, then flat). With warmup_steps > 0 the rate first rises linearly from
  // warmup_start_factor * learning_rate, and the decay starts after the warmup.
  std::string lr_schedule = "exponential";
  int64_t decay_steps = 0;
  float decay_rate = 1.0f;
  bool staircase = false;
  float min_learning_rate = 0.0f;  // "cosine"
  int64_t warmup_steps = 0;
  float warmup_start_factor = 0.0f;
  float momentum = 0.9f;    // "momentum"; the "rmsprop"s' (0: none, and no momentum slot)
  bool nesterov = false;    // "momentum"
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;  // the adams; epsilon also the adagrads and rmsprops
  // L2 weight decay: weight_decay * var added to the gradient (PyTorch's weight_decay of SGD, Adam, Adagrad and
  // RMSprop); "adamw": decoupled, var *= 1 - lr * weight_decay before the update. Trainable variables only.
  float weight_decay = 0.0f;
  float rho = 0.9f;                  // the rmsprops: decay of the mean square (TensorFlow's decay, PyTorch's alpha)
  bool centered = false;             // the rmsprops
  float initial_accumulator = 0.1f;  // the adagrads: the accumulator's start
  float clip_norm = 0.0f;            // > 0: gradients clipped to this global L2 norm (see above)
  // Slot floats per variable element: 0 (sgd), 1 (momentum: accum; adagrad: accumulator), 2 (adam: m, v), and
  // 1-3 for the rmsprops (ms; mom when momentum > 0; mg when centered). 0 for an unknown name.
  int num_slots() const;
  bool operator==(const OptimizerConfig& o) const;
};

// ---- Sparse embedding tables ----
// The element type the ps stores a table's rows in (SparseTableSpec::row_dtype).
enum class RowDtype : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// A table holds rows of `dim` floats keyed by int64 ids. Unlike the dense variables it is not placed: every ps
// task holds the rows whose id it owns (ShardOfId), so hot ids spread over the tasks. A step touches only the
// rows of the ids in its batch: a worker pulls those rows (deduplicated) with its dense pull and pushes their
// gradients (summed per id) with its dense push. Bytes on the wire are proportional to the unique ids.
struct SparseTableSpec {
  uint32_t table = 0;       // cluster-wide index (the position in TrainConfig::tables)
  std::string name;         // for checkpoints, statistics and export ("emb_C1", an ONNX initializer name)
  int dim = 0;              // floats per row
  // > 0: a [rows, dim] variable (ids must be in [0, rows)); 0: a hash table keyed by any int64 id, rows created
  // on first touch.
  int64_t rows = 0;
  // A row's initial value, drawn when the row is created: uniform in [-init_scale, init_scale], deterministic in
  // (init_seed, table, id) (SparseInitialRow), so it does not matter which task or when.
  float init_scale = 0.01f;
  uint64_t init_seed = 0;
  // Memory bound per task: beyond max_rows rows the least recently touched are evicted (0: no bound).
  int64_t max_rows = 0;
  // Admission filter: a row is created only once its id has been looked up this many times; until then it
  // reads as zeros and its gradient is dropped (0 or 1: created at first touch).
  int admit_after = 0;
  // true: the rows start from values the chief uploads with its Initialize (SliceUpload::WriteSparse, each task
  // the ids it owns, every one of them; e.g. an ONNX file's embedding initializer), not from init_scale. Only a
  // fixed-size table without max_rows or admission (it holds every row from the start) may have them. Not kept
  // in checkpoints (their tables hold every row anyway): a restored spec reads false.
  bool initial_values = false;
  // Expiry (--row_ttl): a row not touched (looked up or updated) for ttl_steps global steps, or for ttl_secs
  // seconds, is evicted by the ps's periodic sweep (ps/core/sparse_store.h); at most one of them, 0: never. Not
  // for a table with initial values.
  int64_t ttl_steps = 0;
  int64_t ttl_secs = 0;
  // Probabilistic admission (--admit_probability), beside the count filter admit_after: an id without a row is
  // given one at a lookup with this probability (each lookup a fresh, deterministic draw), in (0, 1]; 1: always.
  float admit_probability = 1.0f;
  // How the ps keeps the rows' values and their optimizer slots (--row_dtype, --row_slot_dtype): fp32, or 16
  // bits (fp16 or bf16; slots bf16 only, for its range), rounded stochastically (deterministic in id and step)
  // when an update is written back. Lookups, checkpoints and deltas carry the values as fp32 (exactly the
  // stored ones). max_rows, admission, expiry and the dtypes may change between a checkpoint and its restore.
  RowDtype row_dtype = RowDtype::kF32;
  RowDtype slot_dtype = RowDtype::kF32;
  bool operator==(const SparseTableSpec& o) const;
};

// "fp32", "fp16", "bf16"; InvalidArgument naming the choices otherwise.
absl::StatusOr<RowDtype> ParseRowDtype(absl::string_view name);
const char* RowDtypeName(RowDtype d);
inline int RowDtypeBytes(RowDtype d) { return d == RowDtype::kF32 ? 4 : 2; }

// The update of the sparse rows (TensorFlow's sparse optimizers; only the touched rows and their slots move).
struct SparseOptimizerConfig {
  std::string name = "adagrad";  // "sgd", "adagrad", "adam" (lazy: only touched rows' moments), "ftrl"
  float learning_rate = 0.01f;   // scheduled as the dense one (OptimizerConfig's lr_schedule, decay and warmup)
  float initial_accumulator = 0.1f;  // adagrad, ftrl (TensorFlow's default 0.1)
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;  // adam
  float l1 = 0.0f, l2 = 0.0f, lr_power = -0.5f;          // ftrl
  // Slot floats per row element: 0 (sgd), 1 (adagrad: accumulator), 2 (adam: m, v; ftrl: z, n).
  int num_slots() const;
  bool operator==(const SparseOptimizerConfig& o) const;
};

// The ps task that holds id's row when there are num_ps tasks: a fixed 64-bit mix of the id modulo num_ps (the
// same on every worker and task).
int ShardOfId(int64_t id, int num_ps);

// SplitMix64's finalizer: a bijection of 64-bit values that spreads every input bit (the ps's id hashes).
uint64_t Mix64(uint64_t x);
// Row `id`'s initial values (dim floats) for a table (SparseTableSpec::init_scale, init_seed).
void SparseInitialRow(const SparseTableSpec& table, int64_t id, float* row);

// The ids of one table a pull asks for (sorted or not, without repeats), and the rows a push brings.
struct SparseIds {
  uint32_t table = 0;
  std::vector<int64_t> ids;
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
  int64_t train_steps = 0;            // training ends at this global step (0: not said); the ps's exit status
  std::vector<SliceSpec> slices;      // the slices this ps task holds
  // What evaluates the checkpoints without the training command line (dtrain_eval --checkpoint=DIR alone): the
  // chief's model and data flags as "name=value" lines (--model, --data_dir, dlrm's shape, ...). Opaque to the
  // ps, which keeps the chief's in its checkpoints; not compared between workers (their paths may differ).
  std::vector<std::string> model_flags;
  // Sparse embedding tables (every task holds its shard of each) and their optimizer. A model may have only
  // tables (no slices on some task).
  std::vector<SparseTableSpec> tables;
  SparseOptimizerConfig sparse_optimizer;
  // Sync mode only: "sync" (the rows join the step like the slices) or "async" (PERSIA's hybrid: the dense
  // variables stay synchronous while each push's rows are applied as soon as it arrives, scaled by 1/R like a
  // step's, and pulls read the rows as they are, without waiting for the step's update).
  std::string sparse_mode = "sync";
  // Elastic jobs (workers join and leave while the job runs, dtrain_ps --max_workers): how a sync step's batch
  // follows the number of workers in it. "" (not elastic: each worker reads its shard of the input, task_index of
  // num_workers, today's way), "per_worker" (each worker keeps its batch: the step's batch grows with the workers)
  // or "global" (the step's batch is global_batch, each worker's global_batch / the step's workers: the run's
  // arithmetic does not depend on how many machines it had). Either way an elastic worker reads the one shuffled
  // order of the whole data set, in the part of each step's batch ps 0 gives it (PullHeader::elastic).
  std::string elastic_batch;
  // Elastic jobs: the batch of the order the workers read (ElasticView::unit): each worker's --batch_size times
  // its towers, the same on every worker. "per_worker": a worker's examples of a step; "global": the part of a
  // step's batch a worker takes at a time (one round of its towers), a worker's share of the step being a run of
  // global_batch / batch_unit such units.
  int batch_unit = 0;
  // "global" elastic jobs: the examples of every step (a multiple of batch_unit; 0 elsewhere).
  int global_batch = 0;
  // The number of ps tasks the slices and rows are placed on (the worker's --ps_hosts, or the set ps 0 announced
  // after a change, PsSet). 0: not stated (tools, tests). A task that runs on another number answers Register
  // with PsSetChangedError (a worker that missed a change learns the new set) and takes Probe and Restore of such
  // a config as the chief's move of the job onto that many tasks (a live reshard, ParameterServer::Restore).
  int num_ps = 0;
  // The job's ps tasks (their addresses, task 0 first) and the version of that set (0: the cluster spec's, never
  // changed; PsSet). Not compared between workers: a ps 0 that restarted after a change adopts the chief's set
  // when the chief restores it, so that it announces and changes the set the job really runs on.
  std::vector<std::string> ps_hosts;
  int64_t ps_version = 0;
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
  uint64_t session = 0;      // carried by every later call of this worker to this task (ps/core/membership.h)
  int64_t lease_ms = 0;      // a worker silent for longer is declared lost (0: never): heartbeat well within
  // Ps 0: where the worker's input stream resumes (BatchStream::SaveState()): when its state was restored from a
  // checkpoint since this worker last committed, where the stream was at that step; else the position its newest
  // commit carried (a restarted worker process reads on where the killed one stopped); empty when there is
  // neither (keep reading where you are).
  std::string input_position;
  // Ps 0, sync: the first step this worker counts in (a worker that joins a running job starts at the next step
  // boundary: it pulls with min_step = join_step). 0: at once.
  int64_t join_step = 0;
  // The most workers this task takes (dtrain_ps --max_workers; the cluster spec's worker count by default).
  int max_workers = 0;
  // The task's steady clock (CLOCK_MONOTONIC, ns) midway through its handling of the call, 0: not said. Against
  // the middle of the worker's round trip it gives the worker's clock offset to the task (NTP's estimate), for
  // timelines (--trace_steps; WorkerClientOptions::trace).
  int64_t clock_ns = 0;
};

// What a ps task could restore (ParameterServer::Probe): the chief picks the newest step every task can restore
// after a ps task restarted, and restores every task to it.
struct CheckpointProbe {
  bool configured = false, initialized = false;
  int64_t step = 0;                      // the task's step when initialized
  std::vector<int64_t> restorable_steps;  // steps of this task's valid checkpoints that fit the config, ascending
  // Ps 0 in sync mode: the oldest step whose decision it still relays (SyncCoordinator::FirstRelayableStep): a
  // task at a step in [first_relayable_step, step of ps 0] is not lost but behind, and catches up from the
  // decisions the next pull relays. Elsewhere: the task's step.
  int64_t first_relayable_step = 0;
  int num_ps = 0;  // the number of ps tasks this task runs among now (a live reshard changes it)
};

// Opens the upload of one worker's gradients for one step to one ps task.
struct PushHeader {
  int worker_id = 0;
  int64_t step = 0;         // global step at which the gradients were computed
  uint64_t request_id = 0;  // unique per (worker, push); a retry reuses it
  bool commit = false;      // ps 0 only: when the upload finishes, this worker's push for `step` is complete
  uint64_t session = 0;     // from RegisterResponse
  // Commits to ps 0 (optional): the worker's input stream position after drawing this step's batches
  // (BatchStream::SaveState(), at most kMaxInputPositionBytes); checkpoints keep it per worker.
  std::string input_position{};  // {}: brace-initializing the fields before it leaves it empty, without a warning
  // The worker takes a tentative pull (PullHeader::tentative) behind this push: ps 0 may apply the push's slices
  // as they arrive, before the commit, when the step can only be this push (sync, one worker, one ps task; see
  // ParameterServer's "early apply"). A worker that does not set it never gets a tentative pull.
  bool apply_early = false;
  // Local only (not sent): cancelling it ends a blocked upload at once (Cancelled). May be null.
  Cancellation* cancel = nullptr;
};
struct PushResponse {
  // kSkippedNonFinite: the gradients held NaN or Inf and the ps task was told to skip them (--nonfinite=skip):
  // counted, not applied (in sync mode the step goes on without them).
  enum class Outcome { kAccepted, kDuplicate, kDroppedStale, kDroppedBackup, kSkippedNonFinite };
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
  // HMAC-SHA256 of the fields above under the cluster token, made by ps 0 (empty without a token): other tasks
  // apply only decisions ps 0 signed, whoever relays them.
  std::string mac{};
  // ps 0 took a delta right after applying this step (at step + 1): every other task that applies the decision
  // writes one too, so the deltas of one step form one consistent state in sync mode (signed like the rest).
  bool delta = false;
  bool operator==(const StepDecision& o) const {
    return step == o.step && workers == o.workers && checkpoint == o.checkpoint && mac == o.mac && delta == o.delta;
  }
};

struct PullRequest {
  int worker_id = 0;
  uint64_t session = 0;    // from RegisterResponse
  int64_t min_step = 0;    // wait until this task's step >= min_step (ps 0: the global step)
  int64_t since_step = 0;  // ps 0: return decisions for [since_step, global_step)
  std::vector<StepDecision> decisions;  // other tasks: apply these first (those already applied are skipped)
  int64_t timeout_ms = 60000;           // give up waiting after this (DeadlineExceeded)
  // Return the moving averages instead of the values (evaluation with averaged weights); FailedPrecondition
  // when the config keeps none (moving_average_decay 0).
  bool moving_averages = false;
  // Non-zero: before anything else, wait until this worker's push with this request id has been handled (its
  // commit recorded, or the push dropped). A worker sends its next pull right behind its commit, on another
  // stream; this keeps the pull from overtaking the commit.
  uint64_t after_push = 0;
  // Element type of the slice data on the wire (a transport matter: in process it is always fp32).
  WireDtype wire_dtype{};
  // Sparse rows to deliver after the slices (only ids this task owns; each table at most once): per table, in
  // the order of `ids`, through PullReceiver::SparseDestination/SparseWritten. An id not admitted yet reads as
  // zeros. Tables keep no moving averages: with moving_averages the rows' values are delivered.
  std::vector<SparseIds> sparse;
  // Read the rows of `sparse` without changing the tables (evaluation, export): an id without a row reads as
  // the row the ps would create for it (SparseInitialRow; zeros while not admitted), and nothing is created,
  // counted or marked recently used.
  bool sparse_read_only = false;
  // One of `parts` pulls that share the work of one (a transport striping a pull over several connections,
  // ps/rpc/ --channels_per_ps): this one delivers only the slices whose index on the task (their order) is
  // `part` modulo `parts`, and the sparse rows only when `part` is 0. Each part waits, relays decisions and sends
  // its header as a whole pull does. InvalidArgument unless 0 <= part < parts <= kMaxPullParts.
  int part = 0;
  int parts = 1;
  // Ps 0 of an async elastic job: -1, this worker does not read ahead (a model without sparse tables: each step's
  // pull takes the next batch); -2, it does and has drawn nothing yet; >= 0, the batch it drew for this pull (its
  // rows are in it): the one ps 0 held for it (ElasticView::next_batch), or the one it trains now (a pull of the
  // same step again). See ps/core/elastic_plan.h.
  int64_t elastic_read_ahead = -1;
  // Local only (not sent): this pull may stream while the worker's push still uploads (the push asked for the
  // early apply, PushHeader::apply_early). A transport that can gives such a pull a connection of its own
  // (ps/rpc/: on a shared one its data would queue ahead of the push's flow-control updates and slow the push).
  bool beside_push = false;
  // Local only (not sent): cancelling it wakes a waiting pull and ends it at once (Cancelled). May be null.
  Cancellation* cancel = nullptr;
};
inline constexpr int kMaxPullParts = 64;
// Ps 0 of an elastic job (TrainConfig::elastic_batch): who the step a pull's header announces counts on, and
// which batches they read. The data set's one shuffled order is cut into batches of `unit` examples (the positions
// of batch k are [k * unit, (k + 1) * unit)). Sync: the workers that count in `step` are `workers` (ascending);
// "per_worker": worker workers[r] reads batch batches[r] (a batch whose gradient did not make it into its step, the
// worker lost or its commit dropped, is handed out again, the oldest first); "global": rows [r * unit / n,
// (r + 1) * unit / n) of batch `first_batch` (n = workers.size()). Async ("per_worker" only): `workers` are the
// active workers and batches[0] is the batch ps 0 handed to the pulling worker alone (each step's pull takes the
// next; a worker that leaves before its next pull gives its batch back). `version` changes whenever the membership
// does (a worker joined, left or was lost).
struct ElasticView {
  int64_t version = 0;
  std::vector<int> workers;
  int aggregating = 0;      // the commits the step is decided with (replicas to aggregate, following the workers)
  int64_t first_batch = 0;  // "global": the step's batch
  std::vector<int64_t> batches;  // "per_worker": see above
  int unit = 0;             // examples of a batch of the order (0: not an elastic job)
  // Async, a worker that reads ahead (PullRequest::elastic_read_ahead != -1): the batch ps 0 holds for its next
  // step's pull (-1: none).
  int64_t next_batch = -1;
  bool operator==(const ElasticView& o) const {
    return version == o.version && workers == o.workers && aggregating == o.aggregating &&
           first_batch == o.first_batch && batches == o.batches && unit == o.unit && next_batch == o.next_batch;
  }
};

// The line of a change of an elastic job's workers at `step`, as ps 0 and the chief log it: "step 840: worker 3
// joined (4 workers, aggregating 4, global batch 400)" (sync: `global_batch` the step's examples), "step 9: worker
// 1 left (1 worker, async, batch 50 each)" (async: `global_batch` each worker's batch); `again`: "; step 840 is
// computed again" (a global step planned again).
std::string DescribeMembershipChange(int64_t step, const std::vector<int>& before, const std::vector<int>& after,
                                     bool sync, int aggregating, int64_t global_batch, bool again = false);

// The first thing a Pull delivers, before any slice data.
// The ps tasks of a job whose ps set changed while it ran (dtrain_ctl add-ps / remove-ps, dtrain_ps --join;
// ps/core/ps_set_plan.h). Ps 0 announces it in every pull's header from `step` on: the workers finish the pull,
// then connect to `hosts` (task t at hosts[t]) with the placement for hosts.size() tasks, and the chief moves the
// state onto them (every task restores the checkpoint of `step` resharded: WorkerClient::Connect). version 0:
// the cluster spec's set, never changed (hosts empty).
struct PsSet {
  int64_t version = 0;
  int64_t step = 0;                 // the global step at which the job moves onto `hosts`
  std::vector<std::string> hosts;   // every task's address, task 0 first
  std::vector<std::string> leaving; // addresses of tasks that leave the job at `step` (remove-ps)
};

struct PullHeader {
  int64_t step = 0;                     // this task's step the values belong to
  std::vector<StepDecision> decisions;  // ps 0, sync: decisions for [since_step, step)
  bool training_done = false;           // every worker has reported done
  // The values stream behind the worker's push still in flight (PushHeader::apply_early): they hold only when
  // the pull ends OK. A pull that ends with an error was taken back (the push failed): the worker must not use
  // any of its values, and pulls again (every slice anew).
  bool tentative = false;
  ElasticView elastic;  // ps 0 of an elastic job (unit > 0); empty elsewhere
  PsSet ps_set;         // ps 0: the job's ps tasks (version 0: the cluster spec's, unchanged)
};

// An operator's command to a ps task (PsInterface::Control; dtrain_ctl), or a worker's step of an async job's move
// onto another set of ps tasks (WorkerClient::MoveTo): "stop-for-move" (ps 0: `worker` pushes nothing more to the
// old set), "cut" (ps 0: once every active worker stopped, it saves its part of the move's checkpoint and takes no
// push; Unavailable until then), "save-for-move" (any task: saves its part as checkpoint `step` and takes no push).
struct ControlRequest {
  std::string command;  // "remove-worker", "drain", "add-ps", "remove-ps", "retire", and the three above
  int worker = -1;      // remove-worker, stop-for-move: which
  std::string reason;   // who asked, for the logs and the workers' lines
  std::string address;  // add-ps: the new task's host:port
  int ps = -1;          // remove-ps: which task
  int64_t step = -1;    // save-for-move: the checkpoint's label (the step ps 0 cut the job at)
};

// How a worker leaves the cluster (Done), which decides how the run ends (docs/faults_and_endings.md).
enum class Leaving : uint8_t {
  kCompleted = 0,  // it completed its training: the global step reached train_steps
  kFailed = 1,     // it stopped on an error of its own
  // Its configuration was refused (a bad flag, or a ps refused its config): in sync mode with every worker
  // aggregated (R = all) the run cannot complete and ends at once; otherwise it goes on without the worker.
  kRefused = 2,
  // It was stopped on request (SIGTERM/SIGINT) before the end. The chief's stop ends the run (after the chief
  // has evaluated and exported): every task saves a final checkpoint and tells the other workers to stop.
  kStopped = 3,
  kPeerFailed = 4,  // it stopped because the run had ended elsewhere (a ps told it so, or a peer was gone)
};
// "completed", "failed", "refused", "stopped", "peer failed".
const char* LeavingName(Leaving leaving);

struct DoneRequest {
  int worker_id = 0;
  uint64_t session = 0;
  Leaving leaving = Leaving::kCompleted;
  int64_t global_step = 0;  // the step the worker reached (0: unknown)
  std::string reason;       // one line: the error or signal it left on (empty when completed)
  // Local only (not sent): how long a transport keeps retrying a task it cannot reach (0: its default). A
  // worker leaving after a failure does not wait long for a ps that may be gone.
  int64_t retry_ms = 0;
};

// What ps 0 reports at the end of training (and dtrain_worker prints on the chief).
struct WorkerStats {
  int worker_id = 0;
  int64_t applied = 0, dropped_stale = 0, dropped_backup = 0, duplicates = 0;
  double wait_seconds = 0.0;  // time spent blocked in Pull
  bool done = false;
  bool failed = false;        // done, but it stopped on an error instead of completing its training
  bool lost = false;          // declared lost (lease ran out) and not back since
  int64_t times_lost = 0;     // how often it was declared lost
  int64_t nonfinite = 0;      // pushes refused or skipped for NaN/Inf gradients
  // Once done or lost: how it left, at which step (this task's step then), and why (the worker's line; for a
  // lost worker the lease that ran out).
  Leaving leaving = Leaving::kCompleted;
  int64_t left_at_step = -1;
  std::string reason;
  // The global step at which this task last knew the worker present: its last Register here, or where this task's
  // leases last (re)started (a start or a restore; -1: never). A worker lost with this at or past train_steps
  // missed no step (SummarizeRun).
  int64_t present_at_step = -1;
};
// How a run ended (docs/faults_and_endings.md; the exit codes follow it: common/exit_codes.h).
enum class RunOutcome {
  kComplete,    // the global step reached train_steps and no worker left before
  kDegraded,    // it reached train_steps, but some worker left before (lost, failed, refused or stopped)
  kRefused,     // it ended at once because a configuration was refused that it cannot do without
  kEndedEarly   // it did not reach train_steps: the run was ended (job_ended says why) or nobody was left
};
// The reason (TrainingStats::job_ended) of a run ended because a configuration was refused starts with this:
// every process then exits 2, as the refused one does (common/exit_codes.h).
inline constexpr char kConfigurationRefused[] = "configuration refused: ";
bool EndedByRefusal(const std::string& why);
// Whether the reason of a run's end is a stop someone asked for: a ps task or the chief "was stopped" (SIGTERM,
// SIGINT, dtrain_ctl drain), as ps 0 words it (ParameterServer::EndRun, a chief leaving stopped).
bool EndedByStop(const std::string& why);
// Once every worker is done or lost: how the run ended, and `line`, the one summary line the ps tasks and the
// chief print: "run complete: training reached step 300 of 300; all 3 workers completed", "run degraded: training
// reached step 300 of 300 without worker 1 (lost at step 120: no contact for 20s)", "run ended early at step 120
// of 300: the chief (worker 0) was stopped at step 120: SIGTERM". `train_steps` 0: not known; `job_ended`: why
// the run ended early, if it did (TrainingStats::job_ended). A worker lost that the task last knew present at
// `train_steps` or later (WorkerStats::present_at_step) missed no step and does not make the run degraded ("run
// complete: ...; worker 1 not heard from after the last step ..."): a ps task restarted after the end cannot see
// that it had reported done before.
// `elastic` (TrainConfig::elastic_batch set): workers that left before the end are comings and goings, not a
// degradation: "run complete: training reached step 300 of 300; 4 workers took part; left before the end: worker 2
// (lost at step 120: ...)".
RunOutcome SummarizeRun(const std::vector<WorkerStats>& workers, int64_t global_step, int64_t train_steps,
                        const std::string& job_ended, std::string* line, bool elastic = false);
// The workers that left without completing (lost, or done but not completed), one phrase each: "worker 1 (lost
// at step 120: no contact for 20s); worker 2 (stopped at step 150: SIGTERM)".
std::string DescribeLeftEarly(const std::vector<WorkerStats>& workers);

// One sparse table's shard on a task.
struct SparseTableStats {
  std::string name;
  int64_t rows = 0;               // rows held now
  int64_t created = 0;            // rows created since the task started (or restored)
  int64_t evicted = 0;            // rows evicted by max_rows
  int64_t expired = 0;            // rows removed by expiry (ttl_steps / ttl_secs)
  int64_t not_admitted = 0;       // lookups of ids not admitted yet (read as zeros): refused by admit_after or
                                  // by admit_probability
  int64_t dropped_gradients = 0;  // row gradients dropped (ids not admitted, or evicted meanwhile)
  int64_t lookups = 0;            // ids pulled
  int64_t updates = 0;            // row updates applied
  int64_t bytes = 0;              // memory the shard takes: rows, ids, index, admission sketch
};
struct TrainingStats {
  int64_t global_step = 0;
  std::vector<WorkerStats> workers;
  std::vector<int64_t> staleness_histogram;  // async: [k] = pushes applied with staleness k (last bucket: >=)
  int64_t max_staleness_seen = 0;
  int64_t bytes_received = 0, bytes_sent = 0;  // payload bytes (values * wire size, + ids) in uploads / pulls
  std::vector<SparseTableStats> tables;      // this task's shard of each table
  // Non-empty once the run ended before its end (a peer failed, was refused or stopped): why. Every later call
  // of a worker gets a job-ended error (ps_interface.h) saying the same.
  std::string job_ended;
  // The step of this task's newest checkpoint on disk (written, or restored); -1: none. The chief waits for ps 0's
  // checkpoint of a move's step before the other tasks restore it (WorkerClient::MoveTo).
  int64_t checkpoint_step = -1;
  // Ps 0: the job's ps tasks when they changed while it ran (ps_set_plan.h; dtrain_ctl status lists those); empty
  // while the cluster spec's set holds.
  std::vector<std::string> ps_hosts;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_API_PS_TYPES_H_
