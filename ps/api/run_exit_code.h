// The exit code of a dtrain_ps or dtrain_worker whose run ended (common/exit_codes.h,
// docs/faults_and_endings.md), one table for both binaries.
//
// Thread-safety: a pure function.
#ifndef DTRAIN_PS_API_RUN_EXIT_CODE_H_
#define DTRAIN_PS_API_RUN_EXIT_CODE_H_

#include "ps/api/ps_types.h"

namespace dtrain::ps {

// Complete 0; degraded 3 (0 with `allow_degraded`, the binaries' --allow_degraded); refused 2 (the same code as
// the refused process); ended early 4 (a peer failed).
int ExitCodeOfRun(RunOutcome outcome, bool allow_degraded);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_API_RUN_EXIT_CODE_H_
