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
// LimitMallocArenas caps their number, so the memory kept stops growing once each has held one step's buffers.
//
// Thread-safety: call both once, before other threads start.
#ifndef DTRAIN_COMMON_MALLOC_TUNING_H_
#define DTRAIN_COMMON_MALLOC_TUNING_H_

namespace dtrain {

void TuneMallocForLargeReusedBuffers();

// At most `n` malloc arenas in this process (n <= 0: glibc's default).
void LimitMallocArenas(int n);

}  // namespace dtrain

#endif  // DTRAIN_COMMON_MALLOC_TUNING_H_
