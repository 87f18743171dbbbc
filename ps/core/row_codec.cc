#include "ps/core/row_codec.h"

#include <cmath>
#include <cstring>

namespace dtrain::ps {
namespace {

uint16_t Load16(const void* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// The float a 16-bit pattern of type d stands for.
float Value(RowDtype d, uint16_t h) {
  float x;
  DecodeFloats(WireDtypeOf(d), &h, 1, &x);
  return x;
}

}  // namespace

void DecodeRow(RowDtype d, const void* src, int n, float* dst) { DecodeFloats(WireDtypeOf(d), src, n, dst); }

void EncodeRowNearest(RowDtype d, const float* src, int n, void* dst) { EncodeFloats(WireDtypeOf(d), src, n, dst); }

void EncodeRowStochastic(RowDtype d, const float* src, int n, void* dst, uint64_t seed) {
  if (d == RowDtype::kF32) {
    std::memcpy(dst, src, sizeof(float) * n);
    return;
  }
  EncodeFloats(WireDtypeOf(d), src, n, dst);  // nearest first; then move to the other neighbour by chance
  char* out = static_cast<char*>(dst);
  const uint16_t max_finite = d == RowDtype::kF16 ? 0x7bff : 0x7f7f;
  for (int i = 0; i < n; ++i) {
    const float x = src[i];
    if (!std::isfinite(x)) continue;
    const uint16_t h = Load16(out + 2 * i);
    const float near = Value(d, h);
    const float ax = std::fabs(x), an = std::fabs(near);
    if (an == ax) continue;
    const uint16_t sign = h & 0x8000u, mag = h & 0x7fffu;
    // Magnitudes are ordered as their bit patterns: the other neighbour is one pattern down or up.
    uint16_t other;
    if (an > ax) {
      if (mag == 0) continue;
      other = static_cast<uint16_t>(mag - 1);
    } else {
      if (mag >= max_finite) continue;  // saturated: no finite neighbour above
      other = static_cast<uint16_t>(mag + 1);
    }
    const float ao = std::fabs(Value(d, other));
    const float lo = an < ao ? an : ao, hi = an < ao ? ao : an;
    const uint16_t lo_bits = an < ao ? mag : other, hi_bits = an < ao ? other : mag;
    const double p = (static_cast<double>(ax) - lo) / (static_cast<double>(hi) - lo);  // of the upper one
    const double u = static_cast<double>(Mix64(seed + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(i + 1)) >> 11) *
                     0x1.0p-53;
    const uint16_t pick = static_cast<uint16_t>(sign | (u < p ? hi_bits : lo_bits));
    std::memcpy(out + 2 * i, &pick, 2);
  }
}

}  // namespace dtrain::ps
