#include "ps/tcp/tcp_frame.h"

#include <string>

#include "gtest/gtest.h"

namespace dtrain::ps::tcp {
namespace {

TEST(TcpFrameTest, HeaderRoundTrips) {
  const std::string payload = "some payload";
  const std::string h = EncodeTcpHeader(TcpFrameType::kPushData, payload, 4096);
  ASSERT_EQ(h.size(), kTcpHeaderBytes);
  absl::StatusOr<TcpFrameHeader> d = DecodeTcpHeader(h);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->type, TcpFrameType::kPushData);
  EXPECT_EQ(d->payload_bytes, payload.size());
  EXPECT_EQ(d->bulk_bytes, 4096u);
  EXPECT_TRUE(CheckTcpPayload(*d, payload).ok());
  EXPECT_EQ(CheckTcpPayload(*d, "some paylaod").code(), absl::StatusCode::kDataLoss);  // checksum
  EXPECT_EQ(CheckTcpPayload(*d, "short").code(), absl::StatusCode::kDataLoss);         // length
}

TEST(TcpFrameTest, BadHeadersAreDataLossNamingWhatIsWrong) {
  const std::string good = EncodeTcpHeader(TcpFrameType::kPullData, "", 8);
  auto with = [&](size_t at, char v) {
    std::string h = good;
    h[at] = v;
    return DecodeTcpHeader(h).status();
  };
  EXPECT_EQ(DecodeTcpHeader(good.substr(0, 23)).status().code(), absl::StatusCode::kDataLoss);
  absl::Status magic = with(0, 'X');
  EXPECT_EQ(magic.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(magic.message().find("magic"), std::string::npos) << magic;
  absl::Status version = with(4, 9);
  EXPECT_NE(version.message().find("version 9"), std::string::npos) << version;
  absl::Status type = with(6, 99);
  EXPECT_NE(type.message().find("type 99"), std::string::npos) << type;
  // A payload longer than any frame's.
  std::string big = good;
  big[10] = 0x7f;
  EXPECT_NE(DecodeTcpHeader(big).status().message().find("payload of"), std::string::npos);
  // Data on a type that carries none.
  absl::Status bulk = DecodeTcpHeader(EncodeTcpHeader(TcpFrameType::kPushFinish, "", 1)).status();
  EXPECT_EQ(bulk.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bulk.message().find("cannot carry"), std::string::npos) << bulk;
  // Past the largest bulk.
  EXPECT_EQ(DecodeTcpHeader(EncodeTcpHeader(TcpFrameType::kPushData, "", kMaxTcpBulk + 1)).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(TcpFrameTest, PiecesRoundTripAndCheckTheirCounts) {
  const Piece slice{7, 65536, 1000, WireDtype::kBF16, 0};
  absl::StatusOr<Piece> s = DecodeSlicePiece(EncodeSlicePiece(slice));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->key, 7u);
  EXPECT_EQ(s->offset, 65536);
  EXPECT_EQ(s->n, 1000);
  EXPECT_EQ(s->dtype, WireDtype::kBF16);
  EXPECT_EQ(*PieceBulkBytes(*s, false), 2000u);
  const Piece rows{2, 10, 5, WireDtype::kF32, 16};
  absl::StatusOr<Piece> r = DecodeRowPiece(EncodeRowPiece(rows));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dim, 16);
  EXPECT_EQ(*PieceBulkBytes(*r, true), 5u * 16 * 4);
  // A slice piece is not a row piece (lengths differ), negative counts and a row width of 0 are refused.
  EXPECT_EQ(DecodeRowPiece(EncodeSlicePiece(slice)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeSlicePiece(EncodeSlicePiece(Piece{1, -1, 4, WireDtype::kF32, 0})).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeRowPiece(EncodeRowPiece(Piece{1, 0, 4, WireDtype::kF32, 0})).status().code(),
            absl::StatusCode::kDataLoss);
  std::string bad_dtype = EncodeSlicePiece(slice);
  bad_dtype[20] = 3;
  EXPECT_EQ(DecodeSlicePiece(bad_dtype).status().code(), absl::StatusCode::kDataLoss);
  // Counts whose bytes would pass a frame's limit (or overflow) are refused before anything is read.
  EXPECT_FALSE(PieceBulkBytes(Piece{1, 0, int64_t{1} << 62, WireDtype::kF32, 0}, false).ok());
  EXPECT_FALSE(PieceBulkBytes(Piece{1, 0, int64_t{1} << 40, WireDtype::kF32, 1 << 20}, true).ok());
}

}  // namespace
}  // namespace dtrain::ps::tcp
