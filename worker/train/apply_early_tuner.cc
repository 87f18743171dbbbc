#include "worker/train/apply_early_tuner.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace dtrain::worker {
namespace {

// The median of the times, the first two left out (they straddle the switch of mode); -1 when none is left.
double Median(std::vector<double> v) {
  v.erase(v.begin(), v.begin() + std::min<size_t>(2, v.size()));
  v.erase(std::remove_if(v.begin(), v.end(), [](double t) { return t < 0; }), v.end());
  if (v.empty()) return -1;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

ApplyEarlyTuner::ApplyEarlyTuner(ApplyEarlyTunerOptions options) : options_(options) {
  Enter(options_.warmup > 0 ? Phase::kWarmup : Phase::kTrialOff);
}

void ApplyEarlyTuner::Enter(Phase phase) {
  phase_ = phase;
  switch (phase) {
    case Phase::kWarmup: left_ = options_.warmup; break;
    case Phase::kTrialOff:
      off_.clear();
      left_ = std::max(3, options_.trial);
      break;
    case Phase::kTrialOn:
      on_.clear();
      left_ = std::max(3, options_.trial);
      break;
    case Phase::kChosen: left_ = options_.every > 0 ? options_.every : -1; break;
  }
}

bool ApplyEarlyTuner::Next(double seconds) {
  // The previous step's time belongs to the phase it ran in.
  if (!first_) {
    if (phase_ == Phase::kTrialOff) off_.push_back(seconds);
    if (phase_ == Phase::kTrialOn) on_.push_back(seconds);
    if (left_ > 0 && --left_ == 0) {
      switch (phase_) {
        case Phase::kWarmup: Enter(Phase::kTrialOff); break;
        case Phase::kTrialOff: Enter(Phase::kTrialOn); break;
        case Phase::kTrialOn: {
          const double off = Median(off_), on = Median(on_);
          chosen_ = off > 0 && on > 0 && on < off * (1.0 - options_.margin);
          last_decision_ = absl::StrFormat("%s: median step %.1f ms with it, %.1f ms without", chosen_ ? "on" : "off",
                                           on * 1e3, off * 1e3);
          ++decisions_;
          Enter(Phase::kChosen);
          break;
        }
        case Phase::kChosen: Enter(Phase::kTrialOff); break;
      }
    }
  }
  first_ = false;
  switch (phase_) {
    case Phase::kWarmup:
    case Phase::kTrialOff: current_ = false; break;
    case Phase::kTrialOn: current_ = true; break;
    case Phase::kChosen: current_ = chosen_; break;
  }
  return current_;
}

}  // namespace dtrain::worker
