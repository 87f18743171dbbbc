#include "common/serial_executor.h"

#include <pthread.h>

#include <utility>

#include "common/denormals.h"

namespace dtrain {

SerialExecutor::SerialExecutor(bool threaded, std::string name) : threaded_(threaded) {
  if (!threaded_) return;
  thread_ = std::thread([this] { Loop(); });
  pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
}

SerialExecutor::~SerialExecutor() {
  if (!threaded_) return;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SerialExecutor::Run(std::function<void()> fn) {
  if (!threaded_) {
    fn();
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

void SerialExecutor::RunInline(std::function<void()> fn) {
  if (threaded_ && std::this_thread::get_id() != thread_.get_id()) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](SerialExecutor* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->queue_.empty() && !e->running_; },
        this));
  }
  fn();
}

void SerialExecutor::Loop() {
  SetFlushDenormals();  // lanes decode and quantize floats
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](SerialExecutor* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || !e->queue_.empty(); },
          this));
      if (queue_.empty()) return;  // stopping, and everything queued has run
      fn = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    fn();
    absl::MutexLock lock(&mu_);
    running_ = false;
  }
}

}  // namespace dtrain
