#include "ps/api/run_exit_code.h"

#include "common/exit_codes.h"

namespace dtrain::ps {

int ExitCodeOfRun(RunOutcome outcome, bool allow_degraded) {
  switch (outcome) {
    case RunOutcome::kComplete:
      return kExitComplete;
    case RunOutcome::kDegraded:
      return allow_degraded ? kExitComplete : kExitDegraded;
    case RunOutcome::kRefused:
      return kExitConfigRefused;  // the same code as the refused process
    case RunOutcome::kEndedEarly:
      break;
  }
  return kExitPeerFailed;
}

}  // namespace dtrain::ps
