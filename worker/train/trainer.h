// The training loop of one worker: builds the towers, reads its shard of the data, connects to the ps tasks
// (or runs a private in-process ps in local mode), and runs steps (worker/train/training_steps.h) until the global
// step reaches train_steps: in a cluster, and in local mode with CPU towers, parameters are pulled and
// gradients pushed layer by layer, overlapped with compute (worker/train/step_runner.h); in local mode with GPU
// towers the training state stays on the devices (worker/train/resident_steps.h) and the in-process ps only keeps
// the checkpoints. The chief (worker 0) initializes the variables, evaluates test accuracy and prints the ps
// statistics at the end.
//
// Thread-safety: RunTraining is re-entrant (tests run several workers as threads of one process).
#ifndef DTRAIN_WORKER_TRAIN_TRAINER_H_
#define DTRAIN_WORKER_TRAIN_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cancellation.h"
#include "common/trace_recorder.h"
#include "ps/checkpoint/checkpoint_options.h"
#include "ps/core/parameter_server.h"
#include "common/host_memory.h"
#include "worker/data/dataset.h"
#include "worker/models/dlrm.h"
#include "worker/models/model.h"

namespace dtrain::worker {

class ProfileRecorder;  // worker/train/profile_recorder.h
class StepMetrics;      // worker/train/step_metrics.h

struct WorkerOptions {
  // Model and data.
  std::string model = "mlp";              // --model: a built-in name or PATH.onnx (worker/models/registry.h)
  // The model --model names, resolved once (dtrain_worker resolves it in main); null: RunTraining resolves
  // `model` itself. Everything downstream uses this value.
  models::ModelRef resolved_model;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  const data::DatasetPair* dataset = nullptr;  // tests: use this instead of reading data_dir
  bool shuffle = true;  // false: every worker reads its shard in order (reproducible comparisons)
  // Per-channel normalization of the pixels after scaling to [0, 1] (--input_mean/--input_std), in training and
  // evaluation alike; InvalidArgument from RunTraining when it does not fit the images' channels.
  data::Normalization input_normalization;
  data::DataFormat data_format = data::DataFormat::kAuto;  // --data_format
  // Image folders, arrays and CSV (--image_size, --resize_size, --validation_split, --label_column, --npz_arrays,
  // --array_layout), and how their examples are read: threads (0: one per core), the training augmentation, what
  // a file that does not decode does (worker/data/dataset.h).
  data::LoadOptions data_options;
  int input_threads = 0;
  bool augment = true;
  data::BadExamples bad_images = data::BadExamples::kSkip;
  // Online training (--follow): data_dir is a directory where files keep arriving (Criteo text or TFRecord CTR
  // examples; worker/data/batch_stream_follow.h), read once each in name order. Training runs until the global
  // step reaches train_steps (0: no end), until the input ends (no new file for follow_idle_secs; 0: never), or
  // until `input_stop` returns true (polled every step). No test set: the chief validates progressively
  // (eval_window).
  bool follow = false;
  double follow_poll_secs = 1;
  double follow_idle_secs = 0;
  // A file of the followed directory that cannot be read: set aside (one WARNING, counted in TrainingResult) or
  // end the input with its error (the worker then fails: exit 1).
  data::BadExamples bad_records = data::BadExamples::kSkip;
  // The chief of an online run scores each of its batches before it trains on them; every eval_every global steps
  // (eval_every 0: with each of its progress lines, every log_every local steps) and at the end it reports the log
  // loss and AUC of the newest eval_window examples so scored (printed, and TensorBoard window/log_loss,
  // window/auc). 0: no scoring.
  int64_t eval_window = 100000;
  std::function<bool()> input_stop;

