#include "common/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dtrain {
namespace {

// Marks a process that RestartWithShortOpenMpSpin restarted (and its children, which inherit the setting).
constexpr char kSetByDtrain[] = "DTRAIN_GOMP_SPINCOUNT_SET";

const char* restart_failure = nullptr;  // why the restart did not happen; written before other threads start

}  // namespace

void RestartWithShortOpenMpSpin() {
  if (std::getenv("GOMP_SPINCOUNT") != nullptr || std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  // The arguments exactly as this process got them.
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline =
      in ? std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()) : std::string();
  if (cmdline.empty()) {
    restart_failure = "/proc/self/cmdline is unreadable";
    return;
  }
  std::vector<char*> args;
  for (size_t begin = 0; begin < cmdline.size();) {
    args.push_back(const_cast<char*>(cmdline.data() + begin));
    begin = cmdline.find('\0', begin);
    if (begin == std::string::npos) break;
    ++begin;
  }
  args.push_back(nullptr);
  if (setenv("GOMP_SPINCOUNT", kGompSpinCount, 0) != 0 || setenv(kSetByDtrain, "1", 1) != 0) {
    restart_failure = "setenv failed";
    return;
  }
  execv("/proc/self/exe", args.data());
  // Still here: the program runs on with libgomp's default spin.
  restart_failure = "execv(/proc/self/exe) failed";
  unsetenv("GOMP_SPINCOUNT");
  unsetenv(kSetByDtrain);
}

std::string OpenMpWaitSetting() {
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (spin != nullptr && policy == nullptr && std::getenv(kSetByDtrain) != nullptr) {
    return absl::StrCat("GOMP_SPINCOUNT=", spin, " (dtrain's default)");
  }
  if (spin == nullptr && policy == nullptr) {
    return absl::StrCat("libgomp's default spin (",
                        restart_failure != nullptr ? restart_failure : "not restarted", ")");
  }
  std::string s;
  if (policy != nullptr) s = absl::StrCat("OMP_WAIT_POLICY=", policy);
  if (spin != nullptr) absl::StrAppend(&s, s.empty() ? "" : " ", "GOMP_SPINCOUNT=", spin);
  return absl::StrCat(s, " (from the environment)");
}

}  // namespace dtrain
