// Process-wide allocator settings for the dtrain binaries (call first thing in main).
//
// Parameter and gradient messages are megabytes each and are allocated and freed every step. With glibc's
// defaults such blocks are mmap()ed and munmap()ed each time, and every step pays page faults and the kernel's
// page zeroing for them (measured: ~15% of a ps task's CPU time). Keeping blocks up to 256 MB on the heap and
// never trimming it below 512 MB makes the memory reused instead.
//
// Thread-safety: call once, before other threads start.
#ifndef DTRAIN_COMMON_MALLOC_TUNING_H_
#define DTRAIN_COMMON_MALLOC_TUNING_H_

namespace dtrain {

void TuneMallocForLargeReusedBuffers();

}  // namespace dtrain

#endif  // DTRAIN_COMMON_MALLOC_TUNING_H_
