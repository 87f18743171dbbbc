// When this process started, as the kernel recorded it (/proc/self/stat: the fork, before the dynamic loader,
// static constructors and main()), for figures that must cover a process's whole wall-clock.
//
// Thread-safety: thread-safe.
#ifndef DTRAIN_COMMON_PROCESS_CLOCK_H_
#define DTRAIN_COMMON_PROCESS_CLOCK_H_

#include <optional>

#include "absl/time/time.h"

namespace dtrain {

// The start of this process to the kernel's clock tick (10 ms where USER_HZ is 100); nullopt when
// /proc/self/stat cannot be read or parsed.
std::optional<absl::Time> ProcessStartTime();

}  // namespace dtrain

#endif  // DTRAIN_COMMON_PROCESS_CLOCK_H_
