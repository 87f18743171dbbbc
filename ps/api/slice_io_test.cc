// Wire element types (bf16, fp16 rounding, specials, saturation) and the flat pull receiver.
#include "ps/api/slice_io.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace dtrain::ps {
namespace {

// A peer's range is checked without adding: a first + n that overflows to a small number does not pass.
TEST(SliceIoTest, RangeWithinRefusesWhatOverflows) {
  EXPECT_TRUE(RangeWithin(0, 10, 10));
  EXPECT_TRUE(RangeWithin(10, 0, 10));
  EXPECT_FALSE(RangeWithin(5, 6, 10));
  EXPECT_FALSE(RangeWithin(-1, 1, 10));
  EXPECT_FALSE(RangeWithin(1, -1, 10));
  EXPECT_FALSE(RangeWithin(std::numeric_limits<int64_t>::max(), 2, 10));  // first + n overflows negative
  EXPECT_FALSE(RangeWithin(2, std::numeric_limits<int64_t>::max(), 10));
  const int64_t first = std::numeric_limits<int64_t>::max() - 5, n = 10;  // wraps to a negative end
  EXPECT_FALSE(RangeWithin(first, n, 10));
}

TEST(WireDtypeTest, ParseNamesAndSizes) {
  EXPECT_EQ(*ParseWireDtype("fp32"), WireDtype::kF32);
  EXPECT_EQ(*ParseWireDtype("bf16"), WireDtype::kBF16);
  EXPECT_EQ(*ParseWireDtype("fp16"), WireDtype::kF16);
  absl::StatusOr<WireDtype> bad = ParseWireDtype("int8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'int8'"), std::string::npos);
  EXPECT_EQ(DtypeBytes(WireDtype::kF32), 4);
  EXPECT_EQ(DtypeBytes(WireDtype::kBF16), 2);
}

TEST(WireDtypeTest, RoundingIsToNearestEvenWithinHalfAnUlp) {
  EXPECT_EQ(RoundTrip(WireDtype::kBF16, 1.0f), 1.0f);
  EXPECT_EQ(RoundTrip(WireDtype::kBF16, 1.0f + 1.0f / 256), 1.0f);            // tie: to even
  EXPECT_EQ(RoundTrip(WireDtype::kBF16, 1.0f + 3.0f / 256), 1.0f + 4.0f / 256);  // tie: to even (up)
  EXPECT_EQ(RoundTrip(WireDtype::kF16, 1.0f + 1.0f / 2048), 1.0f);             // tie: to even
  EXPECT_EQ(RoundTrip(WireDtype::kF16, 0.1f), 0.0999755859375f);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-100.f, 100.f);
  for (int i = 0; i < 10000; ++i) {
    const float x = u(rng);
    EXPECT_LE(std::fabs(RoundTrip(WireDtype::kBF16, x) - x), std::fabs(x) * (1.0f / 256)) << x;
    EXPECT_LE(std::fabs(RoundTrip(WireDtype::kF16, x) - x), std::fabs(x) * (1.0f / 2048) + 1e-7f) << x;
  }
}

TEST(WireDtypeTest, SpecialValuesAndRange) {
  const float inf = std::numeric_limits<float>::infinity();
  for (WireDtype d : {WireDtype::kBF16, WireDtype::kF16}) {
    EXPECT_TRUE(std::isnan(RoundTrip(d, std::nanf(""))));
    EXPECT_EQ(RoundTrip(d, inf), inf);
    EXPECT_EQ(RoundTrip(d, -inf), -inf);
    EXPECT_EQ(RoundTrip(d, 0.0f), 0.0f);
    EXPECT_TRUE(std::signbit(RoundTrip(d, -0.0f)));
  }
  // fp16 saturates finite values beyond its range instead of making them infinite.
  EXPECT_EQ(RoundTrip(WireDtype::kF16, 1e6f), 65504.0f);
  EXPECT_EQ(RoundTrip(WireDtype::kF16, -1e6f), -65504.0f);
  // fp16 subnormals: 2^-24 is the smallest; half of it rounds to zero (even).
  EXPECT_EQ(RoundTrip(WireDtype::kF16, std::ldexp(1.0f, -24)), std::ldexp(1.0f, -24));
  EXPECT_EQ(RoundTrip(WireDtype::kF16, std::ldexp(1.0f, -25)), 0.0f);
  EXPECT_EQ(RoundTrip(WireDtype::kF16, std::ldexp(3.0f, -20)), std::ldexp(3.0f, -20));
  // bf16 keeps float's range.
  EXPECT_NEAR(RoundTrip(WireDtype::kBF16, 1e30f), 1e30f, 1e30f / 256);
  EXPECT_NEAR(RoundTrip(WireDtype::kBF16, 1e-30f), 1e-30f, 1e-30f / 256);
}

TEST(WireDtypeTest, VectorCodingMatchesScalarAtAnyAlignment) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-70000.f, 70000.f);
  std::vector<float> x(1003);
  for (float& v : x) v = u(rng);
  x[5] = std::numeric_limits<float>::infinity();
  x[6] = std::nanf("");
  for (WireDtype d : {WireDtype::kF32, WireDtype::kBF16, WireDtype::kF16}) {
    std::vector<char> bytes(x.size() * 4 + 1);
    EncodeFloats(d, x.data(), static_cast<int64_t>(x.size()), bytes.data() + 1);  // unaligned on purpose
    std::vector<float> back(x.size());
    DecodeFloats(d, bytes.data() + 1, static_cast<int64_t>(x.size()), back.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = RoundTrip(d, x[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(back[i]));
      } else {
        EXPECT_EQ(back[i], want) << DtypeName(d) << " " << x[i];
      }
    }
  }
}

TEST(FlatPullReceiverTest, ChecksOrderCompletenessAndStrangers) {
  const std::vector<SliceSpec> slices = {{4, "a", 10, 5}, {7, "b", 2, 3}};
  std::vector<float> flat(20, -1.f);
  FlatPullReceiver r(&slices, flat.data());
  EXPECT_EQ(r.Destination(4, 0, 5).status().code(), absl::StatusCode::kDataLoss);  // before the header
  ASSERT_TRUE(r.OnHeader(PullHeader{3, {}, false}).ok());
  EXPECT_EQ(r.Destination(9, 0, 1).status().code(), absl::StatusCode::kDataLoss);   // unknown key
  EXPECT_EQ(r.Destination(4, 2, 1).status().code(), absl::StatusCode::kDataLoss);   // gap
  EXPECT_EQ(r.Destination(7, 0, 4).status().code(), absl::StatusCode::kDataLoss);   // overflow
  absl::StatusOr<PullReceiver::Buffer> d = r.Destination(4, 0, 5);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->data, flat.data() + 10);
  ASSERT_TRUE(r.Written(4, 0, 5).ok());
  EXPECT_EQ(r.Finish().code(), absl::StatusCode::kDataLoss);  // 'b' missing
  ASSERT_TRUE(r.Destination(7, 0, 3).ok());
  ASSERT_TRUE(r.Written(7, 0, 3).ok());
  EXPECT_TRUE(r.Finish().ok());
  EXPECT_EQ(r.header().step, 3);
}

}  // namespace
}  // namespace dtrain::ps
