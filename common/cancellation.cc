#include "common/cancellation.h"

#include <utility>

namespace dtrain {

void Cancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  cancelled_flag_.store(true, std::memory_order_release);  // before the callbacks: what they wake sees it
  while (!callbacks_.empty()) {
    auto it = callbacks_.begin();
    std::function<void()> fn = std::move(it->second);
    running_ = it->first;
    callbacks_.erase(it);
    mu_.Unlock();
    fn();
    mu_.Lock();
    running_ = 0;
  }
}

bool Cancellation::cancelled() const { return cancelled_flag_.load(std::memory_order_acquire); }

int64_t Cancellation::Register(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    if (!cancelled_) {
      const int64_t id = next_id_++;
      callbacks_.emplace(id, std::move(fn));
      return id;
    }
  }
  fn();
  return 0;
}

void Cancellation::Deregister(int64_t id) {
  if (id == 0) return;  // from a Register after the cancellation: the callback already ran
  absl::MutexLock lock(&mu_);
  callbacks_.erase(id);
  struct NotRunning {
    const int64_t* running;
    int64_t id;
    static bool Check(NotRunning* n) { return *n->running != n->id; }
  } not_running{&running_, id};
  mu_.Await(absl::Condition(&NotRunning::Check, &not_running));
}

void Cancellation::Reset() {
  absl::MutexLock lock(&mu_);
  cancelled_ = false;
  cancelled_flag_.store(false, std::memory_order_release);
  callbacks_.clear();
}

}  // namespace dtrain
