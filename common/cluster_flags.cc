#include "common/cluster_flags.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, ps_hosts, "", "Comma-separated host:port of the ps tasks");
ABSL_FLAG(std::string, worker_hosts, "", "Comma-separated host:port of the worker tasks");
ABSL_FLAG(std::string, cluster_spec, "",
          "JSON file {\"ps\": [...], \"worker\": [...]} (else flags or TF_CONFIG)");

namespace dtrain {

absl::StatusOr<ClusterConfig> ClusterOfThisTask(const std::string& job_name, int task_index,
                                                TaskBinary binary) {
  ClusterFlags cf;
  cf.cluster_spec = absl::GetFlag(FLAGS_cluster_spec);
  cf.ps_hosts = absl::GetFlag(FLAGS_ps_hosts);
  cf.worker_hosts = absl::GetFlag(FLAGS_worker_hosts);
  cf.job_name = job_name;
  cf.task_index = task_index;
  const char* tf_config = std::getenv("TF_CONFIG");
  absl::StatusOr<ClusterConfig> cluster = ResolveCluster(cf, tf_config ? tf_config : "");
  if (!cluster.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bad cluster spec: ", cluster.status().message()));
  }
  if (binary == TaskBinary::kPs && !cluster->is_ps()) {
    return absl::InvalidArgumentError(
        absl::StrCat("this task is not a ps task (", cluster->DebugString(), "); run dtrain_worker for it"));
  }
  if (binary == TaskBinary::kWorker && cluster->is_ps()) {
    return absl::InvalidArgumentError(
        absl::StrCat("this task is a ps task (", cluster->DebugString(), "); run dtrain_ps for it"));
  }
  return cluster;
}

}  // namespace dtrain
