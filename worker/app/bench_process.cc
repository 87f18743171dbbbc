#include "worker/app/bench_process.h"

#include <fcntl.h>
#include <spawn.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

extern char** environ;

namespace dtrain {

absl::StatusOr<pid_t> SpawnWithLog(const std::vector<std::string>& args, const std::string& log) {
  if (args.empty()) return absl::InvalidArgumentError("SpawnWithLog: no program");
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int err = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return absl::InternalError(absl::StrCat("starting ", args[0], ": ", std::strerror(err)));
  return pid;
}

ProcessMemory ReadProcessMemory(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  ProcessMemory m;
  while (std::getline(f, line)) {
    long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %ld kB", &kb) == 1) m.rss = int64_t{kb} * 1024;
    if (std::sscanf(line.c_str(), "VmHWM: %ld kB", &kb) == 1) m.peak = int64_t{kb} * 1024;
  }
  return m;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace dtrain
