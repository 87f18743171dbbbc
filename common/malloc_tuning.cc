#include "common/malloc_tuning.h"

#include <malloc.h>

namespace dtrain {

void TuneMallocForLargeReusedBuffers() {
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

}  // namespace dtrain
