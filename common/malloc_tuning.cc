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

PeriodicMallocTrim::PeriodicMallocTrim(absl::Duration every) {
  if (every > absl::ZeroDuration()) thread_ = std::thread([this, every] { Loop(every); });
}

PeriodicMallocTrim::~PeriodicMallocTrim() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int PeriodicMallocTrim::trims() const {
  absl::MutexLock lock(&mu_);
  return trims_;
}

void PeriodicMallocTrim::Loop(absl::Duration every) {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), every)) {
    mu_.Unlock();
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
    mu_.Lock();
    ++trims_;
  }
}

}  // namespace dtrain
