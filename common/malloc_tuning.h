// Process-wide allocator settings for the dtrain binaries (call first thing in main).
//
// Parameter and gradient messages are megabytes each and are allocated and freed every step. With glibc's
// defaults such blocks are mmap()ed and munmap()ed each time, and every step pays page faults and the kernel's
// page zeroing for them (measured: ~15% of a ps task's CPU time). Keeping blocks up to 256 MB on the heap and
// never trimming it below 512 MB makes the memory reused instead.
//
// The price: every malloc arena (glibc makes one per thread that meets contention, up to 8 per core) keeps the
// most it ever held, and malloc_trim() gives back nothing of a thread arena's top. A server whose many gRPC
// threads wander over the arenas grows slowly for as long as it runs (a 10-minute soak of 1 ps + 4 workers:
// dtrain_ps +7.6%, then +8.5% with a malloc_trim every 5 s, while the bytes in use stayed at 17 MiB).
// LimitMallocArenas caps their number, so the memory kept stops growing once each has held one step's buffers
// (with 2 arenas: 54 -> 57 MiB in the same soak, +5.2%, each rise one model-sized buffer: a rare moment when
// one more message than ever before was alive). PeriodicMallocTrim gives the free pages back every few seconds
// (all of the main arena's, the free chunks of the others), so such a high-water mark does not stay -- except in a
// thread arena's top chunk: malloc_trim cuts the main arena's top only, and a thread arena's top shrinks on free
// only past the trim threshold (512 MB here). A thread arena thus keeps resident the most its top ever reached (a
// 2-hour soak: 10.7 MiB resident for 7.0 MiB in use right after a trim; docs/faults_and_endings.md). One arena
// (LimitMallocArenas(1)) removes that, for about 2% more CPU per push at 4 workers and 7-10% at 64.
//
// Thread-safety: TuneMallocForLargeReusedBuffers and LimitMallocArenas: call once, before other threads start.
// PeriodicMallocTrim: construct and destroy from one thread; it runs its own.
#ifndef DTRAIN_COMMON_MALLOC_TUNING_H_
#define DTRAIN_COMMON_MALLOC_TUNING_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dtrain {

void TuneMallocForLargeReusedBuffers();

// At most `n` malloc arenas in this process (n <= 0: glibc's default).
void LimitMallocArenas(int n);

// Calls malloc_trim(0) every `every` on a thread of its own until destroyed (nothing where glibc's malloc_trim
// is missing). `every` <= 0: does nothing.
class PeriodicMallocTrim {
 public:
  explicit PeriodicMallocTrim(absl::Duration every);
  ~PeriodicMallocTrim();
  PeriodicMallocTrim(const PeriodicMallocTrim&) = delete;
  PeriodicMallocTrim& operator=(const PeriodicMallocTrim&) = delete;

  // How many trims ran so far.
  int trims() const;

 private:
  void Loop(absl::Duration every);

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int trims_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace dtrain

#endif  // DTRAIN_COMMON_MALLOC_TUNING_H_
