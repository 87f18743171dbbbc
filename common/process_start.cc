#include "common/process_start.h"

#include <glog/logging.h>

#include "absl/flags/usage.h"
#include "common/denormals.h"
#include "common/malloc_tuning.h"
#include "common/mutex_config.h"

namespace dtrain {

StopSignals* StartProcess(int argc, char** argv, const CommandLineSpec& spec, const char* usage) {
  StopSignals* signals = StopSignals::Install(spec.program);  // before any thread starts
  absl::SetProgramUsageMessage(usage);
  TuneMallocForLargeReusedBuffers();
  SetFlushDenormals();
  DisableMutexDeadlockDetection();  // threads made from here on inherit it (gRPC's; handlers set it too)
  ParseCommandLineOrExit(argc, argv, spec);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return signals;
}

}  // namespace dtrain