  // Models with sparse embedding tables (--model=dlrm): the update of their rows on the ps ("" / 0: the model's
  // default) and the dlrm's shape (worker/models/dlrm.h): passed to the registry when it resolves the model.
  std::string sparse_optimizer;
  float sparse_learning_rate = 0;
  models::DlrmConfig dlrm;
  uint64_t seed = 1;
  // Every sparse table of the model (ps::SparseTableSpec, ps/core/sparse_store.h): expiry after row_ttl_steps
  // global steps or row_ttl_secs seconds untouched (0: none), probabilistic admission, the rows' and their
  // optimizer slots' type on the ps ("fp32", "fp16", "bf16").
  int64_t row_ttl_steps = 0, row_ttl_secs = 0;
  float admit_probability = 1;
  std::string row_dtype = "fp32", row_slot_dtype = "fp32";
  // Sync mode, models with tables: "async" keeps the dense variables synchronous and applies each push's rows as it
  // arrives (PERSIA's hybrid; ps::TrainConfig::sparse_mode).
  std::string sparse_mode = "sync";
  // An elastic job (workers join and leave while it runs: dtrain_ps --max_workers): "" (no: this worker reads
  // shard worker_id of num_workers), "per_worker" (every worker reads the data set's one shuffled order, the
  // batches ps 0 gives it with each step: ps::ElasticView), "global" (every sync step trains on one batch of
  // global_batch examples of that order: the step's workers split it in parts of batch_size times the towers, one
  // round of the towers a part, and each sums the gradients of its parts, scaled so that the ps's average over
  // the workers is the batch's mean gradient).
  std::string elastic_batch;
  int global_batch = 0;  // "global": the examples of a step (0: batch_size x towers x num_workers)
  // The worker's row cache (worker/batch/row_cache.h): up to row_cache_rows rows of each table kept between
  // steps, not pulled again while they are at most row_cache_staleness steps old; the gradients of the steps that
  // used a cached row are summed and pushed when the row is pulled again or leaves the cache. 0 rows: none.
  int64_t row_cache_rows = 0;
  int row_cache_staleness = 0;

  // Training. 0 / "" = the model's default (resolved_model->defaults).
  int64_t train_steps = 2000;  // global steps
  int batch_size = 0;          // per tower
  // 0: an adaptive optimizer other than the model's (adam, rmsprop, adagrad and their PyTorch forms) takes its
  // framework's default rate (ps::FrameworkDefaultLearningRate), any other the model's.
  float learning_rate = 0;
  std::string optimizer;  // a name of ps::OptimizerConfig (ps/api/ps_types.h)
  // Set by ApplyModelDefaults: the learning rate taken and why, one line that RunTraining logs.
  std::string learning_rate_note;
  // The optimizer's hyperparameters; unset: the optimizer's framework default (ps::DefaultOptimizerConfig:
  // PyTorch's for pytorch_* and adamw, TensorFlow's for the others; momentum 0.9 for "momentum").
  std::optional<float> momentum, beta1, beta2, epsilon, weight_decay, rho, initial_accumulator;
  bool nesterov = false;  // momentum
  bool centered = false;  // rmsprop, pytorch_rmsprop
  float clip_norm = 0;    // > 0: clip the gradient to this global L2 norm (each worker's; see ps_types.h)
  // The learning-rate schedule: "exponential" (decay_rate every decay_steps, smooth unless staircase), "step"
  // (the same, staircase), "cosine" (to min_learning_rate over decay_steps; 0: over train_steps - warmup_steps)
  // or "constant". Linear warmup from warmup_start_factor * learning_rate over warmup_steps comes first (the
  // factor 1/3 by default, PyTorch LinearLR's start_factor; without warmup steps it is none of the config's).
  std::string lr_schedule = "exponential";
  // 0 = none, except for cifar10, whose default is the tutorial's staircase decay by 0.1 every 350 epochs.
  int64_t decay_steps = 0;
  float decay_rate = 1.0f;
  bool staircase = false;
  float min_learning_rate = 0;
  int64_t warmup_steps = 0;
  float warmup_start_factor = 1.0f / 3;
  float moving_average_decay = 0;

