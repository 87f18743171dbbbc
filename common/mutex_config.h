// Process-wide settings of absl::Mutex for dtrain.
//
// Debian's Abseil is built with its debug checks on, so absl::Mutex tracks a lock-order graph on every nested
// acquisition. Our code is compiled with NDEBUG, which inlines an empty Mutex destructor: destroyed mutexes stay
// in the graph, a new mutex at a reused address inherits their edges, and the checker aborts on cycles that do
// not exist (seen with per-worker buffer locks of successive ParameterServers). It also costs time on every
// nested lock of the ps hot path. dtrain documents its lock order per class instead (e.g.
// ps/core/parameter_server_impl.h), and the sanitizer build checks the code.
//
// Thread-safety: call before other threads take nested locks; calling it again is harmless.
#ifndef DTRAIN_COMMON_MUTEX_CONFIG_H_
#define DTRAIN_COMMON_MUTEX_CONFIG_H_

namespace dtrain {

void DisableMutexDeadlockDetection();

}  // namespace dtrain

#endif  // DTRAIN_COMMON_MUTEX_CONFIG_H_
