// dtrain_worker: one worker task of a cluster (or --job_name=local: a whole training run in one process).
// Flags → WorkerOptions → RunTraining; the exit code follows common/exit_codes.h: 0 complete, 1 an error of its
// own, 2 a configuration refused (here or by the ps tasks), 3 the run ended degraded (0 with --allow_degraded), 4
// a peer failed, 143/130 stopped by SIGTERM/SIGINT (after leaving the cluster; the chief evaluates and exports
// first).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cluster_flags.h"
#include "common/cluster_spec.h"
#include "common/command_line.h"
#include "common/env.h"
#include "common/exit_codes.h"
#include "common/file_util.h"
#include "common/metrics/metrics_exporter.h"
#include "common/metrics/metrics_flags.h"
#include "common/process_clock.h"
#include "common/process_start.h"
#include "common/stop_signal.h"
#include "common/trace_flags.h"
#include "common/trace_recorder.h"
#include "ps/api/run_exit_code.h"
#include "ps/api/slice_io.h"
#include "ps/checkpoint/checkpoint_options.h"
#include "ps/rpc/grpc_ps_client.h"
#include "ps/rpc/transport.h"
#include "worker/app/model_flags.h"
#include "worker/app/transport_probe.h"
#include "worker/app/worker_metrics.h"
#include "worker/towers/towers.h"
#include "worker/train/step_metrics.h"
#include "worker/train/trainer.h"
#include <prometheus/registry.h>

ABSL_FLAG(std::string, job_name, "", "This task's job: worker (or chief), or local for single-process training");
ABSL_FLAG(int, task_index, -1, "This task's index in its job");
// --ps_hosts, --worker_hosts, --cluster_spec: common/cluster_flags.h; --trace_steps, --trace_dir:
// common/trace_flags.h; --metrics_bind_address: common/metrics/metrics_flags.h (dtrain_ps has them too).

ABSL_FLAG(std::string, model, "mlp",
          "mlp | cnn | convnet | cifar10 | dlrm (click-through-rate data), or PATH.onnx: a model exported as ONNX");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "MNIST IDX, CIFAR-10 binary, TFRecord or Criteo files, an image folder (train/<class>/*.jpg), NumPy arrays "
          "or CSV tables (--data_format)");
ABSL_FLAG(std::string, sparse_optimizer, "",
          "Models with embedding tables: sgd | adagrad | adam (lazy) | ftrl for the rows on the ps (empty: the model's)");
ABSL_FLAG(double, sparse_learning_rate, 0, "Learning rate of --sparse_optimizer (0: the model's)");
ABSL_FLAG(bool, shuffle, true, "Shuffle each worker's shard every epoch (false: read it in order)");
ABSL_FLAG(std::string, metrics_file, "",
          "Write this worker's loss of every local step and the learning rate of its update here, as CSV "
          "local_step,loss,learning_rate (written as the run goes to PATH.tmp, renamed to PATH at the end)");
ABSL_FLAG(std::string, push_journal_dir, "",
          "A cluster worker: record every push ps 0 acknowledged in a journal file in this directory "
          "(pushes.w<task>.*.journal), for scripts/check_updates.py with the ps tasks' --journal_applied");
ABSL_FLAG(std::string, export_onnx, "",
          "Chief, with --model=PATH.onnx: write the trained model as this ONNX file at the end (the imported file "
          "with its initializers trained; a model imported with external data, or over 2 GB, is written as FILE "
          "and its weights as FILE.data beside it)");
ABSL_FLAG(int64_t, train_steps, 2000, "Train until the global step reaches this");
ABSL_FLAG(int, batch_size, 0, "Examples per tower per step (0: the model's default)");
ABSL_FLAG(double, learning_rate, 0,
          "Learning rate (0: the model's default; an adaptive --optimizer other than the model's takes its "
          "framework's: 0.001 for adam, pytorch_adam, adamw (TensorFlow, PyTorch), rmsprop and adagrad (Keras), 0.01 "
          "for pytorch_rmsprop and pytorch_adagrad (PyTorch)). A line of the log says which rate was taken");
ABSL_FLAG(std::string, optimizer, "",
          "sgd | momentum | adam (TensorFlow's) | pytorch_adam (torch.optim.Adam) | adamw (torch.optim.AdamW) | "
          "adagrad (TensorFlow's defaults) | pytorch_adagrad | rmsprop (TensorFlow's) | pytorch_rmsprop "
          "(torch.optim.RMSprop) (empty: the model's default). Unset hyperparameters take the optimizer's "
          "framework defaults");
ABSL_FLAG(std::optional<double>, momentum, std::nullopt,
          "Momentum of --optimizer=momentum (default 0.9) and of the rmsprops (default 0: none)");
ABSL_FLAG(bool, nesterov, false, "--optimizer=momentum: Nesterov momentum (torch.optim.SGD(nesterov=True))");
ABSL_FLAG(std::optional<double>, beta1, std::nullopt, "Adam's beta1 (default 0.9)");
ABSL_FLAG(std::optional<double>, beta2, std::nullopt, "Adam's beta2 (default 0.999)");
ABSL_FLAG(std::optional<double>, epsilon, std::nullopt,
          "Epsilon of the adams (1e-8), adagrad (0) / pytorch_adagrad (1e-10), rmsprop (1e-10) / pytorch_rmsprop "
          "(1e-8)");
ABSL_FLAG(std::optional<double>, weight_decay, std::nullopt,
          "Weight decay: L2 (weight_decay * w added to the gradient, PyTorch's weight_decay) for every optimizer but "
          "adamw, whose decay is decoupled (default 0.01 for adamw, else 0)");
