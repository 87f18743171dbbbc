// The child process of cpu_budget_test's OpenMpWaitTest: linked with dtrain_short_openmp_spin as the binaries
// that compute are, so it restarts itself with libgomp's short spin unless the environment sets one. Measures
// the CPU a thread spends waiting 200 ms at an OpenMP barrier (the mean of 3 waits after a start-up round) and
// prints the setting, that CPU and its pid (which the restart keeps).
#include <omp.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/openmp_wait.h"

namespace {

// CPU time of the calling thread.
double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

}  // namespace

int main() {
  double waiter_cpu = 0;
  for (int round = 0; round < 4; ++round) {
#pragma omp parallel num_threads(2)
    {
      if (omp_get_thread_num() == 1) absl::SleepFor(absl::Milliseconds(200));  // the other one waits meanwhile
      const double before = ThreadCpuSeconds();
#pragma omp barrier
      if (omp_get_thread_num() == 0 && round > 0) waiter_cpu += ThreadCpuSeconds() - before;  // round 0: start-up
    }
  }
  std::printf("setting: %s\nwaiter cpu ms: %.3f\npid %d\n", dtrain::OpenMpWaitSetting().c_str(),
              waiter_cpu / 3 * 1e3, static_cast<int>(getpid()));
  return 0;
}
