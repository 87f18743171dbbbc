// How this process's idle OpenMP threads wait for work.
//
// libgomp (the OpenMP runtime of GCC, which oneDNN and our kernels use) lets a thread that waits at a barrier
// or for the next parallel region spin up to GOMP_SPINCOUNT times (300,000 pause instructions by default, "3
// msec" by its own estimate; 5-8 ms of CPU measured here) before it sleeps. It cuts the spin to 100 only when
// its own threads outnumber the CPUs of the affinity mask; it cannot see other processes. On a machine where
// other processes keep the CPUs busy, a team's waiting thread then spins on the CPU that the thread it waits
// for needs: dtrain_bench --model=cnn --threads=2 beside one busy loop on a 2-core machine ran at 349-463
// examples/sec in 5.0-5.7 s of CPU time, against 596-858 in 2.5-2.9 s with GOMP_SPINCOUNT=1000 (31% of its
// cycles were libgomp's spin loop, perf), and no slower without the loop (README: Speed). So the dtrain
// binaries that compute run with GOMP_SPINCOUNT=1000 (tens of microseconds: long enough for the next parallel
// region of a step, which follows within microseconds, to find the team awake) unless the environment sets
// GOMP_SPINCOUNT or OMP_WAIT_POLICY itself.
//
// libgomp reads its environment once, in its constructor, before main() runs (and before the executable's
// .preinit_array could set a variable that libc would keep: libc sets its environment after that). So main()
// calls RestartWithShortOpenMpSpin() first: it sets the variable and executes the same program again (execv
// of /proc/self/exe with the same arguments: the same pid, open files, affinity and cgroup), which costs the
// dynamic loader's few milliseconds once. Child processes inherit the setting.
//
// Thread-safety: RestartWithShortOpenMpSpin: first thing in main(), before any other thread starts.
// OpenMpWaitSetting: any thread.
#ifndef DTRAIN_COMMON_OPENMP_WAIT_H_
#define DTRAIN_COMMON_OPENMP_WAIT_H_

#include <string>

namespace dtrain {

// The spin count dtrain gives libgomp when the environment names none.
inline constexpr char kGompSpinCount[] = "1000";

// When the environment sets neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY: sets GOMP_SPINCOUNT=kGompSpinCount
// and restarts the program (never returns). Returns at once when the environment has a setting, and when the
// restart fails (the default spin then stays; OpenMpWaitSetting says why).
void RestartWithShortOpenMpSpin();

// What the waiting threads do, for a log line: "GOMP_SPINCOUNT=1000 (dtrain's default)", the environment's
// own setting ("OMP_WAIT_POLICY=active (from the environment)"), or libgomp's default and why.
std::string OpenMpWaitSetting();

}  // namespace dtrain

#endif  // DTRAIN_COMMON_OPENMP_WAIT_H_