ABSL_FLAG(std::optional<double>, rho, std::nullopt,
          "RMSProp's decay of the mean square (rmsprop: 0.9, pytorch_rmsprop's alpha: 0.99)");
ABSL_FLAG(bool, centered, false, "RMSProp: centered (divide by the variance estimate)");
ABSL_FLAG(std::optional<double>, initial_accumulator, std::nullopt,
          "Adagrad's accumulator start (adagrad: 0.1, pytorch_adagrad: 0)");
ABSL_FLAG(double, clip_norm, 0,
          "Clip each worker's gradient to this global L2 norm over every variable on every ps task "
          "(torch.nn.utils.clip_grad_norm_; sync mode averages the clipped gradients) (0: off)");
ABSL_FLAG(std::string, lr_schedule, "exponential",
          "exponential (--decay_rate every --decay_steps; --staircase for steps) | step (StepLR: staircase) | "
          "cosine (to --min_learning_rate over --decay_steps, default the rest of --train_steps) | constant");
ABSL_FLAG(int64_t, decay_steps, 0, "Learning-rate decay period (exponential, step) or length (cosine) (0: off)");
ABSL_FLAG(double, decay_rate, 1.0, "Learning-rate decay factor (exponential, step)");
ABSL_FLAG(bool, staircase, false, "Decay the learning rate in discrete steps");
ABSL_FLAG(double, min_learning_rate, 0, "--lr_schedule=cosine: the rate it ends at");
ABSL_FLAG(int64_t, warmup_steps, 0,
          "Linear learning-rate warmup over this many steps before the schedule (LinearLR + SequentialLR)");
ABSL_FLAG(double, warmup_start_factor, 1.0 / 3,
          "The warmup starts at this fraction of --learning_rate (default 1/3, PyTorch LinearLR's start_factor)");
ABSL_FLAG(double, moving_average_decay, 0, "Keep moving averages of the variables (0: off)");
ABSL_FLAG(uint64_t, seed, 1, "Seed for initialization, shuffling and dropout");
ABSL_FLAG(std::string, mode, "sync", "sync | async");
ABSL_FLAG(int, replicas_to_aggregate, 0, "Sync: gradients averaged per step (0: all workers)");
ABSL_FLAG(int, total_num_replicas, 0, "Sync: workers in total (> replicas_to_aggregate: backup workers)");
ABSL_FLAG(int, max_staleness, -1, "Async: a worker more than this many steps ahead of the slowest waits (-1: off)");
ABSL_FLAG(std::string, towers, "", "Towers: N CPU towers, or gpu:0,gpu:1,...");
ABSL_FLAG(int, num_gpus, 0, "One tower per GPU 0..N-1");
ABSL_FLAG(bool, cuda_graphs, true,
          "GPU towers in local mode: capture the training step once as a CUDA graph and replay it every step "
          "(eager steps where capture fails, with one log line saying why)");
ABSL_FLAG(
    bool, device_resident, true,
    "GPU towers in local mode: keep variables, optimizer slots and moving averages on the devices and run "
    "the optimizer there (false: every step goes through the in-process parameter server on the host)");
ABSL_FLAG(int, log_every, 100, "Print a progress line every this many local steps");
ABSL_FLAG(int64_t, eval_every, 0,
          "Chief: evaluate test accuracy every this many global steps (0: at the end; with --follow, the progressive "
          "validation: 0 reports it with each progress line)");
ABSL_FLAG(std::string, logdir, "", "Chief: write TensorBoard event files here");
ABSL_FLAG(int, summary_every, 0,
          "Chief with --logdir: every this many local steps add the learning rate, ps traffic, staleness and "
          "weight/gradient histograms to the TensorBoard events (0: off)");
// Checkpoint flags are read by dtrain_ps; workers accept them so that one command line serves every process (a
// cluster worker says so once).
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Checkpoints: written and restored by the ps tasks (give it to dtrain_ps; a cluster worker only notes it), "
          "and by the in-process ps of --job_name=local");
ABSL_FLAG(int64_t, save_checkpoint_steps, 0, "Checkpoint every N global steps (ps tasks / local mode)");
ABSL_FLAG(double, save_checkpoint_secs, 0, "Checkpoint every N seconds (ps tasks / local mode)");
ABSL_FLAG(int, keep_checkpoints, 5, "Keep the newest N checkpoints (ps tasks / local mode)");
ABSL_FLAG(int, debug_step_delay_ms, 0, "Test hook: sleep this long every step (simulates a slow worker)");
ABSL_FLAG(int64_t, debug_kill_mid_push_at_step, -1,
          "Test hook: at this global step, kill this process (SIGKILL) right after the first layer's gradients "
          "were handed to the ps tasks, in the middle of its push (-1: never)");
ABSL_FLAG(std::string, auth_token_file, "",
          "The cluster's secret token, sent with every call to the ps tasks (empty: none)");
ABSL_FLAG(std::string, tls_cert, "", "Present this client certificate chain to the ps tasks (PEM; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "The private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_ca, "", "Talk TLS to the ps tasks and trust only certificates signed by this CA (PEM)");
ABSL_FLAG(std::string, tls_server_name, "", "Expect this name in the ps certificates (default: the host of each address)");
ABSL_FLAG(double, startup_wait_secs, 300,
          "How long to wait for the ps tasks and the chief at start (a ps that knows the chief failed says so at "
          "once)");
ABSL_FLAG(bool, allow_degraded, false,
          "Exit 0, not 3, when the run reached its end without some worker (lost, failed or stopped before it): "
          "for elastic jobs where workers may come and go");
ABSL_FLAG(double, stop_grace_secs, 10,
          "After SIGTERM/SIGINT: how long the step in flight may take before it is abandoned (the worker then "
          "leaves the cluster; the chief evaluates and exports first)");
