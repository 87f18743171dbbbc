// dtrain_ps: one parameter-server task. Generic like tf.train.Server: it knows the cluster, not the model;
// the chief worker sends the training configuration. Exits by itself once no worker is left: 0 when training
// completed, 3 (with a line naming the lost workers) when every worker was lost or stopped on an error or no chief
// registered within --registration_timeout_secs, 1 when the final checkpoint could not be saved (or another
// error), 2 for bad flags.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/denormals.h"
#include "common/malloc_tuning.h"
#include "common/mutex_config.h"
#include "ps/rpc/server.h"

ABSL_FLAG(std::string, job_name, "", "This task's job (ps)");
ABSL_FLAG(int, task_index, -1, "This task's index in the ps job");
ABSL_FLAG(std::string, ps_hosts, "", "Comma-separated host:port of the ps tasks");
ABSL_FLAG(std::string, worker_hosts, "", "Comma-separated host:port of the worker tasks");
ABSL_FLAG(std::string, cluster_spec, "", "JSON file {\"ps\": [...], \"worker\": [...]} (else flags or TF_CONFIG)");
ABSL_FLAG(std::string, listen_address, "",
          "Address to bind (default: this task's address in the cluster spec; use 0.0.0.0:PORT for all "
          "interfaces)");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Save this task's checkpoints here (model.ckpt-<step>.ps<task>-of-<num_ps>) and restore the newest "
          "valid one when the chief registers (empty: no checkpoints)");
ABSL_FLAG(int64_t, save_checkpoint_steps, 0,
          "Save when the global step reaches a multiple of this (0: off); in sync mode ps 0 decides for all tasks");
ABSL_FLAG(double, save_checkpoint_secs, 0, "Save when this many seconds passed since the last save (0: off)");
ABSL_FLAG(int, keep_checkpoints, 5, "Keep the newest this many checkpoints of this task (0: keep all)");
ABSL_FLAG(std::string, auth_token_file, "",
          "The cluster's secret token: every call must carry it (see ps/rpc/grpc_security.h; empty: no "
          "authentication)");
ABSL_FLAG(std::string, tls_cert, "", "Serve TLS with this certificate chain (PEM; with --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "The private key of --tls_cert (PEM)");
ABSL_FLAG(std::string, tls_ca, "", "Require and verify client certificates signed by this CA (PEM)");
ABSL_FLAG(double, max_run_secs, 0, "Give up and exit 1 after this long (0: wait for the workers forever)");
ABSL_FLAG(double, worker_timeout_secs, 20,
          "A worker silent (no call, no heartbeat) for this long is declared lost: sync training stops waiting for "
          "it and goes on with the others; it may come back by registering again (0: never declare a worker lost)");
ABSL_FLAG(double, registration_timeout_secs, 600,
          "Exit 3 if no chief worker registers within this long after start (0: wait for ever). A task started "
          "again after training ended elsewhere exits once the workers that report to it are done");
ABSL_FLAG(std::string, nonfinite, "reject",
          "Gradients with NaN or Inf: reject (the push fails, nothing applied), skip (counted, left out of the "
          "step) or apply");
ABSL_FLAG(int64_t, max_model_bytes, int64_t{4} << 30,
          "Refuse a chief whose model puts more than this many bytes of variables on this task");
ABSL_FLAG(int64_t, sparse_max_rows_per_table, 0,
          "Hold at most this many rows of each sparse embedding table on this task, whatever the chief's max_rows "
          "(the least recently touched are evicted; 0: the chief's max_rows alone)");
ABSL_FLAG(double, delta_every_secs, 0,
          "Write what changed since the last delta (every touched sparse row with its optimizer state, the ids "
          "removed, the dense variables) every this many seconds to --delta_dir, beside the full checkpoints: "
          "serving follows them (dtrain_eval --follow_deltas) and a restarted task restores its newest checkpoint "
          "plus the deltas after it (0: no deltas)");
ABSL_FLAG(int64_t, delta_every_steps, 0, "A delta every this many global steps too (0: by time only)");
ABSL_FLAG(std::string, delta_dir, "",
          "Where deltas are written and restored from (default: --checkpoint_dir)");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{1} << 30,
          "Memory gRPC may use for this task's connections and messages in flight (a gRPC resource quota)");
