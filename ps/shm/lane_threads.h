// The threads of a lane server (ShmServer here, tcp::TcpServer beside it): one thread per accepted
// connection, each ending by itself, at most `max_threads` at once, all of them stopped and joined by
// StopAll.
//
// A thread marks the lane it serves (Serve) so that StopAll can shut it (LaneT::Shutdown(), which must be
// safe to call from another thread while the lane is in use, and more than once) and a server can read it
// (ForEachServing); Release unmarks it before the lane goes away or changes hands.
//
// Thread-safety: every method may be called from any thread. Lock order: a caller may hold its own mutex
// while it calls Serve, Release or ForEachServing (they take only this object's); `serve` runs with no lock
// held.
#ifndef DTRAIN_PS_SHM_LANE_THREADS_H_
#define DTRAIN_PS_SHM_LANE_THREADS_H_

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"

namespace dtrain::ps::shm {

template <typename LaneT>
class LaneThreads {
 public:
  // One connection's thread, as its `serve` function sees it.
  class Slot {
   public:
    Slot() = default;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;

   private:
    friend class LaneThreads;
    std::thread thread;
    bool done = false;
    LaneT* lane = nullptr;  // while marked (under the owner's mu_)
  };

  explicit LaneThreads(int max_threads) : max_threads_(max_threads) {}
  ~LaneThreads() { StopAll(); }
  LaneThreads(const LaneThreads&) = delete;
  LaneThreads& operator=(const LaneThreads&) = delete;

  // Runs serve(fd, slot) on a thread of its own, first joining the threads that have finished. False when
  // StopAll has begun or max_threads run: then `fd` is closed here and counted as refused.
  bool Start(int fd, std::function<void(int fd, Slot* slot)> serve) {
    Reap();
    absl::MutexLock lock(&mu_);
    if (stopped_ || active_ >= max_threads_) {
      ++refused_;
      close(fd);
      return false;
    }
    ++active_;
    threads_.emplace_back();
    Slot* slot = &threads_.back();
    slot->thread = std::thread([this, slot, fd, serve = std::move(serve)] {
      serve(fd, slot);
      absl::MutexLock l(&mu_);
      slot->lane = nullptr;
      slot->done = true;
      --active_;
      cv_.SignalAll();
    });
    return true;
  }

  // Marks `lane` as the one `slot` serves (StopAll shuts it from now on). False once StopAll has begun: the
  // caller closes the lane and returns.
  bool Serve(Slot* slot, LaneT* lane) {
    absl::MutexLock lock(&mu_);
    if (stopped_) return false;
    slot->lane = lane;
    return true;
  }
  void Release(Slot* slot) {
    absl::MutexLock lock(&mu_);
    slot->lane = nullptr;
  }

  // fn(lane) for every lane marked now (under this object's lock: fn must not call back into it).
  void ForEachServing(const std::function<void(const LaneT&)>& fn) const {
    absl::MutexLock lock(&mu_);
    for (const Slot& s : threads_) {
      if (s.lane != nullptr) fn(*s.lane);
    }
  }

  // Accepts connections from `listener` (Accept(absl::Time deadline) -> absl::StatusOr<int>) and Starts serve
  // on each, until the listener is shut (Cancelled) or fails (logged as `what`'s failure); joins finished
  // threads at least every second meanwhile.
  template <typename Listener>
  void AcceptUntilShutdown(Listener* listener, const std::string& what,
                           const std::function<void(int fd, Slot* slot)>& serve) {
    while (true) {
      absl::StatusOr<int> fd = listener->Accept(absl::Now() + absl::Seconds(1));
      if (fd.ok()) {
        Start(*fd, serve);
        continue;
      }
      Reap();
      if (fd.status().code() == absl::StatusCode::kDeadlineExceeded) continue;
      if (fd.status().code() != absl::StatusCode::kCancelled) LOG(ERROR) << what << ": " << fd.status();
      return;
    }
  }

  // Joins the threads that have finished.
  void Reap() {
    std::vector<std::thread> done;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = threads_.begin(); it != threads_.end();) {
        if (it->done) {
          done.push_back(std::move(it->thread));
          it = threads_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (std::thread& t : done) t.join();
  }

  // Refuses new threads and marks, shuts every marked lane (again every 100 ms: a thread may mark one
  // meanwhile, before it sees the stop) until every thread has finished, and joins them. Idempotent.
  void StopAll() {
    std::list<Slot> threads;
    {
      absl::MutexLock lock(&mu_);
      stopped_ = true;
      while (true) {
        bool all_done = true;
        for (Slot& s : threads_) {
          if (!s.done && s.lane != nullptr) s.lane->Shutdown();
          all_done = all_done && s.done;
        }
        if (all_done) break;
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
      }
      threads = std::move(threads_);
      threads_.clear();
    }
    for (Slot& s : threads) s.thread.join();
  }

  int64_t active() const {
    absl::MutexLock lock(&mu_);
    return active_;
  }
  // Connections closed by Start.
  int64_t refused() const {
    absl::MutexLock lock(&mu_);
    return refused_;
  }

 private:
  const int max_threads_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // a thread finished
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int64_t active_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<Slot> threads_ ABSL_GUARDED_BY(mu_);  // a list: a Slot's address stays put
};

}  // namespace dtrain::ps::shm

#endif  // DTRAIN_PS_SHM_LANE_THREADS_H_
