// When a ps task saves a checkpoint by its own schedule: when the step label crosses a multiple of
// save_checkpoint_steps (saved under that multiple), or when save_checkpoint_secs have passed since the last
// save (saved under the label itself). Time comes from an injected clock, so tests need not sleep.
//
// Thread-safety: thread-compatible; the ParameterServer guards it with its lock.
#ifndef DTRAIN_PS_CHECKPOINT_CHECKPOINT_SCHEDULER_H_
#define DTRAIN_PS_CHECKPOINT_CHECKPOINT_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/time/time.h"

namespace dtrain::ps {

class CheckpointScheduler {
 public:
  // every_steps, every_secs: 0 = off. `clock` defaults to absl::Now.
  CheckpointScheduler(int64_t every_steps, double every_secs, std::function<absl::Time()> clock = nullptr);

  // Whether a save is due at `label`, and the label to save under.
  std::optional<int64_t> Due(int64_t label) const;
  // A checkpoint was taken (or restored) at `label`, now.
  void Saved(int64_t label);
  int64_t last_label() const { return last_label_; }

 private:
  int64_t every_steps_;
  double every_secs_;
  std::function<absl::Time()> clock_;
  int64_t last_label_ = 0;
  absl::Time last_time_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_SCHEDULER_H_
