#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DTRAIN_CRC32C_X86 1
#endif

#include "glog/logging.h"

namespace dtrain {
namespace crc32c {
namespace {

constexpr uint32_t kReversedPoly = 0x82f63b78u;  // 0x1EDC6F41 bit-reversed

// kTables[k][b] is the CRC of byte b followed by k zero bytes (slicing-by-8).
using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ (kReversedPoly & (0u - (crc & 1u)));
    t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}

const Tables& GetTables() {
  static const Tables* tables = new Tables(MakeTables());
  return *tables;
}

inline uint32_t LoadLE32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

}  // namespace

namespace internal {

uint32_t ExtendPortable(uint32_t init_crc, const void* data, size_t n) {
  const Tables& t = GetTables();
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t crc = init_crc ^ 0xffffffffu;
  while (n >= 8) {
    uint32_t lo = LoadLE32(p) ^ crc;
    uint32_t hi = LoadLE32(p + 4);
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
          t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return crc ^ 0xffffffffu;
}

#if DTRAIN_CRC32C_X86

bool HardwareAvailable() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}

__attribute__((target("sse4.2"))) uint32_t ExtendHardware(uint32_t init_crc, const void* data,
                                                          size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t crc = init_crc ^ 0xffffffffu;
  // Align to 8 bytes so the 64-bit loads are aligned.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    crc = _mm_crc32_u8(crc, *p++);
    --n;
  }
#if defined(__x86_64__)
  uint64_t crc64 = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    crc64 = _mm_crc32_u64(crc64, v);
    p += 8;
    n -= 8;
  }
  crc = static_cast<uint32_t>(crc64);
#endif
  while (n >= 4) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    crc = _mm_crc32_u32(crc, v);
    p += 4;
    n -= 4;
  }
  while (n-- > 0) crc = _mm_crc32_u8(crc, *p++);
  return crc ^ 0xffffffffu;
}

#else  // !DTRAIN_CRC32C_X86

bool HardwareAvailable() { return false; }

uint32_t ExtendHardware(uint32_t init_crc, const void* data, size_t n) {
  LOG(FATAL) << "crc32c::internal::ExtendHardware called on a CPU without SSE4.2";
  return 0;
}

#endif  // DTRAIN_CRC32C_X86

}  // namespace internal

uint32_t Extend(uint32_t init_crc, const void* data, size_t n) {
  if (internal::HardwareAvailable()) return internal::ExtendHardware(init_crc, data, n);
  return internal::ExtendPortable(init_crc, data, n);
}

}  // namespace crc32c
}  // namespace dtrain
