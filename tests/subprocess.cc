#include "tests/subprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/time/clock.h"
#include "common/free_ports.h"

extern char** environ;

namespace dtrain::testing {

std::string BinPath(const std::string& name) {
  const char* dir = std::getenv("DTRAIN_BIN_DIR");
  return std::string(dir ? dir : "bin") + "/" + name;
}

std::vector<int> FreePorts(int count) { return dtrain::FreePorts(count); }

Subprocess::Subprocess(const std::vector<std::string>& argv, const std::string& log_path,
                       const std::vector<std::string>& env)
    : log_path_(log_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& e : env) env_strings.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "exec %s failed: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
}

Subprocess::~Subprocess() { Kill(); }

int Subprocess::Wait(absl::Duration timeout) {
  if (reaped_) return exit_code_;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      return exit_code_;
    }
    if (absl::Now() > deadline) {
      Kill();
      return -9;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void Subprocess::Kill() {
  if (reaped_ || pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
  exit_code_ = -9;
}

std::string Subprocess::Output() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace dtrain::testing