ABSL_FLAG(double, malloc_trim_secs, 10,
          "Give the allocator's free pages back to the system this often (common/malloc_tuning.h; 0: never)");
ABSL_FLAG(int, malloc_arenas, 2,
          "At most this many malloc arenas: bounds the memory the allocator keeps (common/malloc_tuning.h; 0: "
          "glibc's default of 8 per core)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("dtrain parameter server task");
  dtrain::TuneMallocForLargeReusedBuffers();
  dtrain::SetFlushDenormals();
  dtrain::DisableMutexDeadlockDetection();  // gRPC's threads made from here on inherit it; handlers set it too
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  if (absl::GetFlag(FLAGS_malloc_arenas) < 0) {
    std::fprintf(stderr, "dtrain_ps: --malloc_arenas=%d must be >= 0\n", absl::GetFlag(FLAGS_malloc_arenas));
    return 2;
  }
  dtrain::LimitMallocArenas(absl::GetFlag(FLAGS_malloc_arenas));  // before gRPC starts its threads
  const double trim_secs = absl::GetFlag(FLAGS_malloc_trim_secs);
  if (!(trim_secs >= 0)) {
    std::fprintf(stderr, "dtrain_ps: --malloc_trim_secs=%g must be >= 0\n", trim_secs);
    return 2;
  }
  dtrain::PeriodicMallocTrim trim(absl::Seconds(trim_secs));

  dtrain::ClusterFlags cf;
  cf.cluster_spec = absl::GetFlag(FLAGS_cluster_spec);
  cf.ps_hosts = absl::GetFlag(FLAGS_ps_hosts);
  cf.worker_hosts = absl::GetFlag(FLAGS_worker_hosts);
  cf.job_name = absl::GetFlag(FLAGS_job_name);
  cf.task_index = absl::GetFlag(FLAGS_task_index);
  const char* tf_config = std::getenv("TF_CONFIG");
  absl::StatusOr<dtrain::ClusterConfig> cluster = dtrain::ResolveCluster(cf, tf_config ? tf_config : "");
  if (!cluster.ok()) {
    std::fprintf(stderr, "dtrain_ps: bad cluster spec: %s\n", std::string(cluster.status().message()).c_str());
    return 2;
  }
  if (!cluster->is_ps()) {
    std::fprintf(stderr, "dtrain_ps: this task is not a ps task (%s); run dtrain_worker for it\n",
                 cluster->DebugString().c_str());
    return 2;
  }
  dtrain::ps::PsServerOptions o;
  o.listen_address = absl::GetFlag(FLAGS_listen_address);
  if (o.listen_address.empty()) o.listen_address = cluster->address();
  o.ps.task_index = cluster->task_index;
  o.ps.num_ps = cluster->num_ps();
  o.ps.num_workers = cluster->num_workers();
  o.ps.checkpoint.dir = absl::GetFlag(FLAGS_checkpoint_dir);
  o.ps.checkpoint.save_steps = absl::GetFlag(FLAGS_save_checkpoint_steps);
  o.ps.checkpoint.save_secs = absl::GetFlag(FLAGS_save_checkpoint_secs);
  o.ps.checkpoint.keep = absl::GetFlag(FLAGS_keep_checkpoints);
  if (o.ps.checkpoint.save_steps < 0 || o.ps.checkpoint.save_secs < 0 || o.ps.checkpoint.keep < 0) {
    std::fprintf(stderr, "dtrain_ps: --save_checkpoint_steps, --save_checkpoint_secs and --keep_checkpoints "
                         "must be >= 0\n");
    return 2;
  }
  const double worker_timeout = absl::GetFlag(FLAGS_worker_timeout_secs);
  if (!(worker_timeout >= 0)) {
    std::fprintf(stderr, "dtrain_ps: --worker_timeout_secs=%g must be >= 0\n", worker_timeout);
    return 2;
  }
  o.ps.worker_timeout = absl::Seconds(worker_timeout);
  const double registration_timeout = absl::GetFlag(FLAGS_registration_timeout_secs);
  if (!(registration_timeout >= 0)) {
    std::fprintf(stderr, "dtrain_ps: --registration_timeout_secs=%g must be >= 0\n", registration_timeout);
    return 2;
  }
  o.ps.registration_timeout =
      registration_timeout > 0 ? absl::Seconds(registration_timeout) : absl::InfiniteDuration();
  absl::StatusOr<dtrain::ps::ParameterServerOptions::NonFinite> nonfinite =
      dtrain::ps::ParseNonFinitePolicy(absl::GetFlag(FLAGS_nonfinite));
  if (!nonfinite.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(nonfinite.status().message()).c_str());
    return 2;
  }
  o.ps.nonfinite = *nonfinite;
  o.ps.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  o.ps.sparse_max_rows = absl::GetFlag(FLAGS_sparse_max_rows_per_table);
  if (o.ps.sparse_max_rows < 0) {
    std::fprintf(stderr, "dtrain_ps: --sparse_max_rows_per_table must be >= 0\n");
    return 2;
  }
  o.ps.delta.every_secs = absl::GetFlag(FLAGS_delta_every_secs);
  o.ps.delta.every_steps = absl::GetFlag(FLAGS_delta_every_steps);
  o.ps.delta.dir = absl::GetFlag(FLAGS_delta_dir).empty() ? o.ps.checkpoint.dir : absl::GetFlag(FLAGS_delta_dir);
  if (absl::Status s = dtrain::ps::ValidateDeltaOptions(o.ps.delta); !s.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  o.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  if (o.ps.max_model_bytes <= 0 || o.max_inflight_bytes < (int64_t{16} << 20)) {
    std::fprintf(stderr, "dtrain_ps: --max_model_bytes must be > 0 and --max_inflight_bytes >= 16 MiB\n");
    return 2;
  }
  if (!o.ps.checkpoint.enabled() && (o.ps.checkpoint.save_steps > 0 || o.ps.checkpoint.save_secs > 0)) {
    std::fprintf(stderr, "dtrain_ps: --save_checkpoint_steps/--save_checkpoint_secs need --checkpoint_dir\n");
    return 2;
  }

  absl::StatusOr<dtrain::ps::SecurityOptions> security =
      dtrain::ps::LoadSecurityOptions(absl::GetFlag(FLAGS_auth_token_file), absl::GetFlag(FLAGS_tls_cert),
                                      absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_tls_ca), "");
  if (!security.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(security.status().message()).c_str());
    return 2;
  }
  o.security = *security;
  o.ps.decision_key = o.security.auth_token;  // ps 0 signs its step decisions; the others check
  absl::StatusOr<std::unique_ptr<dtrain::ps::PsServer>> server = dtrain::ps::PsServer::Start(o);
  if (!server.ok()) {
    std::fprintf(stderr, "dtrain_ps: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  LOG(INFO) << "ps task " << cluster->task_index << " listening on " << (*server)->address() << "; "
            << cluster->DebugString();
  const double max_secs = absl::GetFlag(FLAGS_max_run_secs);
  const bool finished =
      (*server)->Wait(max_secs > 0 ? absl::Seconds(max_secs) : absl::InfiniteDuration());
  // What became of every push this task received (ps/core/parameter_server.h: PushAccounting); tests/chaos.sh
  // checks that it balances.
  LOG(INFO) << "ps task " << cluster->task_index << ": accounting: global_step="
            << (*server)->parameter_server()->step() << " "
            << (*server)->parameter_server()->accounting().DebugString();
  if (!finished) {
    std::fprintf(stderr, "dtrain_ps: gave up after --max_run_secs=%g with workers still running\n", max_secs);
    return 1;
  }
  const absl::Status saved = (*server)->parameter_server()->final_checkpoint_status();
  if (!saved.ok()) {
    std::fprintf(stderr, "dtrain_ps: no worker is left, but the final checkpoint was not saved: %s\n",
                 std::string(saved.message()).c_str());
    return 1;
  }
  const dtrain::ps::TrainingOutcome outcome = (*server)->parameter_server()->outcome();
  if (!outcome.succeeded) {
    std::fprintf(stderr, "dtrain_ps: ps task %d: %s\n", cluster->task_index, outcome.message.c_str());
    return 3;
  }
  LOG(INFO) << "ps task " << cluster->task_index << ": " << outcome.message << "; exiting";
  return 0;
}
