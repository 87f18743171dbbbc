// Graceful stop on SIGTERM and SIGINT, as Kubernetes (pod deletion, with terminationGracePeriodSeconds before
// SIGKILL) and Slurm (--signal=TERM@SECS before the time limit) ask: the first signal asks the process to
// stop (stop() is cancelled: whoever registered on it wraps up: a worker leaves the cluster, the chief
// evaluates and exports, a ps saves its final checkpoint); a second signal ends the process at once with exit
// code 128 + signal (the same signal again within a second counts as the first delivered twice, as a launcher
// that passes the signal on to a process that got it already does). Both are said in one line on stderr.
//
// Usage, first thing in main() (before any thread starts: threads inherit the blocked signals):
//   dtrain::StopSignals* signals = dtrain::StopSignals::Install("dtrain_ps");
//   signals->stop()->Register([&] { ps->RequestStop(...); });
//   ... if (signals->received() != 0) return dtrain::ExitCodeForSignal(signals->received());
//
// Thread-safety: Install once, from main(); the rest from any thread. The waiting thread lives as long as the
// process.
#ifndef DTRAIN_COMMON_STOP_SIGNAL_H_
#define DTRAIN_COMMON_STOP_SIGNAL_H_

#include <atomic>
#include <string>

#include "common/cancellation.h"

namespace dtrain {

class StopSignals {
 public:
  // Blocks SIGTERM and SIGINT in the calling thread and every thread started after, and starts the thread
  // that waits for them. `program` names the process in the lines it prints.
  static StopSignals* Install(std::string program);

  // Cancelled at the first signal (its callbacks run on a thread of their own).
  Cancellation* stop() { return &stop_; }
  // The first signal received (SIGTERM or SIGINT), 0 while none was.
  int received() const { return received_.load(); }
  // "SIGTERM" / "SIGINT" for the first signal, "" while none was.
  std::string received_name() const;

 private:
  explicit StopSignals(std::string program) : program_(std::move(program)) {}
  void Loop();

  const std::string program_;
  Cancellation stop_;
  std::atomic<int> received_{0};
};

// "SIGTERM", "SIGINT", or "signal N".
std::string SignalName(int signal);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_STOP_SIGNAL_H_