ABSL_FLAG(double, rpc_timeout_secs, 60,
          "Deadline of each call to a ps task (a pull: its wait for the step plus this); a call past it is retried");
ABSL_FLAG(double, rpc_retry_secs, 30,
          "How long calls, uploads and pulls that fail with Unavailable or DeadlineExceeded (a ps task restarting, "
          "a broken or partitioned link) are retried, with backoff, before the worker gives up");
ABSL_FLAG(double, step_timeout_secs, 120, "How long a step may wait for the ps tasks (e.g. for other workers)");
ABSL_FLAG(std::string, transport, "auto",
          "How data reaches the ps tasks: auto (shared memory for a ps task on this host, TCP lanes for one on "
          "another host (gRPC with --tls), gRPC where neither is offered; one log line per task says which and why), "
          "shm (shared memory, failing when a task cannot be reached so), tcp (TCP lanes, failing likewise), grpc. "
          "Control calls always go over gRPC");
ABSL_FLAG(int, channels_per_ps, 1,
          "gRPC: connections to each ps task (1 to 64). With more than one, pushes and pulls are striped by slice "
          "over them (large variables are cut into this many more slices; every worker of a run must give the "
          "same value): for links one TCP connection cannot fill. Shared memory ignores it");
ABSL_FLAG(std::string, apply_early, "auto",
          "Sync with one worker and one ps task on another host: ask the ps to apply each push's slices as they "
          "arrive, so that the pull streams the new values back while the push still uploads (both directions of "
          "the link busy at once; a push that fails takes them back). It pays where a step's transfer far exceeds "
          "its compute (a 1 Gbit link and fp32: 1.23x for the cnn) and costs where it does not (the pull then no "
          "longer overlaps the forward pass). auto: measure both every few thousand steps (12 steps each) and keep "
          "the faster; on (true); off (false)");
ABSL_FLAG(int, shm_spin_us, 20,
          "Shared memory: how long a lane looks for the ps's answer before its thread sleeps in a system call "
          "(more: less wake-up latency, more CPU spent waiting); a pull, whose parameters come once the ps has "
          "applied the step, looks up to 500 us, yielding the core past 20 us to any thread with work. 0: never "
          "look, always sleep");
// Online training and the sparse tables' life cycle (issue: sparse models in production).
ABSL_FLAG(bool, follow, false,
          "Online: --data_dir is a directory where files keep arriving (Criteo text, or TFRecord CTR examples with "
          "--data_format=tfrecord), read once each in name order; training runs until --train_steps (0: no end), "
          "until no new file came for --follow_idle_secs, or until SIGINT/SIGTERM; the chief reports the log loss and "
          "AUC of the newest --eval_window examples, each scored before it was trained on, every --eval_every steps "
          "(0: with each progress line)");
ABSL_FLAG(double, follow_poll_secs, 1, "--follow: how often the directory is listed while waiting for a file");
ABSL_FLAG(double, follow_idle_secs, 0, "--follow: the input ends after this long without a new file (0: never)");
ABSL_FLAG(std::string, bad_records, "skip",
          "--follow: a file that cannot be read or parsed (a line with the wrong number of fields or a bad number, "
          "truncated, unreadable): skip (set the whole file aside with one WARNING naming it, the line and what is "
          "wrong, and go on with the next file; counted in the worker's end lines) | fail (the input ends with the "
          "error: the worker exits 1, and when it is the chief the ps tasks save a final checkpoint first). Either "
          "way a file that fails while it is still being written is read again once it stops changing");
ABSL_FLAG(int64_t, eval_window, 100000, "--follow: the chief's progressive validation covers this many newest examples");
ABSL_FLAG(std::string, row_ttl, "",
          "Models with embedding tables: the ps removes a row not touched for this long: N global steps, or a "
          "duration (30s, 10m, 2h) (empty: never)");
ABSL_FLAG(double, admit_probability, 1.0,
          "Models with embedding tables: an id without a row gets one at a lookup with this probability (beside "
          "--admit_after; 1: always)");
ABSL_FLAG(std::string, row_dtype, "fp32", "Models with embedding tables: how the ps keeps the rows: fp32 | fp16 | bf16");
ABSL_FLAG(std::string, row_slot_dtype, "fp32",
          "Models with embedding tables: how the ps keeps the rows' optimizer slots: fp32 | bf16");
ABSL_FLAG(std::string, elastic_batch, "",
          "Elastic jobs, where workers join (a --task_index past the spec's workers, up to dtrain_ps "
          "--max_workers - 1) and leave while the job runs: per_worker (each worker keeps its batch and reads the "
          "batches ps 0 hands out of one shuffled order of the whole data set, so no example repeats or is missed "
          "as the workers change), or global (every step trains on one batch of --global_batch examples, split "
          "among the step's workers in parts of --batch_size times the towers, each worker summing the gradients "
          "of its parts: the run's arithmetic does not depend on how many workers it had). Every worker of the job "
          "needs the same value. Empty: not elastic");
ABSL_FLAG(int32_t, global_batch, 0,
          "--elastic_batch=global: the examples of every step, a multiple of --batch_size times the towers (0: "
          "--batch_size times the towers times the spec's workers). Every worker of the job needs the same value");
ABSL_FLAG(std::string, sparse_mode, "sync",
          "Sync mode, models with embedding tables: sync (the rows join each step) or async (PERSIA's hybrid: dense "
          "variables stay synchronous, each push's rows are applied as it arrives)");
ABSL_FLAG(int64_t, row_cache_rows, 0,
          "Models with embedding tables: keep up to this many rows of each table on the worker between steps (0: "
          "none); a row fresher than --row_cache_staleness steps is not pulled again");
