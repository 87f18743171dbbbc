// The frames of the TCP data plane (ps/README.md, "the TCP lanes"): the messages of the shared-memory lanes
// (ps/shm/shm_frame.h, whose payload codecs are reused as they are) carried over a TCP connection between a
// worker and a ps task on different hosts. Shared memory passes references to data both processes map; here the
// tensor data travels inline, as the frame's *bulk*: bytes after the payload that the receiver reads straight
// into their destination (a worker's parameter buffer, a ps task's receive block), never through a staging copy.
//
//   offset  size  field
//   0       4     magic "DTTL" (0x4c545444, little-endian)
//   4       2     version (kTcpFrameVersion)
//   6       2     type (TcpFrameType)
//   8       4     payload bytes (at most kMaxTcpPayload)
//   12      4     CRC32C of the payload
//   16      8     bulk bytes after the payload (0 for the types that carry no data; at most kMaxTcpBulk)
//   24      ...   payload (the shm codec of the type's message, see below), then the bulk
//
// The bulk is not checksummed: TCP checksums every segment on the wire and TLS (when the cluster uses it) keeps
// the data on gRPC; a CRC32C of every tensor byte would cost each side another pass over 13 MB a step. Each bulk's
// length is checked against what its payload says before any of it is read.
//
// A header that is short, of another magic or version, of an unknown type, with a payload too long or a bad
// checksum, or with bulk on a type that carries none, is DataLoss naming what was wrong; the receiver then closes
// the connection (ps/tcp/tcp_frame_fuzzer.cc feeds the decoders arbitrary bytes).
//
// Thread-safety: plain functions over values.
#ifndef DTRAIN_PS_TCP_TCP_FRAME_H_
#define DTRAIN_PS_TCP_TCP_FRAME_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/shm/shm_frame.h"

namespace dtrain::ps::tcp {

inline constexpr uint32_t kTcpFrameMagic = 0x4c545444;  // "DTTL"
inline constexpr uint16_t kTcpFrameVersion = 1;
inline constexpr size_t kTcpHeaderBytes = 24;
inline constexpr size_t kMaxTcpPayload = 256 << 10;
// One frame's bulk: a slice's floats (slices are split by placement; a whole variable of 16 GiB is far past
// any model a ps task holds) or one table's rows of a pull.
inline constexpr uint64_t kMaxTcpBulk = uint64_t{16} << 30;

// The payload of each type is the shm message named beside it (shm_frame.h's Encode*/Decode*).
enum class TcpFrameType : uint16_t {
  kHello = 1,        // worker -> ps: the first frame of a connection (shm::Hello: lane kind, worker, ticket)
  kWelcome = 2,      // ps -> worker: the answer to Hello (shm::PushResult: its status)
  kPushBegin = 4,    // worker -> ps: opens an upload (PushHeader)
  kPushData = 5,     // worker -> ps: floats of a slice (one shm::SlicePiece); bulk: n values of its dtype
  kPushRows = 6,     // worker -> ps: row gradients (shm::RowsRef, segment fields 0); bulk: n int64 ids, then the
                     // n * dim values of its dtype
  kPushFinish = 7,   // worker -> ps: ends the upload (empty)
  kPushAbandon = 8,  // worker -> ps: drops the upload unfinished (empty)
  kPushResult = 9,   // ps -> worker: the upload's outcome, or the abandon's acknowledgement (shm::PushResult)
  kPullRequest = 10,  // worker -> ps: a pull (shm::PullOrder without destinations: every slice of the task
                      // comes; sparse orders with their table, n and dim); bulk: each order's n int64 ids, in order
  kPullHeader = 11,   // ps -> worker: the pull's header (PullHeader)
  kPullData = 12,     // ps -> worker: floats of a slice (one shm::SlicePiece); bulk: n values of its dtype
  kPullRows = 13,     // ps -> worker: rows of a table (one shm::RowPiece, with the table's dim); bulk: the values
  kPullEnd = 14,      // ps -> worker: the pull's end (shm::PushResult: its status)
  kPushNorm = 15,     // worker -> ps: the push's gradient norm (a double), after its slices
};
absl::string_view TcpFrameTypeName(TcpFrameType type);
// Whether frames of `type` may carry bulk.
bool CarriesBulk(TcpFrameType type);

struct TcpFrameHeader {
  TcpFrameType type = TcpFrameType::kHello;
  uint32_t payload_bytes = 0;
  uint32_t payload_crc = 0;
  uint64_t bulk_bytes = 0;
};

// The 24 header bytes of a frame with `payload` and `bulk_bytes` of bulk after it.
std::string EncodeTcpHeader(TcpFrameType type, absl::string_view payload, uint64_t bulk_bytes);
// Checks and decodes exactly kTcpHeaderBytes bytes (the payload's checksum is checked by CheckTcpPayload).
absl::StatusOr<TcpFrameHeader> DecodeTcpHeader(absl::string_view bytes);
// DataLoss unless `payload` is the header's (length and checksum).
absl::Status CheckTcpPayload(const TcpFrameHeader& header, absl::string_view payload);

// One piece of a slice or of a table's rows, the payload of kPushData, kPullData and kPullRows. `dim` is the
// table's row width (rows only). The bulk a piece carries: n values (slices) or n * dim values (rows) of dtype.
struct Piece {
  uint32_t key = 0;  // the slice's key, or the table
  int64_t offset = 0;  // the first float of the slice, or the first row of the pull's ids of the table
  int64_t n = 0;
  WireDtype dtype = WireDtype::kF32;
  int32_t dim = 0;  // rows only
};
std::string EncodeSlicePiece(const Piece& p);
absl::StatusOr<Piece> DecodeSlicePiece(absl::string_view payload);
std::string EncodeRowPiece(const Piece& p);
absl::StatusOr<Piece> DecodeRowPiece(absl::string_view payload);
// The bulk bytes a piece must carry; InvalidArgument when its counts are negative or the bytes would pass
// kMaxTcpBulk (a peer's lie, checked before anything is read).
absl::StatusOr<uint64_t> PieceBulkBytes(const Piece& p, bool rows);

}  // namespace dtrain::ps::tcp

#endif  // DTRAIN_PS_TCP_TCP_FRAME_H_
