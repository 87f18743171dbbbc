#include "ps/api/run_exit_code.h"

#include "common/exit_codes.h"
#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

// The table of common/exit_codes.h, shared by dtrain_ps and dtrain_worker.
TEST(ExitCodeOfRunTest, EachOutcomeHasItsCode) {
  EXPECT_EQ(ExitCodeOfRun(RunOutcome::kComplete, false), 0);
  EXPECT_EQ(ExitCodeOfRun(RunOutcome::kComplete, true), 0);
  EXPECT_EQ(ExitCodeOfRun(RunOutcome::kDegraded, false), 3);
  EXPECT_EQ(ExitCodeOfRun(RunOutcome::kDegraded, true), 0);  // --allow_degraded
  EXPECT_EQ(ExitCodeOfRun(RunOutcome::kRefused, false), kExitConfigRefused);
  EXPECT_EQ(ExitCodeOfRun(RunOutcome::kRefused, true), 2);
  EXPECT_EQ(ExitCodeOfRun(RunOutcome::kEndedEarly, false), 4);
  EXPECT_EQ(ExitCodeOfRun(RunOutcome::kEndedEarly, true), kExitPeerFailed);
}

}  // namespace
}  // namespace dtrain::ps