  // Local mode: the in-process ps checkpoints like dtrain_ps does (see ps/core/parameter_server.h), and writes
  // deltas (its `delta` options; delta.dir defaults to checkpoint.dir).
  ps::CheckpointOptions checkpoint;
  ps::DeltaOptions delta;

  // Distribution.
  std::string mode = "sync";  // sync | async
  int replicas_to_aggregate = 0;  // 0 = all workers
  int total_num_replicas = 0;     // 0 = all workers
  int max_staleness = -1;
  int worker_id = 0;
  int num_workers = 1;
  int num_ps = 1;  // placement is computed for this many tasks

  // Where CPU towers keep their flat parameters and gradients (TowersOptions::host_memory): the shared
  // memory of the ps tasks' transport (ps/shm/), or null for ordinary memory. Not owned.
  HostMemory* host_memory = nullptr;
  // How many slices a large variable may be cut into per ps task (ps::PlacementOptions::pieces_per_task): the
  // worker's --channels_per_ps, so that its connections to a task each carry some of a large layer.
  int slice_pieces_per_task = 1;

  // Compute.
  std::string towers;  // see ParseTowers
  int num_gpus = 0;
  int threads = 1;
  kernels::ComputeDtype compute_dtype = kernels::ComputeDtype::kFp32;  // --compute_dtype
  // Local mode with GPU towers: variables, optimizer slots and moving averages live on the devices and the
  // optimizer runs there (checkpoints still go through the in-process ps). false: every step's gradients go
  // to the in-process ps and its parameters come back, as in a cluster (for comparisons).
  bool device_resident = true;
  // Device-resident steps on GPUs: capture the step once as a CUDA graph and replay it (falls back to eager
  // steps, with one log line saying why, where capture fails).
  bool cuda_graphs = true;
  // Tests: false runs CPU towers through the GPU towers' code paths (models own their buffers; per-layer
  // uploads and downloads in a cluster, device-resident state in local mode), on the CPU backend.
  bool cpu_towers_in_place = true;

  // Reporting.
  int log_every = 100;
  // chief: evaluate every this many global steps (0 = only at the end; online, see eval_window)
  int64_t eval_every = 0;
  bool evaluate = true;         // chief: evaluate at the end
  std::string logdir;           // chief: TensorBoard event files here (empty = none)
  int summary_every = 0;        // chief with logdir: worker/train/summaries.h every this many local steps (0 = off)
  double startup_wait_secs = 300;  // how long to wait for ps tasks / the chief
  bool quiet = false;           // no progress lines (tests)
  double step_timeout_secs = 120;  // how long a step may wait for the ps (another worker's gradients)
  double rpc_retry_secs = 30;      // how long uploads and pulls that fail with Unavailable/DeadlineExceeded retry
  std::string wire_dtype = "fp32";  // fp32 | bf16 | fp16: gradients and parameters on the wire
  // Commits ask ps 0 to apply the push as it arrives (ps::WorkerClientOptions::apply_early): "on", "off", or
  // "auto" (sync, one worker, one ps task, one connection: measured, worker/train/apply_early_tuner.h). Never in
  // local mode.
  std::string apply_early = "auto";
  int step_delay_ms = 0;        // test hook: sleep this long every step (a slow worker)
  int64_t kill_mid_push_at_step = -1;  // test hook: SIGKILL this process mid-push at this step (-1: never)

  // Stopping before the end (SIGTERM/SIGINT, common/stop_signal.h; null: never). Once `stop` is cancelled the
  // worker finishes the step in flight (abandoning it if that takes longer than `stop_grace`; a worker still
  // connecting gives up at once) and leaves the cluster as stopped (ps::Leaving::kStopped, with stop_reason());
  // the chief first pulls the newest parameters, evaluates and exports as at the end, and its leaving ends the
  // run: the ps tasks save a final checkpoint and tell the other workers to stop. TrainingResult::stopped.
  // A change of the job's ps tasks while it runs (dtrain_ctl add-ps / remove-ps; ps::PsSet): `ps_hosts` are the
  // tasks RunTraining was given (their addresses, in order), `connect_ps` makes a client for a task that joins
  // (address, task index). Null: such a change ends this worker with an error that says so.
  std::vector<std::string> ps_hosts;
  std::function<absl::StatusOr<std::unique_ptr<ps::PsInterface>>(const std::string& address, int task)> connect_ps;

