// The cluster flags dtrain_ps and dtrain_worker define alike, and the cluster and this task in it that a
// cluster task's flags (and its environment's TF_CONFIG) give.
//
// Defined here, once for both binaries: --ps_hosts, --worker_hosts and --cluster_spec. --job_name and
// --task_index stay in each binary's main.cc (their help says which jobs that binary runs); the caller passes
// their values. Link this library only into binaries that define no flag of these names.
//
// Usage, in main() after the command line is parsed (common/command_line.h):
//   absl::StatusOr<dtrain::ClusterConfig> cluster = dtrain::ClusterOfThisTask(
//       absl::GetFlag(FLAGS_job_name), absl::GetFlag(FLAGS_task_index), dtrain::TaskBinary::kPs);
//   if (!cluster.ok()) { print "dtrain_ps: <message>"; return dtrain::kExitConfigRefused; }
//
// Thread-safety: reads flags and the environment; call from main() once the command line is parsed.
#ifndef DTRAIN_COMMON_CLUSTER_FLAGS_H_
#define DTRAIN_COMMON_CLUSTER_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_spec.h"

namespace dtrain {

// Which binary runs the task: dtrain_ps (the ps job) or dtrain_worker (worker, chief, local).
enum class TaskBinary { kPs, kWorker };

// The cluster from --cluster_spec, else --ps_hosts/--worker_hosts, else the TF_CONFIG environment variable
// (ResolveCluster, common/cluster_spec.h), with this task's `job_name` and `task_index`. Errors
// (InvalidArgument), worded for "<program>: <message>":
//   "bad cluster spec: <what ResolveCluster found wrong>";
//   kPs, a task of another job: "this task is not a ps task (<cluster>); run dtrain_worker for it";
//   kWorker, a ps task: "this task is a ps task (<cluster>); run dtrain_ps for it".
absl::StatusOr<ClusterConfig> ClusterOfThisTask(const std::string& job_name, int task_index,
                                                TaskBinary binary);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_CLUSTER_FLAGS_H_
