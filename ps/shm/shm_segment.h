// Shared memory between a worker and a ps task on one host.
//
// ShmSegment: an anonymous memory file (memfd_create, "memfd:dtrain-shm") mapped MAP_SHARED. It has no name in
// any file system and vanishes when the last process holding its descriptor or a mapping exits, however it
// exits (kill -9 included): nothing is ever left behind in /dev/shm. Its size is sealed (F_SEAL_SHRINK,
// F_SEAL_GROW, F_SEAL_SEAL) before it is shared, so the process that maps it cannot be made to fault by a peer
// shrinking the file; Map refuses a descriptor without those seals.
//
// SharedHostMemory: a HostMemory (common/host_memory.h) whose allocations are whole segments, so that a worker's
// flat parameter and gradient buffers can be handed to the ps (ps/shm/shm_ps_client.h) and the ps reads the
// gradients and writes the parameters in place. Find tells whether a range lies in one of them.
//
// Thread-safety: ShmSegment is immutable after creation (its memory is the callers' business); SharedHostMemory
// is thread-safe.
#ifndef DTRAIN_PS_SHM_SHM_SEGMENT_H_
#define DTRAIN_PS_SHM_SHM_SEGMENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/host_memory.h"

namespace dtrain::ps::shm {

// The name every dtrain memfd carries (/proc/PID/fd shows "/memfd:dtrain-shm (deleted)").
inline constexpr char kSegmentName[] = "dtrain-shm";

class ShmSegment {
 public:
  // A new zero-filled segment of `bytes` (rounded up to whole pages), sealed and mapped read-write.
  // ResourceExhausted (or the system's error) when it cannot be made.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(int64_t bytes);
  // Maps a segment another process created, from its descriptor (taken over: closed once mapped, or on
  // error). FailedPrecondition when it is not a sealed memory file of exactly `bytes` bytes.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Map(int fd, int64_t bytes);
  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  char* data() const { return data_; }
  int64_t size() const { return size_; }
  // The descriptor to pass to a peer (-1 for a mapped segment, whose descriptor was closed).
  int fd() const { return fd_; }
  bool Contains(const void* p, int64_t bytes) const {
    const char* c = static_cast<const char*>(p);
    return c >= data_ && bytes >= 0 && bytes <= size_ && c - data_ <= size_ - bytes;
  }

 private:
  ShmSegment(char* data, int64_t size, int fd) : data_(data), size_(size), fd_(fd) {}
  char* const data_;
  const int64_t size_;
  const int fd_;
};

class SharedHostMemory : public HostMemory {
 public:
  // The process's instance (never destroyed).
  static SharedHostMemory* Default();

  absl::StatusOr<float*> Allocate(int64_t n) override;
  void Free(float* p) override;
  // The segment holding all of [p, p + bytes) and p's byte offset in it, or null.
  std::shared_ptr<ShmSegment> Find(const void* p, int64_t bytes, int64_t* offset) const;

 private:
  mutable absl::Mutex mu_;
  std::map<const char*, std::shared_ptr<ShmSegment>> segments_ ABSL_GUARDED_BY(mu_);  // by base address
};

// Segments (memfd:dtrain-shm) process `pid` holds open or mapped now, counted once each (-1: unreadable). Tests
// use it to prove that nothing is leaked.
int CountSegments(int pid);

}  // namespace dtrain::ps::shm

#endif  // DTRAIN_PS_SHM_SHM_SEGMENT_H_
