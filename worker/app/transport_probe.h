// The transports' CPU cost per byte, on each side, for dtrain_worker --profile_out (worker/train/
// profile_recorder.h): a short exchange of the model's bytes on loopback, after training, for each of grpc,
// shm (shared memory) and tcp (TCP lanes): a dtrain_ps started beside this binary with that --transport (its
// own process, so that each side's CPU is its own: the worker's from getrusage, the ps's from /proc/PID/stat)
// and this process's WorkerClient over it: pushes alone (async mode, SGD; the ps's update, timed on its own,
// is taken out of its side), then pulls alone. Each moves at least `min_bytes` each way (at least
// min_exchanges pushes and pulls), stopping after `max_seconds` a phase. A model with tables adds a phase of
// steps (a push and a pull) that carry each table's rows too, as many as a step of the run had. A transport
// that cannot be measured (no dtrain_ps beside the binary, no shared memory) comes back with
// TransportCost::skipped saying why; the others still are.
//
// Thread-safety: one call at a time (it starts a process and binds ports).
#ifndef DTRAIN_WORKER_APP_TRANSPORT_PROBE_H_
#define DTRAIN_WORKER_APP_TRANSPORT_PROBE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ps/client/placement.h"
#include "worker/train/profile_recorder.h"

namespace dtrain::worker {

struct TransportProbeOptions {
  std::vector<std::string> transports = {"grpc", "shm", "tcp"};
  std::string ps_binary;            // the dtrain_ps to start (empty: beside this binary)
  std::string wire_dtype = "fp32";  // of the pushes and pulls
  int64_t min_bytes = int64_t{384} << 20;
  int min_exchanges = 6;
  int max_exchanges = 400;
  double max_seconds = 2;          // per phase (pushes, pulls)
  double start_timeout_secs = 30;  // for dtrain_ps to answer
};

// One TransportCost per options.transports entry, in order, for the model of `run` (its variables, its tables
// with `rows_per_step` rows each a step: steps with their rows are measured too, beside the dense ones).
std::vector<TransportCost> MeasureTransports(const ProfiledRun& run,
                                             const std::vector<int64_t>& rows_per_step,
                                             const TransportProbeOptions& options);

// dtrain_worker --profile_out=PATH after a run: marks the run's end, measures the ps's update costs
// (ProfileRecorder::MeasurePsCosts) and the transports, and writes the profile to `path`. The error of the
// first step that failed (a transport that cannot be measured is only noted in the file).
absl::Status FinishProfile(ProfileRecorder* profile, const std::string& path, TransportProbeOptions options);

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_APP_TRANSPORT_PROBE_H_
