// Free TCP ports on 127.0.0.1 for servers a process starts itself (benchmarks, the profile's transport probe,
// tests).
//
// Thread-safety: thread-safe. The ports are free when returned; another process may still take one before the
// caller binds it (a small race, harmless where a failed start is reported).
#ifndef DTRAIN_COMMON_FREE_PORTS_H_
#define DTRAIN_COMMON_FREE_PORTS_H_

#include <vector>

namespace dtrain {

// `count` distinct free ports: every socket stays bound until all are picked (picked one at a time, the kernel
// may hand the same port out twice). Empty when sockets cannot be made.
std::vector<int> FreePorts(int count);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_FREE_PORTS_H_
