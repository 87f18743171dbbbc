#include "common/malloc_tuning.h"

#include <malloc.h>

namespace dtrain {

void TuneMallocForLargeReusedBuffers() {
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

void LimitMallocArenas(int n) {
#ifdef M_ARENA_MAX
  if (n > 0) mallopt(M_ARENA_MAX, n);
#endif
}

}  // namespace dtrain
