// Runs closures one after the other, in the order they were added: on a thread of its own, or inline in the
// caller's thread (for in-process use, where a thread would only add context switches).
//
// Thread-safety: Run may be called from any thread. The destructor runs what is queued, then joins.
#ifndef DTRAIN_COMMON_SERIAL_EXECUTOR_H_
#define DTRAIN_COMMON_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

class SerialExecutor {
 public:
  // `threaded` false: Run executes the closure before returning. `name` names the thread (for debuggers).
  SerialExecutor(bool threaded, std::string name);
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void Run(std::function<void()> fn);
  // Runs `fn` in the calling thread once everything queued before it has run (at once when not threaded, or
  // when called from a closure of this executor): for work too quick to be worth a hand-off to the thread.
  void RunInline(std::function<void()> fn);
  bool threaded() const { return threaded_; }

 private:
  void Loop();

  const bool threaded_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // the thread is running a closure
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dtrain

#endif  // DTRAIN_COMMON_SERIAL_EXECUTOR_H_
