#include "common/stop_signal.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include "absl/time/clock.h"
#include "common/exit_codes.h"

namespace dtrain {
namespace {

// Waits (at most 10 s) until the first signal cancelled stop(); exits 99 if it never does.
void AwaitStop(StopSignals* signals) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!signals->stop()->cancelled()) {
    if (absl::Now() > deadline) _exit(99);
    absl::SleepFor(absl::Milliseconds(5));
  }
}

class StopSignalsTest : public ::testing::Test {
 protected:
  // Each test installs the handler in a process of its own (a death test re-running this binary).
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// The first signal asks for a stop (the callbacks run, the process goes on; one line says so); a second of
// another kind ends the process at once with 128 + signal; the same signal again within a second is the
// first delivered twice (a launcher passing it on) and changes nothing.
TEST_F(StopSignalsTest, FirstSignalStopsGracefullyASecondAtOnce) {
  EXPECT_EXIT(
      {
        StopSignals* signals = StopSignals::Install("stop_test");
        static std::atomic<bool> ran{false};
        signals->stop()->Register([] { ran = true; });
        kill(getpid(), SIGTERM);
        AwaitStop(signals);
        for (int i = 0; i < 2000 && !ran; ++i) absl::SleepFor(absl::Milliseconds(5));
        if (!ran) _exit(96);
        if (signals->received() != SIGTERM || signals->received_name() != "SIGTERM") _exit(98);
        kill(getpid(), SIGTERM);  // the same stop, delivered twice
        absl::SleepFor(absl::Milliseconds(200));
        std::fprintf(stderr, "still running\n");
        kill(getpid(), SIGINT);
        absl::SleepFor(absl::Seconds(10));
        _exit(97);
      },
      ::testing::ExitedWithCode(ExitCodeForSignal(SIGINT)),
      "stop_test: SIGTERM: stopping gracefully \\(a second SIGTERM or SIGINT stops at once\\)\n"
      "still running\nstop_test: second signal \\(SIGINT\\): stopping at once, exit code 130");
}

// The same signal more than a second after the first is a second stop.
TEST_F(StopSignalsTest, TheSameSignalLaterIsASecondStop) {
  EXPECT_EXIT(
      {
        StopSignals* signals = StopSignals::Install("stop_test");
        kill(getpid(), SIGTERM);
        AwaitStop(signals);
        absl::SleepFor(absl::Milliseconds(1100));
        kill(getpid(), SIGTERM);
        absl::SleepFor(absl::Seconds(10));
        _exit(97);
      },
      ::testing::ExitedWithCode(ExitCodeForSignal(SIGTERM)),
      "second signal \\(SIGTERM\\): stopping at once, exit code 143");
}

}  // namespace
}  // namespace dtrain
