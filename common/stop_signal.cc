#include "common/stop_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/exit_codes.h"

namespace dtrain {
namespace {

// A second signal this soon after the first is the same stop, delivered twice.
constexpr absl::Duration kSameStop = absl::Seconds(1);

sigset_t StopSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

std::string SignalName(int signal) {
  if (signal == SIGTERM) return "SIGTERM";
  if (signal == SIGINT) return "SIGINT";
  return absl::StrCat("signal ", signal);
}

StopSignals* StopSignals::Install(std::string program) {
  const sigset_t set = StopSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  auto* signals = new StopSignals(std::move(program));  // lives as long as the process (its thread uses it)
  std::thread([signals] { signals->Loop(); }).detach();
  return signals;
}

std::string StopSignals::received_name() const {
  const int s = received();
  return s == 0 ? "" : SignalName(s);
}

void StopSignals::Loop() {
  const sigset_t set = StopSet();
  absl::Time first = absl::InfiniteFuture();
  while (true) {
    int signal = 0;
    if (sigwait(&set, &signal) != 0) continue;
    int expected = 0;
    if (received_.compare_exchange_strong(expected, signal)) {
      first = absl::Now();
      std::fprintf(stderr, "%s: %s: stopping gracefully (a second SIGTERM or SIGINT stops at once)\n",
                   program_.c_str(), SignalName(signal).c_str());
      std::fflush(stderr);
      // On another thread: the callbacks may take a while (a checkpoint), and this one must stay ready for a
      // second signal.
      std::thread([this] { stop_.Cancel(); }).detach();
      continue;
    }
    if (signal == received_.load() && absl::Now() - first < kSameStop) {
      // The same stop delivered twice: to this process and through its launcher (Slurm signals every process
      // of a task, and dtrain_task.sh passes the signal on).
      continue;
    }
    std::fprintf(stderr, "%s: second signal (%s): stopping at once, exit code %d\n", program_.c_str(),
                 SignalName(signal).c_str(), ExitCodeForSignal(signal));
    std::fflush(stderr);
    std::fflush(stdout);
    _exit(ExitCodeForSignal(signal));
  }
}

}  // namespace dtrain
