// How this process's idle OpenMP threads wait for work.
//
// libgomp (the OpenMP runtime of GCC, which oneDNN and our kernels use) lets a thread that waits at a barrier
// or for the next parallel region spin up to GOMP_SPINCOUNT times (300,000 pause instructions by default, "3
// msec" by its own estimate; 5-8 ms of CPU measured here) before it sleeps. It cuts the spin to 100 only when
// its own threads outnumber the CPUs of the affinity mask; it cannot see other processes. On a machine where
// other processes keep the CPUs busy, a team's waiting thread then spins on the CPU that the thread it waits
// for needs: dtrain_bench --model=cnn --threads=2 beside one busy loop on a 2-core machine ran at 349-463
// examples/sec in 5.0-5.7 s of CPU time, against 596-858 in 2.5-2.9 s with GOMP_SPINCOUNT=1000 (31% of its
// cycles were libgomp's spin loop, perf), and no slower without the loop (docs/speed.md). So the dtrain
// binaries that compute run with GOMP_SPINCOUNT=1000 (tens of microseconds: long enough for the next parallel
// region of a step, which follows within microseconds, to find the team awake) unless the environment sets
// GOMP_SPINCOUNT or OMP_WAIT_POLICY itself.
//
// libgomp reads its environment once, in its constructor, before main() runs; and libc sets up the
// environment that getenv/setenv see only after the executable's .preinit_array ran, so a variable set there
// is lost. The binaries therefore link the object library dtrain_short_openmp_spin (openmp_wait_restart.cc):
// from .preinit_array, before any shared library's constructor, it looks at the environment the program was
// given and, when it names neither variable, executes the same program again (execve of /proc/self/exe: the
// same pid, arguments, open files, affinity and cgroup) with GOMP_SPINCOUNT=1000 added. That costs the
// dynamic loader's work once, before any constructor or main() ran: about 14 ms (dtrain_worker stopping at a
// bad flag: 29 ms against 15 ms with GOMP_SPINCOUNT preset, medians of 15 on a 2-core machine). Child processes
// inherit the setting.
//
// Thread-safety: OpenMpWaitSetting may be called from any thread.
#ifndef DTRAIN_COMMON_OPENMP_WAIT_H_
#define DTRAIN_COMMON_OPENMP_WAIT_H_

#include <string>

namespace dtrain {

// The spin count dtrain gives libgomp when the environment names none, and the variable that marks a process
// (and its children) that dtrain_short_openmp_spin restarted with it.
inline constexpr char kGompSpinCount[] = "1000";
inline constexpr char kGompSpinCountSetByDtrain[] = "DTRAIN_GOMP_SPINCOUNT_SET";

// What the waiting threads do, for a log line: "GOMP_SPINCOUNT=1000 (dtrain's default)", the environment's
// own setting ("OMP_WAIT_POLICY=active (from the environment)"), or libgomp's default and why.
std::string OpenMpWaitSetting();

}  // namespace dtrain

#endif  // DTRAIN_COMMON_OPENMP_WAIT_H_