  Cancellation* stop = nullptr;
  std::function<std::string()> stop_reason;  // "SIGTERM" (null: "asked to stop")
  absl::Duration stop_grace = absl::Seconds(10);

  // Chief: its model and data flags as "name=value" lines, kept in the checkpoints (ps::TrainConfig::
  // model_flags) so that dtrain_eval --checkpoint=DIR needs nothing else.
  std::vector<std::string> model_flags;

  // Profiling (dtrain_worker --profile_out): the run reports its steps, layers, updates and phases to this
  // recorder (not owned; null: nothing is timed). Only steps that push and pull are profiled.
  ProfileRecorder* profile = nullptr;
  // dtrain_worker --metrics_port: the steps that push and pull count steps and examples and time their parts
  // here, the training loop its input wait (not owned; null: none).
  StepMetrics* metrics = nullptr;
  // Timelines (--trace_steps, --trace_dir): the steps of the recorder's window, their input wait, layers, pushes
  // and pulls (not owned; null: none). The caller writes the file.
  TraceRecorder* trace = nullptr;

  // Output files.
  // This worker's loss of every local step and the learning rate of its update, as CSV
  // "local_step,loss,learning_rate" (exact floats), written as the run goes (PATH.tmp, renamed to PATH at the
  // end: worker/train/step_loss_log.h).
  std::string metrics_file;
  // TrainingResult::losses and learning_rates hold every local step (false: they are dropped once collected, at
  // each progress line, so a run that may never end holds one window: dtrain_worker; last_loss stays).
  bool keep_step_losses = true;
  // A cluster worker: every push ps 0 acknowledged, recorded in a journal file in this directory
  // (ps/client/push_journal.h) for scripts/check_updates.py (empty: none).
  std::string push_journal_dir;
  // Chief: the final parameters written as this ONNX file (the imported file with its initializers trained,
  // worker/models/onnx/onnx_export.h); the model must be an ONNX import (InvalidArgument otherwise).
  std::string export_onnx;
};

struct TrainingResult {
  int64_t global_step = 0;
  int64_t local_steps = 0;        // steps this worker computed
  int64_t examples = 0;           // examples this worker processed
  double seconds = 0;             // wall time of the training loop
  float last_loss = 0;
  std::vector<float> losses;      // loss of every local step, in order (WorkerOptions::keep_step_losses)
  // The learning rate each of those steps' update was applied with (the schedule's value at the global step the
  // step computed at; async: the step of its pull), in the same order.
  std::vector<float> learning_rates;
  double test_accuracy = -1;      // chief only, -1 if not evaluated
  // Chief, models with one logit (sigmoid cross-entropy, e.g. dlrm): the test set's log loss and ROC AUC (-1
  // if not evaluated); test_accuracy is then the share of examples on the right side of 0.5.
  double test_log_loss = -1, test_auc = -1;
  bool test_binary = false;       // test_log_loss and test_auc were evaluated (test_auc NaN for one class)
  std::vector<float> parameters;  // final parameters (flat) as last pulled
  // Chief with export_onnx, models with fixed-size tables: every row of each (Graph::tables order), pulled at
  // the end (TrainingSteps::PullTables).
  std::vector<std::vector<float>> table_rows;
  ps::TrainingStats stats;        // chief: ps 0's statistics
  int64_t first_step = 0;         // global step when training started (> 0 after resuming a checkpoint)
  double test_accuracy_averaged = -1;  // chief, with --moving_average_decay: accuracy of the moving averages
  // Seconds the training loop waited for the input stream's batches (the rest of `seconds` is the steps'): 0 when
  // the input pipeline keeps ahead of the towers.
  double input_wait_seconds = 0;
  // An elastic job's sparse model: steps whose batches, read a step ahead, were not the ones ps 0 placed this
  // worker on, and were drawn again with their rows (a change of the workers; async: the first step).
  int64_t redrawn_steps = 0;
  bool stopped = false;  // stopped before the end (WorkerOptions::stop): it left the cluster as stopped
  // How the run ended, as ps 0 saw it once every worker had left (a cluster worker that completed waits for that,
  // at most a lease and a few seconds; local mode: complete), and its summary line (empty when ps 0 could not be
  // asked). Printed by the chief, and by any worker when the run was not complete.
  ps::RunOutcome outcome = ps::RunOutcome::kComplete;
  std::string outcome_line;
  // Chief of an online run: the progressive validation of the newest eval_window examples at the end (-1: none).
  double window_log_loss = -1, window_auc = -1;
  int64_t window_examples = 0;
  bool input_ended = false;  // an online run's input ended (no new file, or stop) before train_steps
  // An online run: the files its input set aside (WorkerOptions::bad_records = kSkip), and their lines (plain
  // text only).
  int64_t input_files_set_aside = 0, input_lines_set_aside = 0;
  // Models with tables: this worker's rows on the wire per step (ids and fp32 rows pulled and pushed), and the
  // share of the step's ids its row cache served.
  double sparse_bytes_per_step = 0;
  double row_cache_hit_rate = 0;
  // Where the wall-clock went (dtrain_worker's "phases" line): the start of the first training step (after
  // connecting, registering and the initial pull; InfinitePast when none ran) and the seconds of the chief's final
  // evaluation (0: none). The training itself is `seconds`.
  absl::Time training_started = absl::InfinitePast();
  double evaluate_seconds = 0;
};

// Resolves the model (o->resolved_model, when not done yet) and its defaults into `o` (batch size, learning rate,
// optimizer).
absl::Status ApplyModelDefaults(WorkerOptions* o);

// The optimizer config `o` asks for (after ApplyModelDefaults and the model's default schedule): the optimizer's
// framework defaults with o's hyperparameters over them and the schedule resolved. InvalidArgument naming the
// option for an unknown optimizer or schedule, or a value out of range.
absl::StatusOr<ps::OptimizerConfig> OptimizerConfigOf(const WorkerOptions& o);

// Runs training against `tasks` (ps task i at index i; not owned). Empty `tasks` = local mode (an in-process
// ps with one worker, sync: the baseline every cluster size is compared with).
// On failure the worker has told the ps tasks it leaves (ps::Leaving: refused, failed, stopped or peer failed,
// with the error as its reason, so that the ps tasks can end the run or go on without it: a failed chief's ps
// tasks save the final checkpoint before they exit); HowTrainingFailed(status) says which. In local mode a failure
// while training has the in-process ps save the final checkpoint likewise, and the error's message says whether
// it was saved.
absl::StatusOr<TrainingResult> RunTraining(const WorkerOptions& options,
                                           const std::vector<ps::PsInterface*>& tasks);

// How the worker left after RunTraining failed with `s` (decides its exit code, common/exit_codes.h): kRefused
// (its configuration: a bad flag or model, or one the ps tasks refused), kPeerFailed (the run ended elsewhere,
// or the ps tasks could not be reached in time), kStopped (WorkerOptions::stop), kFailed (an error of its own).
ps::Leaving HowTrainingFailed(const absl::Status& s);

// dtrain_worker's exit code (common/exit_codes.h) after RunTraining failed with `failure`, `signal` (0: none) the
// stop signal it received: 2 refused (also when the run ended for another process's refused configuration),
// 128 + signal when it was stopped, or when the run ended elsewhere because of a stop (every process signalled at
// once) or without a reason heard (the ps tasks gone as they stopped); 4 for a run that ended elsewhere for another
// reason (a failure stays a failure, signalled or not); 1 for an error of its own.
int FailedRunExitCode(const absl::Status& failure, int signal);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_TRAINER_H_
