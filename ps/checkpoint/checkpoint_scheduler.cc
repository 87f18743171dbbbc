#include "ps/checkpoint/checkpoint_scheduler.h"

#include <utility>

#include "absl/time/clock.h"

namespace dtrain::ps {

CheckpointScheduler::CheckpointScheduler(int64_t every_steps, double every_secs, std::function<absl::Time()> clock)
    : every_steps_(every_steps), every_secs_(every_secs), clock_(std::move(clock)) {
  if (!clock_) clock_ = [] { return absl::Now(); };
  last_time_ = clock_();
}

std::optional<int64_t> CheckpointScheduler::Due(int64_t label) const {
  if (label <= last_label_) return std::nullopt;
  if (every_steps_ > 0 && label / every_steps_ > last_label_ / every_steps_) return label / every_steps_ * every_steps_;
  if (every_secs_ > 0 && clock_() - last_time_ >= absl::Seconds(every_secs_)) return label;
  return std::nullopt;
}

void CheckpointScheduler::Saved(int64_t label) {
  last_label_ = label;
  last_time_ = clock_();
}

}  // namespace dtrain::ps
