// dtrain_worker: one worker task of a cluster (or --job_name=local: a whole training run in one process).
// Flags → WorkerOptions → RunTraining; exit code 0 on success, 2 on bad flags/cluster spec, 1 otherwise.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "common/denormals.h"
#include "common/env.h"
#include "common/malloc_tuning.h"
#include "common/mutex_config.h"
#include "ps/api/slice_io.h"
#include "ps/checkpoint/checkpoint_options.h"
#include "ps/rpc/grpc_ps_client.h"
#include "worker/app/model_flags.h"
#include "worker/towers/towers.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, job_name, "", "This task's job: worker (or chief), or local for single-process training");
ABSL_FLAG(int, task_index, -1, "This task's index in its job");
ABSL_FLAG(std::string, ps_hosts, "", "Comma-separated host:port of the ps tasks");
ABSL_FLAG(std::string, worker_hosts, "", "Comma-separated host:port of the worker tasks");
ABSL_FLAG(std::string, cluster_spec, "", "JSON file {\"ps\": [...], \"worker\": [...]} (else flags or TF_CONFIG)");

ABSL_FLAG(std::string, model, "mlp",
          "mlp | cnn | convnet | cifar10 | dlrm (click-through-rate data), or PATH.onnx: a model exported as ONNX");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "MNIST IDX, CIFAR-10 binary or TFRecord files");
ABSL_FLAG(std::string, sparse_optimizer, "",
          "Models with embedding tables: sgd | adagrad | adam (lazy) | ftrl for the rows on the ps (empty: the model's)");
ABSL_FLAG(double, sparse_learning_rate, 0, "Learning rate of --sparse_optimizer (0: the model's)");
ABSL_FLAG(bool, shuffle, true, "Shuffle each worker's shard every epoch (false: read it in order)");
ABSL_FLAG(std::string, metrics_file, "",
          "Write this worker's loss of every local step here at the end, as CSV local_step,loss");
ABSL_FLAG(std::string, export_onnx, "",
          "Chief, with --model=PATH.onnx: write the trained model as this ONNX file at the end (the imported file "
          "with its initializers trained)");
ABSL_FLAG(int64_t, train_steps, 2000, "Train until the global step reaches this");
ABSL_FLAG(int, batch_size, 0, "Examples per tower per step (0: the model's default)");
ABSL_FLAG(double, learning_rate, 0, "Learning rate (0: the model's default)");
ABSL_FLAG(std::string, optimizer, "", "sgd | momentum | adam (TensorFlow's) | pytorch_adam (torch.optim.Adam's epsilon) (empty: the model's default)");
ABSL_FLAG(double, momentum, 0.9, "Momentum for --optimizer=momentum");
ABSL_FLAG(int64_t, decay_steps, 0, "Exponential learning-rate decay every this many steps (0: off)");
ABSL_FLAG(double, decay_rate, 1.0, "Learning-rate decay factor");
ABSL_FLAG(bool, staircase, false, "Decay the learning rate in discrete steps");
ABSL_FLAG(double, moving_average_decay, 0, "Keep moving averages of the variables (0: off)");
ABSL_FLAG(uint64_t, seed, 1, "Seed for initialization, shuffling and dropout");
ABSL_FLAG(std::string, mode, "sync", "sync | async");
ABSL_FLAG(int, replicas_to_aggregate, 0, "Sync: gradients averaged per step (0: all workers)");
ABSL_FLAG(int, total_num_replicas, 0, "Sync: workers in total (> replicas_to_aggregate: backup workers)");
ABSL_FLAG(int, max_staleness, -1, "Async: a worker more than this many steps ahead of the slowest waits (-1: off)");
ABSL_FLAG(std::string, towers, "", "Towers: N CPU towers, or gpu:0,gpu:1,...");
ABSL_FLAG(int, num_gpus, 0, "One tower per GPU 0..N-1");
ABSL_FLAG(int, threads, 1, "CPU threads for this worker's towers");
ABSL_FLAG(bool, cuda_graphs, true,
          "GPU towers in local mode: capture the training step once as a CUDA graph and replay it every step "
          "(eager steps where capture fails, with one log line saying why)");
ABSL_FLAG(
    bool, device_resident, true,
    "GPU towers in local mode: keep variables, optimizer slots and moving averages on the devices and run "
    "the optimizer there (false: every step goes through the in-process parameter server on the host)");
