// When this process started, as the kernel recorded it (/proc/self/stat: the fork, before the dynamic loader,
// static constructors and main()), for figures that must cover a process's whole wall-clock; and the CPU time a
// process has used.
//
// Thread-safety: thread-safe.
#ifndef DTRAIN_COMMON_PROCESS_CLOCK_H_
#define DTRAIN_COMMON_PROCESS_CLOCK_H_

#include <sys/types.h>

#include <optional>

#include "absl/time/time.h"

namespace dtrain {

// The start of this process to the kernel's clock tick (10 ms where USER_HZ is 100); nullopt when
// /proc/self/stat cannot be read or parsed.
std::optional<absl::Time> ProcessStartTime();

// CPU seconds (user + system, every thread) this process has used so far.
double ProcessCpuSeconds();
// The same for process `pid` (/proc/PID/stat, to the clock tick); -1 when it cannot be read.
double ProcessCpuSeconds(pid_t pid);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_PROCESS_CLOCK_H_
