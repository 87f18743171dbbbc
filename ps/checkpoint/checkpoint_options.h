// CheckpointOptions: every checkpoint setting of a ps task in one struct, carried unchanged from the flags
// (ps/main.cc, worker/app/main.cc for local mode) through PsServerOptions, ParameterServerOptions and
// WorkerOptions to the CheckpointWriter (checkpoint_writer.h) and the restore (checkpoint_dir.h).
//
// Thread-safety: a plain value. `env` must be safe to use from any thread (every Env is).
#ifndef DTRAIN_PS_CHECKPOINT_CHECKPOINT_OPTIONS_H_
#define DTRAIN_PS_CHECKPOINT_CHECKPOINT_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/env.h"

namespace dtrain::ps {

struct CheckpointOptions {
  // Where each ps task writes <dir>/model.ckpt-<step>.ps<task>-of-<num_ps> and restores from. Empty: no
  // checkpoints, neither saved nor restored (the other fields are then unused).
  std::string dir;
  int64_t save_steps =
      0;  // >= 0: save when the global step reaches a multiple of this; 0 = no step-based saves
  double save_secs = 0;  // >= 0: save when this many seconds passed since the last save; 0 = none by time
  int keep = 5;          // >= 0: files of this task kept after a save (the newest ones); 0 keeps all

  // A failed write (full disk, failed rename or fsync...) is tried again, up to max_attempts writes in all,
  // sleeping initial_backoff, then twice as long each time, at most max_backoff, in between. The previous
  // checkpoint is never touched before a new one is complete.
  int max_attempts = 3;                                      // >= 1
  absl::Duration initial_backoff = absl::Milliseconds(200);  // >= 0
  absl::Duration max_backoff = absl::Seconds(5);             // >= initial_backoff

  // The file system. Not owned; tests put a FaultInjectionEnv (common/testing/fault_injection_env.h) here.
  Env* env = Env::Default();

  bool enabled() const { return !dir.empty(); }
};

// OK, or InvalidArgument naming the first field out of range (and its value).
absl::Status ValidateCheckpointOptions(const CheckpointOptions& options);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_OPTIONS_H_