ABSL_FLAG(int, log_every, 100, "Print a progress line every this many local steps");
ABSL_FLAG(int64_t, eval_every, 0, "Chief: evaluate test accuracy every this many global steps (0: at the end)");
ABSL_FLAG(std::string, logdir, "", "Chief: write TensorBoard event files here");
ABSL_FLAG(int, summary_every, 0,
          "Chief with --logdir: every this many local steps add the learning rate, ps traffic, staleness and "
          "weight/gradient histograms to the TensorBoard events (0: off)");
// Checkpoint flags are read by dtrain_ps; workers accept them so that one command line serves every process.
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Checkpoints: written and restored by the ps tasks (and by the in-process ps of --job_name=local)");
ABSL_FLAG(int64_t, save_checkpoint_steps, 0, "Checkpoint every N global steps (ps tasks / local mode)");
ABSL_FLAG(double, save_checkpoint_secs, 0, "Checkpoint every N seconds (ps tasks / local mode)");
ABSL_FLAG(int, keep_checkpoints, 5, "Keep the newest N checkpoints (ps tasks / local mode)");
ABSL_FLAG(int, debug_step_delay_ms, 0, "Test hook: sleep this long every step (simulates a slow worker)");
ABSL_FLAG(std::string, auth_token_file, "",
          "The cluster's secret token, sent with every call to the ps tasks (empty: none)");
ABSL_FLAG(std::string, tls_cert, "", "Present this client certificate chain to the ps tasks (PEM; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "The private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_ca, "", "Talk TLS to the ps tasks and trust only certificates signed by this CA (PEM)");
ABSL_FLAG(std::string, tls_server_name, "", "Expect this name in the ps certificates (default: the host of each address)");
ABSL_FLAG(double, startup_wait_secs, 300, "How long to wait for the ps tasks and the chief");
ABSL_FLAG(double, step_timeout_secs, 120, "How long a step may wait for the ps tasks (e.g. for other workers)");
// Online training and the sparse tables' life cycle (issue: sparse models in production).
ABSL_FLAG(bool, follow, false,
          "Online: --data_dir is a directory where files keep arriving (Criteo text, or TFRecord CTR examples with "
          "--data_format=tfrecord), read once each in name order; training runs until --train_steps (0: no end), "
          "until no new file came for --follow_idle_secs, or until SIGINT/SIGTERM; the chief reports the log loss and "
          "AUC of the newest --eval_window examples, each scored before it was trained on, every --eval_every steps");
ABSL_FLAG(double, follow_poll_secs, 1, "--follow: how often the directory is listed while waiting for a file");
ABSL_FLAG(double, follow_idle_secs, 0, "--follow: the input ends after this long without a new file (0: never)");
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
ABSL_FLAG(std::string, wire_dtype, "fp32",
          "Element type of gradients and parameters on the wire: fp32 | bf16 | fp16 (narrow types halve the "
          "bytes; gradients keep their rounding error for the next step)");

