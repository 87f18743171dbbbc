// The limit on open files of a server process (RLIMIT_NOFILE).
//
// Every connection a ps task holds is a descriptor: each worker's gRPC channels, its shared-memory or TCP lanes
// and segments, dtrain_ctl, monitoring, and any process that connects and says nothing. Many systems start
// processes with a soft limit of 1024 and a hard one far above it (systemd: 1024 / 524288); at the soft limit
// accept() fails, and gRPC's listener then refuses every new connection, honest workers' included, for as long
// as the others stay open. RaiseOpenFileLimit lifts the soft limit to the hard one (as Go's runtime does for
// every program since 1.19), capped at `cap` so that select()-era code in libraries is not surprised; the
// descriptors a peer may hold are then bounded by the servers' own limits (lanes, hello timeouts), not by this.
//
// Thread-safety: call once at start, before other threads (it changes a process-wide limit).
#ifndef DTRAIN_COMMON_OPEN_FILES_H_
#define DTRAIN_COMMON_OPEN_FILES_H_

#include <cstdint>
#include <string>

namespace dtrain {

struct OpenFileLimit {
  int64_t before = 0, after = 0, hard = 0;  // soft limits before and after, the hard limit (-1: unlimited)
  std::string error;                        // why it could not be read or raised (empty: fine)
};

// Raises the soft RLIMIT_NOFILE to min(hard, cap) when it is lower. Never lowers it.
OpenFileLimit RaiseOpenFileLimit(int64_t cap = 1 << 20);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_OPEN_FILES_H_
