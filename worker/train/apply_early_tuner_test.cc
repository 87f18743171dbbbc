#include "worker/train/apply_early_tuner.h"

#include <vector>

#include "gtest/gtest.h"

namespace dtrain::worker {
namespace {

// Drives the tuner for `steps` steps whose time depends on the mode each asked for; returns the modes.
std::vector<bool> Drive(ApplyEarlyTuner& tuner, int steps, double off_seconds, double on_seconds) {
  std::vector<bool> modes;
  double last = -1;
  for (int i = 0; i < steps; ++i) {
    const bool early = tuner.Next(last);
    modes.push_back(early);
    last = early ? on_seconds : off_seconds;
  }
  return modes;
}

ApplyEarlyTunerOptions Small() {
  ApplyEarlyTunerOptions o;
  o.warmup = 2;
  o.trial = 4;
  o.every = 10;
  return o;
}

TEST(ApplyEarlyTunerTest, WarmsUpThenTriesBothThenKeepsTheFaster) {
  ApplyEarlyTuner tuner(Small());
  const std::vector<bool> modes = Drive(tuner, 14, /*off=*/0.200, /*on=*/0.150);
  // warmup 2 off, trial 4 off, trial 4 on, then the choice.
  const std::vector<bool> expected = {false, false, false, false, false, false, true, true, true, true,
                                      true,  true,  true,  true};
  EXPECT_EQ(modes, expected);
  EXPECT_EQ(tuner.decisions(), 1);
  EXPECT_EQ(tuner.last_decision(), "on: median step 150.0 ms with it, 200.0 ms without");
}

TEST(ApplyEarlyTunerTest, KeepsItOffUnlessClearlyFaster) {
  for (double on : {0.250, 0.200, 0.197}) {  // slower, equal, within the 3% margin
    ApplyEarlyTuner tuner(Small());
    const std::vector<bool> modes = Drive(tuner, 14, /*off=*/0.200, on);
    EXPECT_FALSE(modes.back()) << on;
    EXPECT_EQ(tuner.decisions(), 1);
  }
}

TEST(ApplyEarlyTunerTest, TriesAgainAndFollowsAChangedLink) {
  ApplyEarlyTuner tuner(Small());
  Drive(tuner, 11, 0.200, 0.150);  // decided on
  EXPECT_TRUE(tuner.Next(0.150));
  // The link got fast: the early apply now costs. After `every` steps it tries both again and turns it off.
  std::vector<bool> modes;
  double last = 0.150;
  for (int i = 0; i < 30; ++i) {
    const bool early = tuner.Next(last);
    modes.push_back(early);
    last = early ? 0.060 : 0.050;
  }
  EXPECT_EQ(tuner.decisions(), 2);
  EXPECT_FALSE(modes.back());
  EXPECT_EQ(tuner.last_decision(), "off: median step 60.0 ms with it, 50.0 ms without");
}

TEST(ApplyEarlyTunerTest, OutliersAndTheSwitchDoNotDecide) {
  ApplyEarlyTunerOptions o = Small();
  o.trial = 6;
  ApplyEarlyTuner tuner(o);
  // Off steps: 200 ms, but one step with an evaluation takes 2 s; the first on steps straddle the switch (slow).
  const std::vector<double> times = {0.2, 0.2, 0.2, 0.2, 2.0, 0.2, 0.2, 0.2, 0.9, 0.9, 0.15, 0.15, 0.15, 0.15, 0.15};
  bool early = false;
  tuner.Next(-1);
  for (double t : times) early = tuner.Next(t);
  EXPECT_TRUE(early);
  EXPECT_EQ(tuner.decisions(), 1);
}

}  // namespace
}  // namespace dtrain::worker
