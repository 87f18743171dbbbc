// The start of a cluster task's main() (dtrain_ps, dtrain_worker), before any other thread starts: the
// graceful stop on SIGTERM/SIGINT installed (stop_signal.h), malloc tuned for large reused buffers
// (malloc_tuning.h), denormals flushed and Abseil's mutex deadlock detection off (threads made later inherit
// both: denormals.h, mutex_config.h), the command line parsed (command_line.h) and glog writing to stderr.
//
// Usage, first thing in main():
//   dtrain::CommandLineSpec spec;
//   spec.program = "dtrain_ps"; ...
//   dtrain::StopSignals* signals = dtrain::StartProcess(argc, argv, spec, "dtrain parameter server task");
//
// Errors: none returned. A bad flag or command line exits the process with 2 (kExitConfigRefused, saying what
// is wrong), --help exits 0 after printing the flags (ParseCommandLineOrExit).
// Thread-safety: call once, from main(), before any thread starts.
#ifndef DTRAIN_COMMON_PROCESS_START_H_
#define DTRAIN_COMMON_PROCESS_START_H_

#include "common/command_line.h"
#include "common/stop_signal.h"

namespace dtrain {

// Does the above in that order, for the binary `spec.program` (its name in the stop lines and messages);
// `usage` is Abseil's program usage message. Returns the stop signals (they live as long as the process).
StopSignals* StartProcess(int argc, char** argv, const CommandLineSpec& spec, const char* usage);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_PROCESS_START_H_
