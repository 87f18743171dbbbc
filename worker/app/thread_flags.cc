// --threads and --compute_dtype (worker/app/model_flags.h).
#include "absl/flags/flag.h"
#include "common/status_macros.h"
#include "worker/app/model_flags.h"

ABSL_FLAG(
    std::string, threads, "auto",
    "CPU threads for the model's ops: auto (the CPUs this process may use: its affinity mask, its cgroup's "
    "CPU quota, shared with the other dtrain workers on those CPUs; one log line says what it chose and why) "
    "or a number (kept as given; a warning when it is more than auto would pick: threads beyond the CPUs "
    "only contend for them)");

ABSL_FLAG(std::string, compute_dtype, "fp32",
          "fp32 | bf16: what the towers' convolutions and matrix products compute in. bf16 rounds their operands "
          "to bfloat16 and accumulates in fp32 (oneDNN picks AVX-512 BF16 or AMX; one log line says which, and "
          "which ops stayed fp32); parameters, optimizer, loss, normalization and softmax stay fp32");

namespace dtrain::worker {

absl::StatusOr<kernels::ComputeDtype> ComputeDtypeFromFlags() {
  return kernels::ParseComputeDtype(absl::GetFlag(FLAGS_compute_dtype));
}

absl::StatusOr<ThreadDecision> ThreadsFromFlags(int known_peers) {
  ASSIGN_OR_RETURN(const int asked, ParseThreadCount(absl::GetFlag(FLAGS_threads)));
  CpuBudgetOptions o;
  o.known_peers = known_peers;
  return DecideThreads(asked, MeasureCpuBudget(o));
}

}  // namespace dtrain::worker
