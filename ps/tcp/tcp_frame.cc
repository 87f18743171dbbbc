#include "ps/tcp/tcp_frame.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"

namespace dtrain::ps::tcp {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  out->append(b, sizeof(T));
}

template <typename T>
T Get(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return static_cast<T>(v);
}

// A piece is 4 + 8 + 8 + 1 (+ 4 for rows) bytes.
constexpr size_t kSlicePieceBytes = 21;
constexpr size_t kRowPieceBytes = 25;

absl::StatusOr<Piece> DecodePiece(absl::string_view payload, bool rows) {
  const size_t want = rows ? kRowPieceBytes : kSlicePieceBytes;
  const char* what = rows ? "a row piece" : "a slice piece";
  if (payload.size() != want) {
    return absl::DataLossError(absl::StrCat("TCP frame: ", what, " of ", payload.size(), " bytes, not ", want));
  }
  Piece p;
  p.key = Get<uint32_t>(payload.data());
  p.offset = Get<int64_t>(payload.data() + 4);
  p.n = Get<int64_t>(payload.data() + 12);
  const uint8_t dtype = static_cast<uint8_t>(payload[20]);
  if (dtype > static_cast<uint8_t>(WireDtype::kF16)) {
    return absl::DataLossError(absl::StrCat("TCP frame: ", what, " of wire dtype ", dtype));
  }
  p.dtype = static_cast<WireDtype>(dtype);
  if (rows) p.dim = Get<int32_t>(payload.data() + 21);
  if (p.offset < 0 || p.n < 0 || (rows && p.dim < 1)) {
    return absl::DataLossError(absl::StrCat("TCP frame: ", what, " at ", p.offset, " of ", p.n,
                                            rows ? absl::StrCat(" rows of ", p.dim, " values") : " values"));
  }
  return p;
}

std::string EncodePiece(const Piece& p, bool rows) {
  std::string out;
  out.reserve(rows ? kRowPieceBytes : kSlicePieceBytes);
  Put<uint32_t>(&out, p.key);
  Put<uint64_t>(&out, static_cast<uint64_t>(p.offset));
  Put<uint64_t>(&out, static_cast<uint64_t>(p.n));
  Put<uint8_t>(&out, static_cast<uint8_t>(p.dtype));
  if (rows) Put<uint32_t>(&out, static_cast<uint32_t>(p.dim));
  return out;
}

}  // namespace

absl::string_view TcpFrameTypeName(TcpFrameType type) {
  switch (type) {
    case TcpFrameType::kHello: return "Hello";
    case TcpFrameType::kWelcome: return "Welcome";
    case TcpFrameType::kPushBegin: return "PushBegin";
    case TcpFrameType::kPushData: return "PushData";
    case TcpFrameType::kPushRows: return "PushRows";
    case TcpFrameType::kPushFinish: return "PushFinish";
    case TcpFrameType::kPushAbandon: return "PushAbandon";
    case TcpFrameType::kPushResult: return "PushResult";
    case TcpFrameType::kPullRequest: return "PullRequest";
    case TcpFrameType::kPullHeader: return "PullHeader";
    case TcpFrameType::kPullData: return "PullData";
    case TcpFrameType::kPullRows: return "PullRows";
    case TcpFrameType::kPullEnd: return "PullEnd";
    case TcpFrameType::kPushNorm: return "PushNorm";
  }
  return "unknown";
}

bool CarriesBulk(TcpFrameType type) {
  return type == TcpFrameType::kPushData || type == TcpFrameType::kPushRows || type == TcpFrameType::kPullRequest ||
         type == TcpFrameType::kPullData || type == TcpFrameType::kPullRows;
}

std::string EncodeTcpHeader(TcpFrameType type, absl::string_view payload, uint64_t bulk_bytes) {
  std::string out;
  out.reserve(kTcpHeaderBytes);
  Put<uint32_t>(&out, kTcpFrameMagic);
  Put<uint16_t>(&out, kTcpFrameVersion);
  Put<uint16_t>(&out, static_cast<uint16_t>(type));
  Put<uint32_t>(&out, static_cast<uint32_t>(payload.size()));
  Put<uint32_t>(&out, crc32c::Value(payload.data(), payload.size()));
  Put<uint64_t>(&out, bulk_bytes);
  return out;
}

