// The request ids a ps task has recently handled for one worker, so a retried Push (same request_id) is
// recognized and not applied twice (the idea of TensorFlow's recent_request_ids.h). Bounded: remembers the
// last `capacity` ids; a retry arrives within a few calls of its original, far inside that window.
//
// Thread-safety: thread-compatible; the ParameterServer guards it with its lock.
#ifndef DTRAIN_PS_CORE_RECENT_REQUEST_IDS_H_
#define DTRAIN_PS_CORE_RECENT_REQUEST_IDS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_set>

namespace dtrain::ps {

class RecentRequestIds {
 public:
  explicit RecentRequestIds(size_t capacity = 1024);

  bool Contains(uint64_t id) const { return ids_.count(id) > 0; }
  // Remembers `id` (no-op if already remembered), forgetting the oldest id when full.
  void Insert(uint64_t id);
  size_t size() const { return order_.size(); }

 private:
  size_t capacity_;
  std::deque<uint64_t> order_;  // oldest first
  std::unordered_set<uint64_t> ids_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_RECENT_REQUEST_IDS_H_
