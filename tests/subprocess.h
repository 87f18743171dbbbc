// Starting and reaping real dtrain processes from tests: argv in, exit code and output (a file) out, every child
// killed if it outlives its deadline. Linux only.
//
// Thread-safety: a Subprocess is used by one thread.
#ifndef DTRAIN_TESTS_SUBPROCESS_H_
#define DTRAIN_TESTS_SUBPROCESS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dtrain::testing {

// Path of a built binary (DTRAIN_BIN_DIR is set by ctest; falls back to ./bin next to the test).
std::string BinPath(const std::string& name);

// `count` distinct free TCP ports on 127.0.0.1 (common/free_ports.h).
std::vector<int> FreePorts(int count);

class Subprocess {
 public:
  // Starts argv[0] with argv and extra environment entries ("K=V"); stdout+stderr go to `log_path`.
  Subprocess(const std::vector<std::string>& argv, const std::string& log_path,
             const std::vector<std::string>& env = {});
  ~Subprocess();  // kills the child if still running

  // Waits until exit or `timeout` (then kills it and returns -9). Returns the exit code (or -signal).
  int Wait(absl::Duration timeout);
  void Kill();
  std::string Output() const;  // the log so far
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
  int exit_code_ = 0;
  bool reaped_ = false;
  std::string log_path_;
};

}  // namespace dtrain::testing

#endif  // DTRAIN_TESTS_SUBPROCESS_H_
