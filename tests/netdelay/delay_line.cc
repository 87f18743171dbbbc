#include "tests/netdelay/delay_line.h"

namespace dtrain::netdelay {

DelayLine::DelayLine(int64_t delay_ns) : delay_ns_(delay_ns < 0 ? 0 : delay_ns) {}

void DelayLine::Add(uint32_t id, int64_t now_ns) {
  held_.push_back({id, now_ns + delay_ns_});
  if (held_.size() > max_size_) max_size_ = held_.size();
}

std::optional<uint32_t> DelayLine::TakeDue(int64_t now_ns) {
  std::optional<uint32_t> last;
  while (!held_.empty() && held_.front().due_ns <= now_ns) {
    last = held_.front().id;
    held_.pop_front();
  }
  return last;
}

int64_t DelayLine::NextDueNs() const { return held_.empty() ? -1 : held_.front().due_ns; }

std::optional<uint32_t> DelayLine::TakeAll() {
  if (held_.empty()) return std::nullopt;
  const uint32_t last = held_.back().id;
  held_.clear();
  return last;
}

}  // namespace dtrain::netdelay
