#include "common/process_clock.h"

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace dtrain {
namespace {

// The fields of /proc/`who`/stat after the command ("pid (comm) state ppid ...": comm may hold blanks and
// parentheses; the fields after its last ')' are plain): field K of proc(5) is [K - 3]. Empty when unreadable.
std::vector<std::string> StatFieldsAfterCommand(const std::string& who) {
  std::ifstream in("/proc/" + who + "/stat");
  const std::string stat =
      in ? std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()) : std::string();
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return {};
  return absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipEmpty());
}

}  // namespace

std::optional<absl::Time> ProcessStartTime() {
  const std::vector<std::string> f = StatFieldsAfterCommand("self");
  // Field 22 (starttime, clock ticks after boot).
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

double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double ProcessCpuSeconds(pid_t pid) {
  const std::vector<std::string> f = StatFieldsAfterCommand(absl::StrCat(pid));
  // Fields 14 and 15: utime and stime, in clock ticks.
  uint64_t utime = 0, stime = 0;
  const long hz = sysconf(_SC_CLK_TCK);
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) || !absl::SimpleAtoi(f[12], &stime) || hz <= 0) return -1;
  return static_cast<double>(utime + stime) / static_cast<double>(hz);
}

}  // namespace dtrain
