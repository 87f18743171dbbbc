#include "common/process_clock.h"

#include <time.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace dtrain {

std::optional<absl::Time> ProcessStartTime() {
  std::ifstream in("/proc/self/stat");
  const std::string stat =
      in ? std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()) : std::string();
  // "pid (comm) state ppid ...": comm may hold blanks and parentheses; the fields after its last ')' are
  // plain.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
  // Field 22 (starttime, clock ticks after boot) is the 20th after comm.
  uint64_t ticks = 0;
  const long hz = sysconf(_SC_CLK_TCK);
  if (f.size() < 20 || !absl::SimpleAtoi(f[19], &ticks) || hz <= 0) return std::nullopt;
  timespec boot;  // the clock starttime counts on: time since boot, suspend included
  if (clock_gettime(CLOCK_BOOTTIME, &boot) != 0) return std::nullopt;
  const absl::Time now = absl::Now();
  const absl::Duration since_boot = absl::DurationFromTimespec(boot);
  const absl::Duration started_after_boot =
      absl::Seconds(static_cast<double>(ticks) / static_cast<double>(hz));
  return now - (since_boot - started_after_boot);
}

}  // namespace dtrain
