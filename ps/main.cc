// dtrain_ps: one parameter-server task. Generic like tf.train.Server: it knows the cluster, not the model;
// the chief worker sends the training configuration. Exits 0 once every worker has reported done, 1 if the
// final checkpoint could not be saved then.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <glog/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/malloc_tuning.h"
#include "ps/server.h"

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
ABSL_FLAG(double, max_run_secs, 0, "Give up and exit 1 after this long (0: wait for the workers forever)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("dtrain parameter server task");
  dtrain::TuneMallocForLargeReusedBuffers();
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
  if (!o.ps.checkpoint.enabled() && (o.ps.checkpoint.save_steps > 0 || o.ps.checkpoint.save_secs > 0)) {
    std::fprintf(stderr, "dtrain_ps: --save_checkpoint_steps/--save_checkpoint_secs need --checkpoint_dir\n");
    return 2;
  }

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
  if (!finished) {
    std::fprintf(stderr, "dtrain_ps: gave up after --max_run_secs=%g with workers still running\n", max_secs);
    return 1;
  }
  const absl::Status saved = (*server)->parameter_server()->final_checkpoint_status();
  if (!saved.ok()) {
    std::fprintf(stderr, "dtrain_ps: all workers done, but the final checkpoint was not saved: %s\n",
                 std::string(saved.message()).c_str());
    return 1;
  }
  LOG(INFO) << "ps task " << cluster->task_index << ": all workers done, exiting";
  return 0;
}
