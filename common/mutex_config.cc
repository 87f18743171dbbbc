#include "common/mutex_config.h"

#include <mutex>

#include "absl/synchronization/mutex.h"

namespace dtrain {

void DisableMutexDeadlockDetection() {
  static std::once_flag once;
  std::call_once(once, [] { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); });
}

}  // namespace dtrain
