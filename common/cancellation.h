// A one-shot cancellation signal with callbacks, so that a blocked call (a pull waiting for a step, a gRPC
// stream) can be woken and ended at once instead of running into its timeout.
//
// Usage:
//   Cancellation cancel;
//   int64_t id = cancel.Register([&] { context.TryCancel(); });   // runs at Cancel(), or now if cancelled
//   ... blocking call that checks cancel.cancelled() when woken ...
//   cancel.Deregister(id);
//   // elsewhere: cancel.Cancel();
//
// Thread-safety: all methods may be called concurrently. Callbacks run on the thread calling Cancel() (or
// Register, if already cancelled), without the internal lock held; Deregister waits for a running callback.
#ifndef DTRAIN_COMMON_CANCELLATION_H_
#define DTRAIN_COMMON_CANCELLATION_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dtrain {

class Cancellation {
 public:
  void Cancel();
  bool cancelled() const;
  // Calls `fn` once when cancelled (now, if already: then the id is 0). Returns an id for Deregister.
  int64_t Register(std::function<void()> fn);
  // After it returns, the callback `id` neither runs nor is running.
  void Deregister(int64_t id);
  // Starts over: not cancelled, no callbacks (none may be registered).
  void Reset();

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // cancelled_, readable without mu_: cancelled() takes no lock, so that a condition another mutex evaluates
  // (a pull's wait, absl::Condition) may read it whatever that mutex's lock order.
  std::atomic<bool> cancelled_flag_{false};
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;  // id of the callback running now, 0 if none
  std::map<int64_t, std::function<void()>> callbacks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dtrain

#endif  // DTRAIN_COMMON_CANCELLATION_H_
