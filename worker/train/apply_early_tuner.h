// Chooses, by measuring, whether a worker asks for the early apply (ps/core/parameter_server.h: the ps applies a
// push as it arrives and the pull streams it back meanwhile). It pays where a step's transfer far exceeds its
// compute and costs where it does not (the pull then no longer overlaps the next forward pass), so instead of
// guessing, the worker tries both, as cudnn.benchmark tries convolution algorithms: after `warmup` steps it runs
// `trial` steps without and `trial` steps with, compares the median step times (the first two of each trial left
// out: they straddle the switch) and keeps the early apply only when it is at least `margin` faster; then it
// tries again every `every` steps (0: never), since a link's load changes.
//
// Usage (once per step, before its push):
//   const bool early = tuner.Next(seconds_since_the_previous_step_started);
//
// Thread-safety: one thread. Errors: none.
#ifndef DTRAIN_WORKER_TRAIN_APPLY_EARLY_TUNER_H_
#define DTRAIN_WORKER_TRAIN_APPLY_EARLY_TUNER_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::worker {

struct ApplyEarlyTunerOptions {
  int warmup = 10;
  int trial = 12;
  int64_t every = 3000;
  double margin = 0.03;  // the early apply must save this fraction of the step time
};

class ApplyEarlyTuner {
 public:
  explicit ApplyEarlyTuner(ApplyEarlyTunerOptions options = {});

  // `seconds`: the wall time of the previous step (from its start to now; ignored for the first call, and
  // negative means unknown). Returns whether the step starting now asks for the early apply.
  bool Next(double seconds);

  // The last decision, for the log: "on: median step 170.2 ms with it, 209.5 ms without" (empty before one).
  const std::string& last_decision() const { return last_decision_; }
  // Decisions made so far (each trial ends in one).
  int decisions() const { return decisions_; }

 private:
  enum class Phase { kWarmup, kTrialOff, kTrialOn, kChosen };
  void Enter(Phase phase);

  const ApplyEarlyTunerOptions options_;
  Phase phase_ = Phase::kWarmup;
  int64_t left_ = 0;       // steps left in the phase
  bool current_ = false;   // what the previous step asked for
  bool chosen_ = false;
  bool first_ = true;
  std::vector<double> off_, on_;  // step times of the trials
  std::string last_decision_;
  int decisions_ = 0;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TRAIN_APPLY_EARLY_TUNER_H_
