// Child processes for the benchmarks that start their own dtrain_ps (dtrain_bench_ps's sparse mode and --netns,
// dtrain_bench_ps_load, the transport probe): start one with its output in a log file, read its memory.
//
// Thread-safety: thread-safe (no shared state).
#ifndef DTRAIN_WORKER_APP_BENCH_PROCESS_H_
#define DTRAIN_WORKER_APP_BENCH_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain {

// Starts args[0] (looked up in PATH when it has no '/') with `args`, its stdout and stderr written to `log`
// (created or truncated). Internal error naming the program and the reason when it cannot be started.
absl::StatusOr<pid_t> SpawnWithLog(const std::vector<std::string>& args, const std::string& log);

// A process's resident memory now (VmRSS) and at its peak (VmHWM), in bytes; -1 for what cannot be read.
struct ProcessMemory {
  int64_t rss = -1, peak = -1;
};
ProcessMemory ReadProcessMemory(pid_t pid);

// The median of `v` (the upper one of an even count); 0 for none.
double Median(std::vector<double> v);

}  // namespace dtrain

#endif  // DTRAIN_WORKER_APP_BENCH_PROCESS_H_