ABSL_FLAG(int32_t, row_cache_staleness, 4,
          "--row_cache_rows: how many steps a cached row may serve before it is pulled again (its gradients are "
          "summed until then)");
ABSL_FLAG(double, delta_every_secs, 0,
          "ps tasks / local mode: write what changed since the last delta every this many seconds (to --delta_dir)");
ABSL_FLAG(int64_t, delta_every_steps, 0, "ps tasks / local mode: a delta every this many global steps too (0: off)");
ABSL_FLAG(std::string, delta_dir, "", "ps tasks / local mode: where deltas go (default: --checkpoint_dir)");
ABSL_FLAG(std::string, profile_out, "",
          "Write what this run cost as a profile (JSON) to this file at the end: steps, layers, updates, placement, "
          "the transports' CPU per byte (a short loopback exchange after training), for scripts/plan_cluster.py "
          "(docs/planner.md). Meant for --job_name=local");
ABSL_FLAG(std::string, wire_dtype, "fp32",
          "Element type of gradients and parameters on the wire: fp32 | bf16 | fp16 (narrow types halve the "
          "bytes; gradients keep their rounding error for the next step)");
ABSL_FLAG(int, metrics_port, 0,
          "Serve this worker's figures for Prometheus at http://<--metrics_bind_address>:PORT/metrics (steps and "
          "examples, step time and its parts, bytes per transport, RSS; docs/metrics.md). 0: off");

namespace {

constexpr char kExitCodes[] =
    "Exit codes: 0 the run completed; 3 it reached its end without some worker (0 with --allow_degraded); 4 it\n"
    "ended early because of another process (the line names it); 2 a configuration refused (a bad flag, or one\n"
    "the ps tasks refused); 1 an error of this process; 143/130 stopped by SIGTERM/SIGINT (it leaves the cluster\n"
    "first; the chief evaluates and exports first; a second signal stops at once). A --flagfile shared with\n"
    "dtrain_ps may hold its flags: they are ignored here, with one note.";

// A cluster worker refused for its flags still tells the ps tasks it leaves (best effort, a few seconds), so
// that the run does not wait for it: the ps tasks end a run that cannot complete without it (the chief; sync with
// every worker aggregated) and tell the other workers, or go on without it.
void LeaveRefused(const dtrain::ClusterConfig& cluster, const std::string& reason) {
  absl::StatusOr<dtrain::ps::SecurityOptions> security = dtrain::ps::LoadSecurityOptions(
      absl::GetFlag(FLAGS_auth_token_file), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
      absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_server_name));
  if (!security.ok()) return;
  dtrain::ps::GrpcClientOptions copt;
  copt.security = *security;
  copt.retry_window = absl::Seconds(3);
  copt.rpc_timeout = absl::Seconds(5);
  dtrain::ps::DoneRequest request;
  request.worker_id = cluster.task_index;
  request.leaving = dtrain::ps::Leaving::kRefused;
  request.reason = reason;
  request.retry_ms = 3000;
  for (int t = cluster.num_ps() - 1; t >= 0; --t) {
    absl::StatusOr<std::unique_ptr<dtrain::ps::PsInterface>> client =
        dtrain::ps::NewGrpcPsClient(cluster.ps[t], copt);
    if (client.ok()) (*client)->Done(request).IgnoreError();
  }
}

// --row_ttl: "N" (global steps) or a duration ("30s", "10m", "2h"; whole seconds).
absl::Status ParseRowTtl(const std::string& text, int64_t* steps, int64_t* secs) {
  *steps = *secs = 0;
  if (text.empty()) return absl::OkStatus();
  if (absl::SimpleAtoi(text, steps) && *steps > 0) return absl::OkStatus();
  absl::Duration d;
  if (absl::ParseDuration(text, &d) && d >= absl::Seconds(1)) {
    *steps = 0;
    *secs = absl::ToInt64Seconds(d);
    return absl::OkStatus();
  }
  *steps = 0;
  return absl::InvalidArgumentError(absl::StrCat("--row_ttl=", text, ": expected a number of steps (1000) or a "
                                                 "duration of at least a second (30s, 10m, 2h)"));
}