namespace {

// --follow: SIGINT/SIGTERM end the input (the run then finishes as after its last step: final checkpoint, done).
std::atomic<bool> stop_requested{false};
extern "C" void RequestStop(int) { stop_requested.store(true); }

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

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("dtrain worker: trains a model against the cluster's parameter servers");
  dtrain::TuneMallocForLargeReusedBuffers();
  dtrain::SetFlushDenormals();
  dtrain::DisableMutexDeadlockDetection();  // threads made from here on inherit it
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);

  dtrain::ClusterFlags cf;
  cf.cluster_spec = absl::GetFlag(FLAGS_cluster_spec);
  cf.ps_hosts = absl::GetFlag(FLAGS_ps_hosts);
  cf.worker_hosts = absl::GetFlag(FLAGS_worker_hosts);
  cf.job_name = absl::GetFlag(FLAGS_job_name);
  cf.task_index = absl::GetFlag(FLAGS_task_index);
  const char* tf_config = std::getenv("TF_CONFIG");
  absl::StatusOr<dtrain::ClusterConfig> cluster = dtrain::ResolveCluster(cf, tf_config ? tf_config : "");
  if (!cluster.ok()) {
    std::fprintf(stderr, "dtrain_worker: bad cluster spec: %s\n", std::string(cluster.status().message()).c_str());
    return 2;
  }
  if (cluster->is_ps()) {
    std::fprintf(stderr, "dtrain_worker: this task is a ps task (%s); run dtrain_ps for it\n",
                 cluster->DebugString().c_str());
    return 2;
  }

  dtrain::worker::WorkerOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.shuffle = absl::GetFlag(FLAGS_shuffle);
  o.metrics_file = absl::GetFlag(FLAGS_metrics_file);
  o.export_onnx = absl::GetFlag(FLAGS_export_onnx);
  o.train_steps = absl::GetFlag(FLAGS_train_steps);
  o.batch_size = absl::GetFlag(FLAGS_batch_size);
  o.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_learning_rate));
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  o.decay_steps = absl::GetFlag(FLAGS_decay_steps);
  o.decay_rate = static_cast<float>(absl::GetFlag(FLAGS_decay_rate));
  o.staircase = absl::GetFlag(FLAGS_staircase);
  o.moving_average_decay = static_cast<float>(absl::GetFlag(FLAGS_moving_average_decay));
  o.seed = absl::GetFlag(FLAGS_seed);
  o.mode = absl::GetFlag(FLAGS_mode);
  o.replicas_to_aggregate = absl::GetFlag(FLAGS_replicas_to_aggregate);
  o.total_num_replicas = absl::GetFlag(FLAGS_total_num_replicas);
  o.max_staleness = absl::GetFlag(FLAGS_max_staleness);
  o.towers = absl::GetFlag(FLAGS_towers);
  o.num_gpus = absl::GetFlag(FLAGS_num_gpus);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.device_resident = absl::GetFlag(FLAGS_device_resident);
  o.log_every = absl::GetFlag(FLAGS_log_every);
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.logdir = absl::GetFlag(FLAGS_logdir);
  o.summary_every = absl::GetFlag(FLAGS_summary_every);
  o.startup_wait_secs = absl::GetFlag(FLAGS_startup_wait_secs);
  o.step_timeout_secs = absl::GetFlag(FLAGS_step_timeout_secs);
  o.wire_dtype = absl::GetFlag(FLAGS_wire_dtype);
  o.step_delay_ms = absl::GetFlag(FLAGS_debug_step_delay_ms);
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
  o.row_cache_rows = absl::GetFlag(FLAGS_row_cache_rows);
  o.row_cache_staleness = absl::GetFlag(FLAGS_row_cache_staleness);
  o.delta.every_secs = absl::GetFlag(FLAGS_delta_every_secs);
  o.delta.every_steps = absl::GetFlag(FLAGS_delta_every_steps);
  o.delta.dir = absl::GetFlag(FLAGS_delta_dir);
  if (o.delta.dir.empty()) o.delta.dir = o.checkpoint.dir;
  if (o.follow) {
    std::signal(SIGINT, RequestStop);
    std::signal(SIGTERM, RequestStop);
    o.stop = [] { return stop_requested.load(); };
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
  if (flags_ok.ok()) flags_ok = dtrain::worker::ApplyModelDefaults(&o);
  if (flags_ok.ok()) {
    absl::StatusOr<dtrain::data::Normalization> n = dtrain::worker::InputNormalizationFromFlags();
    flags_ok = n.status();
    if (n.ok()) o.input_normalization = *std::move(n);
  }
  for (const std::string* out : {&o.export_onnx, &o.metrics_file}) {
    if (flags_ok.ok() && !out->empty() && !dtrain::Env::Default()->IsDirectory(dtrain::ParentDir(*out))) {
      flags_ok = absl::InvalidArgumentError(absl::StrCat("cannot write ", *out, ": its directory does not exist"));
    }
  }
  if (flags_ok.ok()) flags_ok = dtrain::ps::ParseWireDtype(o.wire_dtype).status();
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
  if (flags_ok.ok()) flags_ok = dtrain::ps::ValidateCheckpointOptions(o.checkpoint);
  if (flags_ok.ok()) {
    absl::StatusOr<std::vector<dtrain::kernels::DeviceSpec>> towers =
        dtrain::worker::ParseTowers(o.towers, o.num_gpus, o.threads);
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
  if (!flags_ok.ok()) {
    std::fprintf(stderr, "dtrain_worker: %s\n", std::string(flags_ok.message()).c_str());
    return 2;
  }

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
      return 2;
    }
    copt.security = *security;
    for (const std::string& address : cluster->ps) {
      auto client = dtrain::ps::NewGrpcPsClient(address, copt);
      if (!client.ok()) {
        std::fprintf(stderr, "dtrain_worker: %s\n", std::string(client.status().message()).c_str());
        return 2;
      }
      tasks.push_back(client->get());
      clients.push_back(std::move(*client));
    }
  }
  absl::StatusOr<dtrain::worker::TrainingResult> result = dtrain::worker::RunTraining(o, tasks);
  if (!result.ok()) {
    std::fprintf(stderr, "dtrain_worker: %s\n", result.status().ToString().c_str());
    return result.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
