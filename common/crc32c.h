// CRC-32C (Castagnoli, polynomial 0x1EDC6F41), the checksum of TFRecord files, iSCSI and ext4.
//
//   uint32_t crc = crc32c::Value(header, header_len);
//   crc = crc32c::Extend(crc, body, body_len);          // == Value(header + body)
//   uint32_t stored = crc32c::Mask(crc);                // what TFRecord writes
//
// Uses the SSE4.2 CRC32 instruction when the CPU has it (checked once at run time) and a
// slicing-by-8 table otherwise; both give identical results.
//
// Thread-safety: all functions are pure and thread-safe.
#ifndef DTRAIN_COMMON_CRC32C_H_
#define DTRAIN_COMMON_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace dtrain {
namespace crc32c {

// Returns the CRC-32C of concat(A, data[0, n)) where `init_crc` is the CRC-32C of some string A.
uint32_t Extend(uint32_t init_crc, const void* data, size_t n);

// Returns the CRC-32C of data[0, n).
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

// TFRecord stores masked CRCs: computing the CRC of a string that contains embedded CRCs is
// problematic, so the stored value is rotated and offset.
constexpr uint32_t kMaskDelta = 0xa282ead8u;
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }
inline uint32_t Unmask(uint32_t masked_crc) {
  uint32_t rot = masked_crc - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

// False in every real build. True in fuzzing builds (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, the libFuzzer /
// OSS-Fuzz convention, defined by -DDTRAIN_FUZZ=ON): readers then compute checksums but accept a mismatch, so
// that a fuzzer, which cannot forge a CRC, reaches the fields behind it, as hostile input with a valid CRC would.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
inline constexpr bool kAcceptMismatchForFuzzing = true;
#else
inline constexpr bool kAcceptMismatchForFuzzing = false;
#endif

namespace internal {
// The two implementations behind Extend(), exposed so tests can compare them.
uint32_t ExtendPortable(uint32_t init_crc, const void* data, size_t n);
// Precondition: HardwareAvailable().
uint32_t ExtendHardware(uint32_t init_crc, const void* data, size_t n);
bool HardwareAvailable();
}  // namespace internal

}  // namespace crc32c
}  // namespace dtrain

#endif  // DTRAIN_COMMON_CRC32C_H_
