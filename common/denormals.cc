#include "common/denormals.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace dtrain {
namespace {
#if defined(__x86_64__) || defined(__i386__)
constexpr unsigned kFtz = 0x8000;  // MXCSR bit 15
constexpr unsigned kDaz = 0x0040;  // MXCSR bit 6
#endif
}  // namespace

void SetFlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(_mm_getcsr() | kFtz | kDaz);
#endif
}

void ClearFlushDenormals() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_setcsr(_mm_getcsr() & ~(kFtz | kDaz));
#endif
}

bool FlushDenormalsEnabled() {
#if defined(__x86_64__) || defined(__i386__)
  return (_mm_getcsr() & (kFtz | kDaz)) == (kFtz | kDaz);
#else
  return false;
#endif
}

}  // namespace dtrain
