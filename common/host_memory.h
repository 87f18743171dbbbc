// Where a worker's flat host buffers (its parameters and gradients, worker/towers/towers.h) live. By default
// they are ordinary heap (or pinned) memory. A transport that can hand memory to another process on the same
// host (ps/shm/shared_host_memory.h) gives its own HostMemory, so that the ps task reads gradients from and
// writes parameters into the worker's buffers themselves, with no copy in between.
//
// Thread-safety: implementations are thread-safe.
#ifndef DTRAIN_COMMON_HOST_MEMORY_H_
#define DTRAIN_COMMON_HOST_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace dtrain {

class HostMemory {
 public:
  virtual ~HostMemory() = default;
  // n floats, zero-filled, aligned to at least 64 bytes. ResourceExhausted (or the system's error) when the
  // memory cannot be had.
  virtual absl::StatusOr<float*> Allocate(int64_t n) = 0;
  // Gives back what Allocate returned (nullptr: nothing).
  virtual void Free(float* p) = 0;
};

}  // namespace dtrain

#endif  // DTRAIN_COMMON_HOST_MEMORY_H_
