// The cluster: which ps and worker tasks exist ("host:port" each) and which one this process is.
//
// Three sources give the same ClusterConfig:
//   1. TensorFlow's classic flags:
//        --ps_hosts=h1:2222,h2:2222 --worker_hosts=h3:2222,h4:2222 --job_name=worker --task_index=1
//   2. --cluster_spec=cluster.json holding {"ps": ["h1:2222"], "worker": ["h3:2222", ...]} (an optional
//      "chief" job too), with --job_name/--task_index naming this task.
//   3. The TF_CONFIG environment variable, in TensorFlow's format:
//        {"cluster": {"chief": ["h0:2222"], "worker": ["h3:2222"], "ps": ["h1:2222"]},
//         "task": {"type": "worker", "index": 0}}
//
// Chief normalization: dtrain has one job of workers whose task 0 is the chief. A TF-style "chief" job
// (exactly one task) is folded into it: the chief becomes worker 0 and TF worker i becomes worker i+1.
// ClusterConfig::chief_folded records that this happened; original_job_name/original_task_index keep
// the task as the source named it. An "evaluator" job is accepted and ignored (it takes no part in
// training), but this process may not itself be the evaluator.
//
// Job name "local" with no hosts anywhere means single-process training without parameter servers.
//
// Binaries call ResolveCluster() with their flag values and getenv("TF_CONFIG") (dtrain_ps and dtrain_worker
// through ClusterOfThisTask, common/cluster_flags.h, which holds their shared cluster flags):
//
//   ClusterFlags flags;
//   flags.ps_hosts = absl::GetFlag(FLAGS_ps_hosts);  ...
//   const char* tf_config = std::getenv("TF_CONFIG");
//   ASSIGN_OR_RETURN(ClusterConfig cluster,
//                    ResolveCluster(flags, tf_config ? tf_config : ""));
//   LOG(INFO) << cluster.DebugString();
//
// Every invalid input gives absl::InvalidArgumentError with one line naming the problem (bad JSON with
// the parser's position, unknown job, index out of range, duplicate address, missing/invalid port,
// empty host, missing ps or worker tasks, wrong JSON types). Unreadable --cluster_spec files give the
// file error (e.g. NotFound).
//
// Thread-safety: all functions are pure and thread-safe; ClusterConfig is a plain value.
#ifndef DTRAIN_COMMON_CLUSTER_SPEC_H_
#define DTRAIN_COMMON_CLUSTER_SPEC_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

inline constexpr char kJobPs[] = "ps";
inline constexpr char kJobWorker[] = "worker";
inline constexpr char kJobLocal[] = "local";

struct ClusterConfig {
  std::vector<std::string> ps;      // "host:port" of each ps task, by task index
  std::vector<std::string> worker;  // "host:port" of each worker task; worker 0 is the chief
  std::string job_name;             // kJobPs, kJobWorker or kJobLocal
  int task_index = 0;               // index into ps or worker; 0 for local

  // True when a TF-style "chief" job was folded into "worker" (see the file comment).
  bool chief_folded = false;
  // This task as the source named it, before chief normalization (e.g. "chief"/0, "worker"/1).
  std::string original_job_name;
  int original_task_index = 0;
  // Where the config came from, for logs: "TF_CONFIG", "--cluster_spec=<path>", "--ps_hosts/...".
  std::string source;
  // A worker whose task_index is past the spec's worker list: it joins a running job whose ps tasks take more
  // workers (dtrain_ps --max_workers); it has no address in the spec.
  bool joining = false;

  bool is_local() const { return job_name == kJobLocal; }
  bool is_ps() const { return job_name == kJobPs; }
  bool is_worker() const { return job_name == kJobWorker; }
  // Worker 0 is the chief (it initializes variables, writes checkpoints and summaries). A local
  // process is its own chief.
  bool is_chief() const { return is_local() || (is_worker() && task_index == 0); }
  // "host:port" of this task; empty for a local process.
  std::string address() const;
  int num_ps() const { return static_cast<int>(ps.size()); }
  int num_workers() const { return static_cast<int>(worker.size()); }
  // One line, e.g. "worker:1 (chief=no) at h3:2222; ps=[h1:2222] worker=[h0:2222,h3:2222];
  // from TF_CONFIG; TF task chief:0 folded into worker:0".
  std::string DebugString() const;
};

// Flag values as the binaries' main.cc parsed them. Empty strings and -1 mean "not given".
struct ClusterFlags {
  std::string cluster_spec;  // --cluster_spec: path of a JSON job → addresses file
  std::string ps_hosts;      // --ps_hosts: comma-separated "host:port" list
  std::string worker_hosts;  // --worker_hosts
  std::string job_name;      // --job_name: "ps", "worker", "chief" (when the cluster has one), "local"
  int task_index = -1;       // --task_index
};

// Picks the source, in this order: --cluster_spec file; else --ps_hosts/--worker_hosts; else
// --job_name=local with no hosts; else `tf_config` (the TF_CONFIG value, empty if unset); else
// InvalidArgument saying what to pass. With TF_CONFIG, an explicit --job_name/--task_index overrides
// TF_CONFIG's "task".
absl::StatusOr<ClusterConfig> ResolveCluster(const ClusterFlags& flags, absl::string_view tf_config);

// Source 1. `ps_hosts`/`worker_hosts` are comma-separated; whitespace around entries is ignored.
// `job_name` is "ps" or "worker" (or "local" with both lists empty); `task_index` must be >= 0.
absl::StatusOr<ClusterConfig> ClusterFromFlags(const std::string& ps_hosts,
                                               const std::string& worker_hosts,
                                               const std::string& job_name, int task_index);

// Source 2, from the JSON text of a cluster spec file. `source` labels the config (file path).
absl::StatusOr<ClusterConfig> ClusterFromJson(absl::string_view json, const std::string& job_name,
                                              int task_index, const std::string& source = "JSON");

// Source 2, reading the file at `path`.
absl::StatusOr<ClusterConfig> ClusterFromJsonFile(const std::string& path,
                                                  const std::string& job_name, int task_index);

// Source 3. `job_name_override`/`task_index_override` ("" / -1 = none) replace TF_CONFIG's "task".
absl::StatusOr<ClusterConfig> ClusterFromTfConfig(absl::string_view tf_config,
                                                  const std::string& job_name_override = "",
                                                  int task_index_override = -1);

// Splits "host:port" or "[ipv6]:port" into host (without brackets) and port. Port must be a decimal
// integer in 0..65535 (0 is accepted here, e.g. for "bind any port"; cluster specs reject it).
absl::StatusOr<std::pair<std::string, int>> SplitHostPort(absl::string_view address);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_CLUSTER_SPEC_H_
