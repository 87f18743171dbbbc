// PeriodicMallocTrim gives freed heap memory back to the system: with TuneMallocForLargeReusedBuffers a freed
// 64 MiB block stays resident (reused by the next step, the point of the tuning) until a trim runs.
#include "common/malloc_tuning.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "absl/time/clock.h"

#if defined(__SANITIZE_ADDRESS__)
#define DTRAIN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DTRAIN_ASAN 1
#endif
#endif

namespace dtrain {
namespace {

// Resident bytes of this process (/proc/self/statm), -1 when unreadable.
int64_t ResidentBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long size = 0, resident = -1;
  const int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

TEST(PeriodicMallocTrimTest, FreedMemoryIsGivenBack) {
#if !defined(__GLIBC__) || defined(DTRAIN_ASAN)
  GTEST_SKIP() << "glibc's malloc (and malloc_trim) is needed; not under AddressSanitizer";
#endif
  if (ResidentBytes() < 0) GTEST_SKIP() << "/proc/self/statm is not readable";
  TuneMallocForLargeReusedBuffers();
  constexpr size_t kBytes = size_t{64} << 20;
  const int64_t before = ResidentBytes();
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);  // resident now
  ASSERT_GE(ResidentBytes() - before, int64_t{60} << 20);
  std::free(block);
  // Kept: on the heap, below the trim threshold.
  EXPECT_GE(ResidentBytes() - before, int64_t{60} << 20) << "freed memory was returned without a trim";

  PeriodicMallocTrim trim(absl::Milliseconds(20));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (trim.trims() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_GE(trim.trims(), 2);
  EXPECT_LT(ResidentBytes() - before, int64_t{16} << 20) << "the trims gave back too little";
}

TEST(PeriodicMallocTrimTest, OffDoesNothingAndStopsAtOnce) {
  const absl::Time start = absl::Now();
  {
    PeriodicMallocTrim off(absl::ZeroDuration());
    absl::SleepFor(absl::Milliseconds(30));
    EXPECT_EQ(off.trims(), 0);
    PeriodicMallocTrim slow(absl::Hours(1));  // destroyed long before its first trim: must not wait for it
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace dtrain
