#include "ps/core/recent_request_ids.h"

#include "glog/logging.h"

namespace dtrain::ps {

RecentRequestIds::RecentRequestIds(size_t capacity) : capacity_(capacity) { CHECK_GT(capacity, 0u); }

void RecentRequestIds::Insert(uint64_t id) {
  if (!ids_.insert(id).second) return;
  order_.push_back(id);
  if (order_.size() > capacity_) {
    ids_.erase(order_.front());
    order_.pop_front();
  }
}

}  // namespace dtrain::ps
