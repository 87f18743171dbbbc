#include "common/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dtrain {
namespace crc32c {
namespace {

// Both implementations, so every vector is checked against each of them.
using ExtendFn = uint32_t (*)(uint32_t, const void*, size_t);

std::vector<std::pair<const char*, ExtendFn>> Implementations() {
  std::vector<std::pair<const char*, ExtendFn>> impls = {{"dispatch", &Extend},
                                                         {"portable", &internal::ExtendPortable}};
  if (internal::HardwareAvailable()) impls.push_back({"sse4.2", &internal::ExtendHardware});
  return impls;
}

TEST(Crc32cTest, StandardCheckValue) {
  for (const auto& [name, fn] : Implementations()) {
    EXPECT_EQ(fn(0, "123456789", 9), 0xE3069283u) << name;
    EXPECT_EQ(fn(0, "", 0), 0u) << name;
    EXPECT_EQ(fn(0, "a", 1), 0xC1D04330u) << name;
  }
}

// RFC 3720, appendix B.4.
TEST(Crc32cTest, IscsiVectors) {
  uint8_t buf[32];
  for (const auto& [name, fn] : Implementations()) {
    std::memset(buf, 0, sizeof(buf));
    EXPECT_EQ(fn(0, buf, sizeof(buf)), 0x8A9136AAu) << name;
    std::memset(buf, 0xff, sizeof(buf));
    EXPECT_EQ(fn(0, buf, sizeof(buf)), 0x62A8AB43u) << name;
    for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
    EXPECT_EQ(fn(0, buf, sizeof(buf)), 0x46DD794Eu) << name;
    for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
    EXPECT_EQ(fn(0, buf, sizeof(buf)), 0x113FDB5Cu) << name;

    const uint8_t read_pdu[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    };
    EXPECT_EQ(fn(0, read_pdu, sizeof(read_pdu)), 0xD9963A56u) << name;
  }
}

TEST(Crc32cTest, ExtendEqualsValueOfConcatenation) {
  const std::string a = "hello ";
  const std::string b = "world, this spans more than eight bytes";
  const std::string ab = a + b;
  for (const auto& [name, fn] : Implementations()) {
    EXPECT_EQ(fn(fn(0, a.data(), a.size()), b.data(), b.size()), fn(0, ab.data(), ab.size()))
        << name;
  }
  EXPECT_NE(Value("a", 1), Value("foo", 3));
}

TEST(Crc32cTest, PortableAndHardwareAgreeOnRandomData) {
  if (!internal::HardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937 rng(1234);
  std::vector<uint8_t> data(70000);
  for (uint8_t& byte : data) byte = static_cast<uint8_t>(rng());
  // Every length 0..300 at every alignment 0..7, then a few large chunks with random seeds.
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n <= 300; ++n) {
      const uint8_t* p = data.data() + offset;
      ASSERT_EQ(internal::ExtendPortable(0, p, n), internal::ExtendHardware(0, p, n))
          << "offset " << offset << " length " << n;
    }
  }
  for (int trial = 0; trial < 20; ++trial) {
    size_t offset = rng() % 1000;
    size_t n = rng() % (data.size() - offset);
    uint32_t seed = static_cast<uint32_t>(rng());
    ASSERT_EQ(internal::ExtendPortable(seed, data.data() + offset, n),
              internal::ExtendHardware(seed, data.data() + offset, n))
        << "trial " << trial;
  }
}

TEST(Crc32cTest, MaskRoundTrips) {
  const uint32_t crc = Value("foo", 3);
  EXPECT_NE(crc, Mask(crc));
  EXPECT_NE(crc, Mask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Unmask(Mask(Mask(crc)))));
  std::mt19937 rng(7);
  for (int i = 0; i < 1000; ++i) {
    uint32_t v = static_cast<uint32_t>(rng());
    ASSERT_EQ(Unmask(Mask(v)), v);
  }
  // Rotate right by 15 then add the delta: bit 15 lands in bit 0.
  EXPECT_EQ(Mask(1u << 15), 1u + kMaskDelta);
  EXPECT_EQ(Mask(0), kMaskDelta);
}

}  // namespace
}  // namespace crc32c
}  // namespace dtrain
