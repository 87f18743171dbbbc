// How a dtrain process ends, as its exit code: one table for dtrain_worker and dtrain_ps
// (docs/faults_and_endings.md), so that a script, Slurm or a Kubernetes Job can tell a complete run from a
// degraded or failed one.
// The tools (dtrain_eval, dtrain_bench, dtrain_bench_ps, dtrain_convert) use 0, 1 and 2 with the same
// meaning.
//
//   0    complete: the run reached its end as configured (--train_steps), no worker left before it
//   1    this process failed (an error of its own: data, disk, a final checkpoint not saved, an export); a
//        worker that fails while training still leaves the cluster first, and when it is the chief (or in local
//        mode) the ps tasks save the final checkpoint of the steps trained before they end (ps tasks: 4)
//   2    configuration refused: a bad flag or cluster spec, or a configuration the ps tasks refused; when the
//        run cannot go on without the refused process (the chief, or any worker in sync mode with every
//        worker aggregated), every process of the run exits 2
//   3    degraded: the run reached its end, but some worker left before it (lost, failed or stopped; the
//        summary line says which, at which step and why); --allow_degraded makes it 0
//   4    a peer failed: the run stopped before its end because another process failed, was refused or was
//        stopped (the line names it), or could not be reached within its deadline
//   130, 143  this process was stopped by SIGINT / SIGTERM (128 + the signal), after its graceful stop
//
// Thread-safety: constants.
#ifndef DTRAIN_COMMON_EXIT_CODES_H_
#define DTRAIN_COMMON_EXIT_CODES_H_

namespace dtrain {

inline constexpr int kExitComplete = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitConfigRefused = 2;
inline constexpr int kExitDegraded = 3;
inline constexpr int kExitPeerFailed = 4;
// The code of a process stopped by `signal` (SIGTERM: 143, SIGINT: 130), after its graceful stop.
inline constexpr int ExitCodeForSignal(int signal) { return 128 + signal; }

}  // namespace dtrain

#endif  // DTRAIN_COMMON_EXIT_CODES_H_