// The other worker tasks of the cluster spec at this task's host (they share its CPUs: --threads=auto).
int OtherWorkersAtThisHost(const dtrain::ClusterConfig& cluster) {
  if (cluster.is_local()) return 0;
  auto host = [](const std::string& address) { return address.substr(0, address.rfind(':')); };
  int n = 0;
  for (int w = 0; w < cluster.num_workers(); ++w) {
    if (w != cluster.task_index && host(cluster.worker[w]) == host(cluster.address())) ++n;
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  const absl::Time started = dtrain::ProcessStartTime().value_or(absl::Now());
  dtrain::CommandLineSpec spec;
  spec.program = "dtrain_worker";
  spec.summary = "one worker task of a cluster, or --job_name=local: a whole training run in one process";
  spec.epilogue = kExitCodes;
  spec.peer_program = "dtrain_ps";
  spec.peer_flags = dtrain::DtrainPsFlagNames();
  dtrain::StopSignals* signals = dtrain::StartProcess(
      argc, argv, spec, "dtrain worker: trains a model against the cluster's parameter servers");
  std::string profile_out = absl::GetFlag(FLAGS_profile_out);
  std::unique_ptr<dtrain::worker::ProfileRecorder> profile;  // made first: the run's start
  if (!profile_out.empty()) profile = std::make_unique<dtrain::worker::ProfileRecorder>();

  absl::StatusOr<dtrain::ClusterConfig> cluster = dtrain::ClusterOfThisTask(
      absl::GetFlag(FLAGS_job_name), absl::GetFlag(FLAGS_task_index), dtrain::TaskBinary::kWorker);
  if (!cluster.ok()) {
    std::fprintf(stderr, "dtrain_worker: %s\n", std::string(cluster.status().message()).c_str());
    return dtrain::kExitConfigRefused;
  }

  dtrain::worker::WorkerOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.shuffle = absl::GetFlag(FLAGS_shuffle);
  o.metrics_file = absl::GetFlag(FLAGS_metrics_file);
  o.keep_step_losses = false;  // the metrics file streams them; a run that may not end keeps a window
  o.push_journal_dir = absl::GetFlag(FLAGS_push_journal_dir);
  o.export_onnx = absl::GetFlag(FLAGS_export_onnx);
  o.train_steps = absl::GetFlag(FLAGS_train_steps);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_learning_rate));
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  auto optional_float = [](const std::optional<double>& v) -> std::optional<float> {
    if (!v) return std::nullopt;
    return static_cast<float>(*v);
  };
  o.momentum = optional_float(absl::GetFlag(FLAGS_momentum));
  o.nesterov = absl::GetFlag(FLAGS_nesterov);
  o.beta1 = optional_float(absl::GetFlag(FLAGS_beta1));
  o.beta2 = optional_float(absl::GetFlag(FLAGS_beta2));
  o.epsilon = optional_float(absl::GetFlag(FLAGS_epsilon));
  o.weight_decay = optional_float(absl::GetFlag(FLAGS_weight_decay));
  o.rho = optional_float(absl::GetFlag(FLAGS_rho));
  o.centered = absl::GetFlag(FLAGS_centered);
  o.initial_accumulator = optional_float(absl::GetFlag(FLAGS_initial_accumulator));
  o.clip_norm = static_cast<float>(absl::GetFlag(FLAGS_clip_norm));
  o.lr_schedule = absl::GetFlag(FLAGS_lr_schedule);
  o.decay_steps = absl::GetFlag(FLAGS_decay_steps);
  o.decay_rate = static_cast<float>(absl::GetFlag(FLAGS_decay_rate));
  o.staircase = absl::GetFlag(FLAGS_staircase);
  o.min_learning_rate = static_cast<float>(absl::GetFlag(FLAGS_min_learning_rate));
  o.warmup_steps = absl::GetFlag(FLAGS_warmup_steps);
  o.warmup_start_factor = static_cast<float>(absl::GetFlag(FLAGS_warmup_start_factor));
  o.moving_average_decay = static_cast<float>(absl::GetFlag(FLAGS_moving_average_decay));
  o.seed = absl::GetFlag(FLAGS_seed);
  o.mode = absl::GetFlag(FLAGS_mode);
  o.replicas_to_aggregate = absl::GetFlag(FLAGS_replicas_to_aggregate);
  o.total_num_replicas = absl::GetFlag(FLAGS_total_num_replicas);
  o.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  o.towers = absl::GetFlag(FLAGS_towers);
  o.num_gpus = absl::GetFlag(FLAGS_num_gpus);
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.device_resident = absl::GetFlag(FLAGS_device_resident);
  o.log_every = absl::GetFlag(FLAGS_log_every);
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.logdir = absl::GetFlag(FLAGS_logdir);
  o.summary_every = absl::GetFlag(FLAGS_summary_every);
  o.startup_wait_secs = absl::GetFlag(FLAGS_startup_wait_secs);
  o.step_timeout_secs = absl::GetFlag(FLAGS_step_timeout_secs);
  o.wire_dtype = absl::GetFlag(FLAGS_wire_dtype);
  o.apply_early = absl::GetFlag(FLAGS_apply_early);
  if (o.apply_early == "true") o.apply_early = "on";
  if (o.apply_early == "false") o.apply_early = "off";
  o.step_delay_ms = absl::GetFlag(FLAGS_debug_step_delay_ms);
  o.kill_mid_push_at_step = absl::GetFlag(FLAGS_debug_kill_mid_push_at_step);
  o.checkpoint.dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.checkpoint.save_steps = absl::GetFlag(FLAGS_save_checkpoint_steps);
  o.checkpoint.save_secs = absl::GetFlag(FLAGS_save_checkpoint_secs);
  o.checkpoint.keep = absl::GetFlag(FLAGS_keep_checkpoints);
  o.worker_id = cluster->is_local() ? 0 : cluster->task_index;
  o.num_workers = cluster->is_local() ? 1 : cluster->num_workers();
  o.num_ps = cluster->is_local() ? 1 : cluster->num_ps();

  o.follow = absl::GetFlag(FLAGS_follow);
  o.follow_poll_secs = absl::GetFlag(FLAGS_follow_poll_secs);
  o.follow_idle_secs = absl::GetFlag(FLAGS_follow_idle_secs);
  o.eval_window = absl::GetFlag(FLAGS_eval_window);
  o.admit_probability = static_cast<float>(absl::GetFlag(FLAGS_admit_probability));
  o.row_dtype = absl::GetFlag(FLAGS_row_dtype);
  o.row_slot_dtype = absl::GetFlag(FLAGS_row_slot_dtype);
  o.sparse_mode = absl::GetFlag(FLAGS_sparse_mode);
  o.elastic_batch = absl::GetFlag(FLAGS_elastic_batch);
  o.global_batch = absl::GetFlag(FLAGS_global_batch);
  if (o.global_batch < 0 || (o.global_batch > 0 && o.elastic_batch != "global")) {
    std::fprintf(stderr, "dtrain_worker: --global_batch=%d: needs --elastic_batch=global and a count > 0\n",
                 o.global_batch);
    return dtrain::kExitConfigRefused;
  }
  if (!o.elastic_batch.empty() && o.elastic_batch != "per_worker" && o.elastic_batch != "global") {
    std::fprintf(stderr, "dtrain_worker: --elastic_batch=%s: expected per_worker or global (or empty)\n",
                 o.elastic_batch.c_str());
    return dtrain::kExitConfigRefused;
  }
  if (cluster->joining && o.elastic_batch.empty()) {
    std::fprintf(stderr, "dtrain_worker: --task_index=%d is past the cluster spec's %d workers: such a worker joins "
                 "a running elastic job, which needs --elastic_batch=per_worker or global (on every worker) and dtrain_ps "
                 "--max_workers > %d\n", cluster->task_index, cluster->num_workers(), cluster->task_index);
    return dtrain::kExitConfigRefused;
  }
  o.row_cache_rows = absl::GetFlag(FLAGS_row_cache_rows);
  o.row_cache_staleness = absl::GetFlag(FLAGS_row_cache_staleness);
  o.delta.every_secs = absl::GetFlag(FLAGS_delta_every_secs);
  o.delta.every_steps = absl::GetFlag(FLAGS_delta_every_steps);
  o.delta.dir = absl::GetFlag(FLAGS_delta_dir);
  if (o.delta.dir.empty()) o.delta.dir = o.checkpoint.dir;
  if (o.follow) {  // SIGTERM/SIGINT also end the input a follower may be waiting on
    dtrain::Cancellation* stop = signals->stop();
    o.input_stop = [stop] { return stop->cancelled(); };
  }
  o.sparse_optimizer = absl::GetFlag(FLAGS_sparse_optimizer);
  o.sparse_learning_rate = static_cast<float>(absl::GetFlag(FLAGS_sparse_learning_rate));
  absl::Status flags_ok = absl::OkStatus();
  {
    absl::StatusOr<dtrain::data::DataFormat> format = dtrain::worker::DataFormatFromFlags();
    absl::StatusOr<dtrain::models::DlrmConfig> dlrm = dtrain::worker::DlrmConfigFromFlags();
    if (!format.ok()) flags_ok = format.status();
    if (flags_ok.ok()) flags_ok = dlrm.status();
    if (flags_ok.ok()) {
      o.data_format = *format;
      o.dlrm = *dlrm;
    }
  }
  if (flags_ok.ok()) {
    absl::StatusOr<dtrain::worker::InputPipeline> input = dtrain::worker::InputPipelineFromFlags();
    flags_ok = input.status();
    if (input.ok()) {
      o.data_options = input->load;
      o.input_threads = input->threads;
      o.augment = input->augment;
      o.bad_images = input->bad_images;
    }
  }
  if (flags_ok.ok() && o.apply_early != "auto" && o.apply_early != "on" && o.apply_early != "off") {
    flags_ok = absl::InvalidArgumentError(absl::StrCat("--apply_early must be auto, on or off, got '",
                                                       o.apply_early, "'"));
  }
  // A pull striped over several connections is never tentative (ps/core/parameter_server.h): nothing to gain.
  if (absl::GetFlag(FLAGS_channels_per_ps) != 1) o.apply_early = "off";
  if (flags_ok.ok()) flags_ok = dtrain::worker::ApplyModelDefaults(&o);
  if (flags_ok.ok()) flags_ok = dtrain::worker::OptimizerConfigOf(o).status();  // bad optimizer flags fail now
  if (flags_ok.ok()) {
    absl::StatusOr<dtrain::data::Normalization> n = dtrain::worker::InputNormalizationFromFlags();
    flags_ok = n.status();
    if (n.ok()) o.input_normalization = *std::move(n);
  }
  o.profile = profile.get();
  std::unique_ptr<dtrain::TraceRecorder> trace;
  if (flags_ok.ok()) {
    absl::StatusOr<std::unique_ptr<dtrain::TraceRecorder>> made =
        dtrain::TimelineFromFlags(cluster->is_local() ? "local worker" : absl::StrCat("worker ", o.worker_id));
    flags_ok = made.status();
    if (made.ok()) trace = *std::move(made);
  }
  o.trace = trace.get();
  for (const std::string* out : {&o.export_onnx, &o.metrics_file, &profile_out}) {
    if (flags_ok.ok() && !out->empty() && !dtrain::Env::Default()->IsDirectory(dtrain::ParentDir(*out))) {
      flags_ok = absl::InvalidArgumentError(absl::StrCat("cannot write ", *out, ": its directory does not exist"));
    }
  }
  if (flags_ok.ok()) flags_ok = dtrain::ps::ParseWireDtype(o.wire_dtype).status();
  o.rpc_retry_secs = absl::GetFlag(FLAGS_rpc_retry_secs);
  if (flags_ok.ok() && !(absl::GetFlag(FLAGS_rpc_timeout_secs) > 0 && o.rpc_retry_secs >= 0)) {
    flags_ok = absl::InvalidArgumentError("--rpc_timeout_secs must be > 0 and --rpc_retry_secs >= 0");
  }
  if (flags_ok.ok()) flags_ok = ParseRowTtl(absl::GetFlag(FLAGS_row_ttl), &o.row_ttl_steps, &o.row_ttl_secs);
  for (const std::string* d : {&o.row_dtype, &o.row_slot_dtype}) {
    if (flags_ok.ok()) flags_ok = dtrain::ps::ParseRowDtype(*d).status();
  }
  if (flags_ok.ok() && !(o.admit_probability > 0 && o.admit_probability <= 1)) {
    flags_ok = absl::InvalidArgumentError("--admit_probability must be in (0, 1]");
  }
  if (flags_ok.ok() && (!(o.follow_poll_secs > 0) || !(o.follow_idle_secs >= 0) || o.eval_window < 0)) {
    flags_ok = absl::InvalidArgumentError("--follow_poll_secs must be > 0, --follow_idle_secs and --eval_window >= 0");
  }
  if (flags_ok.ok()) {
    absl::StatusOr<dtrain::data::BadExamples> bad = dtrain::data::ParseBadExamples(absl::GetFlag(FLAGS_bad_records));
    if (bad.ok()) o.bad_records = *bad;
    if (!bad.ok()) flags_ok = absl::InvalidArgumentError(absl::StrCat("--bad_records: ", bad.status().message()));
  }
  if (flags_ok.ok()) flags_ok = dtrain::ps::ValidateDeltaOptions(o.delta);
  if (flags_ok.ok() && o.sparse_mode != "sync" && o.sparse_mode != "async") {
    flags_ok = absl::InvalidArgumentError(absl::StrCat("--sparse_mode must be sync or async, got '", o.sparse_mode, "'"));
  }
  if (flags_ok.ok() && (o.row_cache_rows < 0 || o.row_cache_staleness < 0)) {
    flags_ok = absl::InvalidArgumentError("--row_cache_rows and --row_cache_staleness must be >= 0");
  }
  if (flags_ok.ok() && !(o.step_timeout_secs > 0)) {
    flags_ok = absl::InvalidArgumentError("--step_timeout_secs must be > 0");
  }
  if (flags_ok.ok() && o.summary_every < 0) flags_ok = absl::InvalidArgumentError("--summary_every must be >= 0");
  if (flags_ok.ok()) {
    absl::StatusOr<dtrain::ThreadDecision> threads =
        dtrain::worker::ThreadsFromFlags(OtherWorkersAtThisHost(*cluster));
    flags_ok = threads.status();
    if (threads.ok()) {
      o.threads = threads->threads;
      if (threads->exceeds_budget) {
        LOG(WARNING) << threads->line;
      } else {
        LOG(INFO) << threads->line;
      }
    }
  }
  if (flags_ok.ok()) flags_ok = dtrain::ps::ValidateCheckpointOptions(o.checkpoint);
  if (flags_ok.ok()) {
    absl::StatusOr<dtrain::kernels::ComputeDtype> dtype = dtrain::worker::ComputeDtypeFromFlags();
    flags_ok = dtype.status();
    if (dtype.ok()) o.compute_dtype = *dtype;
  }
  if (flags_ok.ok()) {
    absl::StatusOr<std::vector<dtrain::kernels::DeviceSpec>> towers =
        dtrain::worker::ParseTowers(o.towers, o.num_gpus, o.threads, o.compute_dtype);
    flags_ok = towers.status();
    if (towers.ok()) {
      for (const auto& spec : *towers) {
        if (spec.kind == dtrain::kernels::DeviceSpec::Kind::kGpu &&
            spec.gpu_index >= dtrain::kernels::CudaDeviceCount()) {
          flags_ok = absl::FailedPreconditionError(absl::StrCat(
              "no CUDA device available: tower ", spec.ToString(), " asked for, ",
              dtrain::kernels::CudaDeviceCount(), " usable CUDA device(s) found"));
        }
      }
    }
  }
  const int metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (flags_ok.ok()) flags_ok = dtrain::metrics::ValidateMetricsEndpointFlags(metrics_port);
  if (!flags_ok.ok()) {
    std::fprintf(stderr, "dtrain_worker: %s\n", std::string(flags_ok.message()).c_str());
    if (!cluster->is_local()) LeaveRefused(*cluster, std::string(flags_ok.message()));
    return dtrain::kExitConfigRefused;
  }
  // --metrics_port: the counters the step figures and the clients keep (declared before the exporter that reads
  // them and the clients that write them: both are destroyed first).
  auto metrics_registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<dtrain::worker::StepMetrics> step_metrics;
  dtrain::worker::TransportCounters transport_counters;
  absl::StatusOr<std::unique_ptr<dtrain::metrics::MetricsExporter>> endpoint =
      dtrain::metrics::StartMetricsEndpoint(metrics_port);
  if (!endpoint.ok()) {
    std::fprintf(stderr, "dtrain_worker: %s\n", std::string(endpoint.status().message()).c_str());
    if (!cluster->is_local()) LeaveRefused(*cluster, std::string(endpoint.status().message()));
    return dtrain::kExitError;
  }
  std::unique_ptr<dtrain::metrics::MetricsExporter> exporter = *std::move(endpoint);
  if (exporter != nullptr) {
    step_metrics = std::make_unique<dtrain::worker::StepMetrics>(metrics_registry.get());
    o.metrics = step_metrics.get();
    exporter->Register(metrics_registry);
    exporter->Register(dtrain::worker::NewWorkerCollector(&transport_counters,
                                                          cluster->is_local() ? o.checkpoint.dir : ""));
    LOG(INFO) << "worker " << o.worker_id << ": serving metrics at " << exporter->url();
  }
  if (!cluster->is_local() && !o.checkpoint.dir.empty()) {
    std::fprintf(stderr, "dtrain_worker: note: --checkpoint_dir=%s is for the ps tasks (each writes its part there: "
                 "give it to dtrain_ps); this cluster worker neither reads nor writes it\n", o.checkpoint.dir.c_str());
  }
  // What dtrain_eval needs to evaluate the checkpoints without this command line: the model and data flags, their
  // paths (--data_dir, an ONNX --model) absolute as this process reads them, since dtrain_eval may run elsewhere.
  o.model_flags = dtrain::FlagValues({"worker/app/data_flags.cc", "worker/app/input_flags.cc"}, {"model", "data_dir"});
  for (std::string& line : o.model_flags) {
    const size_t eq = line.find('=');
    const std::string name = line.substr(0, eq);
    if (name == "data_dir" || (name == "model" && o.resolved_model != nullptr && o.resolved_model->imported())) {
      line = absl::StrCat(name, "=", dtrain::AbsolutePath(line.substr(eq + 1)));
    }
  }
  o.stop = signals->stop();
  o.stop_reason = [signals] { return signals->received_name(); };
  o.stop_grace = absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_stop_grace_secs)));

  std::vector<std::unique_ptr<dtrain::ps::PsInterface>> clients;
  std::vector<dtrain::ps::PsInterface*> tasks;
  if (!cluster->is_local()) {
    LOG(INFO) << cluster->DebugString();
    dtrain::ps::GrpcClientOptions copt;
    absl::StatusOr<dtrain::ps::SecurityOptions> security = dtrain::ps::LoadSecurityOptions(
        absl::GetFlag(FLAGS_auth_token_file), absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
        absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_server_name));
    if (!security.ok()) {
      std::fprintf(stderr, "dtrain_worker: %s\n", std::string(security.status().message()).c_str());
      return dtrain::kExitConfigRefused;
    }
    copt.security = *security;
    copt.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_rpc_timeout_secs));
    copt.retry_window = absl::Seconds(absl::GetFlag(FLAGS_rpc_retry_secs));
    copt.channels = absl::GetFlag(FLAGS_channels_per_ps);
    o.slice_pieces_per_task = copt.channels;
    absl::StatusOr<dtrain::ps::Transport> transport = dtrain::ps::ParseTransport(absl::GetFlag(FLAGS_transport));
    if (!transport.ok()) {
      std::fprintf(stderr, "dtrain_worker: %s\n", std::string(transport.status().message()).c_str());
      return 2;
    }
    dtrain::ps::PsClientOptions popt;
    popt.transport = *transport;
    popt.shm_spin_us = absl::GetFlag(FLAGS_shm_spin_us);
    if (exporter != nullptr) {
      copt.counters = &transport_counters.grpc;
      popt.shm_counters = &transport_counters.shm;
      popt.tcp_counters = &transport_counters.tcp;
    }
    popt.grpc = copt;
    // With shared memory, the towers' flat buffers are what the local ps tasks read and write in place.
    if (*transport == dtrain::ps::Transport::kAuto || *transport == dtrain::ps::Transport::kShm) {
      o.host_memory = popt.memory;
    }
    for (const std::string& address : cluster->ps) {
      popt.task = static_cast<int>(tasks.size());
      auto client = dtrain::ps::NewPsClient(address, popt);
      if (!client.ok()) {
        std::fprintf(stderr, "dtrain_worker: %s\n", std::string(client.status().message()).c_str());
        return dtrain::kExitConfigRefused;
      }
      tasks.push_back(client->get());
      clients.push_back(std::move(*client));
    }
    // A ps task that joins the running job (dtrain_ctl add-ps, dtrain_ps --join) is reached the same way.
    o.ps_hosts = cluster->ps;
    o.connect_ps = [popt](const std::string& address,
                          int task) -> absl::StatusOr<std::unique_ptr<dtrain::ps::PsInterface>> {
      dtrain::ps::PsClientOptions p = popt;
      p.task = task;
      return dtrain::ps::NewPsClient(address, p);
    };
  }
  absl::StatusOr<dtrain::worker::TrainingResult> result = dtrain::worker::RunTraining(o, tasks);
  if (trace != nullptr) {  // whatever the outcome: a failed run's timeline is worth reading too
    absl::StatusOr<std::string> written = dtrain::WriteTimeline(*trace, absl::StrCat("worker-", o.worker_id));
    if (!written.ok()) {
      std::fprintf(stderr, "dtrain_worker: %s\n", std::string(written.status().message()).c_str());
    } else {
      std::printf("%s\n", written->c_str());
    }
  }
  const int signal = signals->received();
  if (result.ok()) {
    // Where this process's wall-clock went (scripts parse it): start-up to the first training step, the training,
    // the chief's final evaluation.
    const absl::Time first_step = result->training_started != absl::InfinitePast() ? result->training_started
                                                                                  : absl::Now();
    std::printf("worker %d: phases: start %.3f s, train %.3f s, evaluate %.3f s\n", o.worker_id,
                absl::ToDoubleSeconds(first_step - started), result->seconds, result->evaluate_seconds);
    std::fflush(stdout);
  }
  if (!result.ok()) {
    const dtrain::ps::Leaving leaving = dtrain::worker::HowTrainingFailed(result.status());
    // The message alone: the status's code name and payloads (the leaving kind) are no words for a user.
    std::fprintf(stderr, "dtrain_worker: %s (%s)\n", std::string(result.status().message()).c_str(),
                 dtrain::ps::LeavingName(leaving));
    return dtrain::worker::FailedRunExitCode(result.status(), signal);
  }
  if (profile != nullptr && !result->stopped) {
    if (absl::Status s = dtrain::worker::FinishProfile(profile.get(), profile_out, {}); !s.ok()) {
      std::fprintf(stderr, "dtrain_worker: --profile_out=%s: %s\n", profile_out.c_str(), std::string(s.message()).c_str());
      return dtrain::kExitError;
    }
    std::printf("profile written to %s\n", profile_out.c_str());
  }
  if (result->stopped) {
    std::fprintf(stderr, "dtrain_worker: stopped by %s at step %lld; it left the cluster\n",
                 signals->received_name().c_str(), static_cast<long long>(result->global_step));
    return dtrain::ExitCodeForSignal(signal != 0 ? signal : SIGTERM);
  }
  return dtrain::ps::ExitCodeOfRun(result->outcome, absl::GetFlag(FLAGS_allow_degraded));
}
