// How many compute threads this process should run: the CPUs it may really use, read from /proc and /sys.
//
// A process that runs more compute threads than it has CPUs does not go faster, it goes much slower: its
// OpenMP threads wait for one another at every parallel region, and a thread that is not running holds up the
// others. MeasureCpuBudget counts
//   - the CPUs in this process's affinity mask (/proc/self/status: Cpus_allowed_list; taskset, cpusets);
//   - its cgroup's CPU quota (v1: cpu.cfs_quota_us / cpu.cfs_period_us; v2: cpu.max "QUOTA PERIOD" or "max
//     PERIOD"), the smallest along the path from its cgroup up to the hierarchy's root, rounded to the
//     nearest whole core (1.5 -> 2, 1.25 -> 1, 0.25 -> 1; see cpu_budget.cc for why);
//   - the other dtrain compute processes on those CPUs: running dtrain_worker, dtrain_bench or dtrain_eval
//     processes whose affinity overlaps this one's and that are in the same CPU cgroup (a process in a cgroup
//     of its own has its own quota), or the number the caller knows of (a cluster spec's tasks on this host),
//     whichever is larger. The ps tasks are not counted: they mostly compute while their workers wait for
//     them (1 ps + 1 sync cnn worker on 2 cores: the worker's 2 threads trained 0.99-1.20x as fast as 1).
// and picks threads = max(1, min(affinity CPUs, quota cores) / (1 + other processes)), rounded down.
//
// Files are read under an injectable root (tests feed fake trees). Nothing here fails: a file that is missing
// or malformed falls back to "no limit from it" (the affinity: CpuBudgetOptions::fallback_cpus) and says so
// in CpuBudget::notes, which the reasons line carries.
//
// Thread-safety: the functions are thread-safe (they read files and keep no state).
//
// Example:
//   const CpuBudget budget = MeasureCpuBudget();
//   ASSIGN_OR_RETURN(const int asked, ParseThreadCount(flag));   // 0: auto
//   const ThreadDecision d = DecideThreads(asked, budget);
//   LOG(INFO) << d.line;   // threads: 1 (--threads=auto: 2 CPUs in the affinity mask, cgroup quota ...)
#ifndef DTRAIN_COMMON_CPU_BUDGET_H_
#define DTRAIN_COMMON_CPU_BUDGET_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dtrain {

struct CpuBudgetOptions {
  // Prepended to /proc/... and /sys/... (empty: the real ones). A test points it at a fake tree.
  std::string root;
  // The programs (/proc/PID/comm) that compete for CPUs with this one.
  std::vector<std::string> competing_programs = {"dtrain_worker", "dtrain_bench", "dtrain_eval"};
  // Other compute processes the caller knows share this host (e.g. worker tasks of its cluster spec at its
  // own address); counted when the /proc scan finds fewer (a peer started at the same moment may not be there
  // yet).
  int known_peers = 0;
  // CPUs assumed when the affinity mask cannot be read (0: std::thread::hardware_concurrency()).
  int fallback_cpus = 0;
};

struct CpuBudget {
  int affinity_cpus = 0;           // CPUs in the affinity mask (or the fallback)
  double quota_cores = 0;          // the cgroup's CPU quota in cores; 0: none
  int other_processes = 0;         // other dtrain compute processes counted (max of the scan and known_peers)
  int threads = 1;                 // what --threads=auto runs: >= 1
  std::vector<std::string> notes;  // files that could not be read and what was assumed instead

  // "2 CPUs in the affinity mask, cgroup quota 0.25 core, 2 other dtrain processes on these CPUs", plus
  // notes.
  std::string Reasons() const;
};

CpuBudget MeasureCpuBudget(const CpuBudgetOptions& options = {});

// A --threads value: "auto" -> 0, or a whole number from 1 to 4096. InvalidArgument otherwise, naming the
// value.
absl::StatusOr<int> ParseThreadCount(absl::string_view text);

struct ThreadDecision {
  int threads = 1;
  std::string line;             // one log line: what was chosen and why
  bool exceeds_budget = false;  // an explicit count above what auto picks (log `line` as a warning)
};
// `requested`: 0 for auto, else the explicit count, which is kept as given.
ThreadDecision DecideThreads(int requested, const CpuBudget& budget);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_CPU_BUDGET_H_