absl::StatusOr<TcpFrameHeader> DecodeTcpHeader(absl::string_view bytes) {
  if (bytes.size() != kTcpHeaderBytes) {
    return absl::DataLossError(absl::StrCat("TCP frame header of ", bytes.size(), " bytes"));
  }
  const uint32_t magic = Get<uint32_t>(bytes.data());
  if (magic != kTcpFrameMagic) {
    return absl::DataLossError(absl::StrCat("TCP frame magic 0x", absl::Hex(magic), ", not dtrain's 0x",
                                            absl::Hex(kTcpFrameMagic), " (not a dtrain data-plane peer?)"));
  }
  const uint16_t version = Get<uint16_t>(bytes.data() + 4);
  if (version != kTcpFrameVersion) {
    return absl::DataLossError(absl::StrCat("TCP frame version ", version, ", this dtrain speaks ",
                                            kTcpFrameVersion, " (run the same dtrain on every host)"));
  }
  TcpFrameHeader h;
  const uint16_t type = Get<uint16_t>(bytes.data() + 6);
  h.type = static_cast<TcpFrameType>(type);
  if (TcpFrameTypeName(h.type) == "unknown") return absl::DataLossError(absl::StrCat("TCP frame type ", type));
  h.payload_bytes = Get<uint32_t>(bytes.data() + 8);
  h.payload_crc = Get<uint32_t>(bytes.data() + 12);
  h.bulk_bytes = Get<uint64_t>(bytes.data() + 16);
  if (h.payload_bytes > kMaxTcpPayload) {
    return absl::DataLossError(absl::StrCat("TCP frame ", TcpFrameTypeName(h.type), " with a payload of ",
                                            h.payload_bytes, " bytes (at most ", kMaxTcpPayload, ")"));
  }
  if (h.bulk_bytes != 0 && !CarriesBulk(h.type)) {
    return absl::DataLossError(
        absl::StrCat("TCP frame ", TcpFrameTypeName(h.type), " with ", h.bulk_bytes, " bytes of data it cannot carry"));
  }
  if (h.bulk_bytes > kMaxTcpBulk) {
    return absl::DataLossError(absl::StrCat("TCP frame ", TcpFrameTypeName(h.type), " with ", h.bulk_bytes,
                                            " bytes of data (at most ", kMaxTcpBulk, ")"));
  }
  return h;
}

absl::Status CheckTcpPayload(const TcpFrameHeader& header, absl::string_view payload) {
  if (payload.size() != header.payload_bytes) {
    return absl::DataLossError(absl::StrCat("TCP frame ", TcpFrameTypeName(header.type), ": payload of ",
                                            payload.size(), " bytes, the header says ", header.payload_bytes));
  }
  const uint32_t crc = crc32c::Value(payload.data(), payload.size());
  if (crc != header.payload_crc) {
    return absl::DataLossError(absl::StrCat("TCP frame ", TcpFrameTypeName(header.type), ": payload checksum 0x",
                                            absl::Hex(crc), ", the header says 0x", absl::Hex(header.payload_crc)));
  }
  return absl::OkStatus();
}

std::string EncodeSlicePiece(const Piece& p) { return EncodePiece(p, false); }
absl::StatusOr<Piece> DecodeSlicePiece(absl::string_view payload) { return DecodePiece(payload, false); }
std::string EncodeRowPiece(const Piece& p) { return EncodePiece(p, true); }
absl::StatusOr<Piece> DecodeRowPiece(absl::string_view payload) { return DecodePiece(payload, true); }

absl::StatusOr<uint64_t> PieceBulkBytes(const Piece& p, bool rows) {
  const uint64_t el = static_cast<uint64_t>(DtypeBytes(p.dtype));
  const uint64_t per = rows ? static_cast<uint64_t>(p.dim) * el : el;
  if (p.n < 0 || (rows && p.dim < 1) || (per > 0 && static_cast<uint64_t>(p.n) > kMaxTcpBulk / per)) {
    return absl::InvalidArgumentError(absl::StrCat("a piece of ", p.n, rows ? absl::StrCat(" rows of ", p.dim) : "",
                                                   " values: more than a frame carries (", kMaxTcpBulk, " bytes)"));
  }
  return static_cast<uint64_t>(p.n) * per;
}

}  // namespace dtrain::ps::tcp
