// The messages of the shared-memory data plane (ps/shm/README.md): what a worker and a ps task on one host say
// to each other over a lane (a Unix SOCK_SEQPACKET connection, ps/shm/shm_lane.h) while the tensor data itself
// stays in shared memory. Each message is one frame:
//
//   offset  size  field
//   0       4     magic "DTSM" (0x4d535444, little-endian)
//   4       2     version (kShmFrameVersion)
//   6       2     type (FrameType)
//   8       4     payload bytes (at most kMaxFramePayload)
//   12      4     CRC32C of the payload
//   16      ...   payload: little-endian fixed-width integers, strings as u32 length + bytes, lists as u32
//                 count + items (each message's *Fields function in shm_frame.cc says its fields, in order, for
//                 both directions)
//
// A frame that is short, of another magic or version, too long, of an unknown type, with a bad checksum, or
// whose payload does not decode to exactly its fields is DataLoss with a message naming what was wrong; the
// receiving side then closes the lane (ps/shm/shm_frame_fuzzer.cc feeds it arbitrary bytes).
//
// Thread-safety: plain functions over values.
#ifndef DTRAIN_PS_SHM_SHM_FRAME_H_
#define DTRAIN_PS_SHM_SHM_FRAME_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ps/api/ps_types.h"
#include "ps/api/slice_io.h"

namespace dtrain::ps::shm {

inline constexpr uint32_t kShmFrameMagic = 0x4d535444;  // "DTSM"
inline constexpr uint16_t kShmFrameVersion = 4;  // 4: the elastic read-ahead (PullRequest, PullHeader)
inline constexpr size_t kFrameHeaderBytes = 16;
// Within the default socket buffer (net.core.wmem_default, ~208 KiB), so that a frame is never refused as too large.
inline constexpr size_t kMaxFramePayload = 128 << 10;

enum class FrameType : uint16_t {
  kHello = 1,        // worker -> ps: the first frame of a lane (Hello)
  kWelcome = 2,      // ps -> worker: the answer to Hello (PushResult: its status)
  kSegment = 3,      // worker -> ps: a shared-memory segment (SegmentInfo), its file descriptor attached
  kPushBegin = 4,    // worker -> ps: opens an upload (PushHeader)
  kPushData = 5,     // worker -> ps: floats of a slice lie in a segment (DataRef)
  kPushRows = 6,     // worker -> ps: row gradients lie in a segment (RowsRef)
  kPushFinish = 7,   // worker -> ps: ends the upload (empty)
  kPushAbandon = 8,  // worker -> ps: drops the upload unfinished (empty)
  kPushResult = 9,   // ps -> worker: the upload's outcome, or the abandon's acknowledgement (PushResult)
  kPullRequest = 10,  // worker -> ps: a pull and where its data goes (PullOrder)
  kPullHeader = 11,   // ps -> worker: the pull's header (PullHeader)
  kPullPieces = 12,   // ps -> worker: pieces written (PiecesWritten)
  kPullEnd = 13,      // ps -> worker: the pull's end (PushResult: its status)
  kPushNorm = 14,     // worker -> ps: the push's gradient norm (a double), after its slices (SliceUpload)
};
absl::string_view FrameTypeName(FrameType type);

// One decoded frame.
struct Frame {
  FrameType type = FrameType::kHello;
  std::string payload;
};

// Header + payload, ready to send.
std::string EncodeFrame(FrameType type, absl::string_view payload);
// Checks and splits one received frame (exactly `bytes`).
absl::StatusOr<Frame> DecodeFrame(absl::string_view bytes);

// ---- payloads ----

// Which lane a Hello opens: uploads, or pulls.
enum class LaneKind : uint8_t { kPush = 1, kPull = 2 };
struct Hello {
  LaneKind lane = LaneKind::kPush;
  int32_t worker_id = 0;
  std::string ticket;  // from the ps's offer (ps/shm/shm_offer.h)
};

// A segment the worker shares: its number on this attachment (chosen by the worker) and its size; the memfd
// travels beside the frame (SCM_RIGHTS).
struct SegmentInfo {
  uint32_t segment = 0;
  int64_t bytes = 0;
};

// Floats [offset, offset + n) of slice `key`, stored as `dtype` at byte `at` of segment `segment`.
struct DataRef {
  uint32_t key = 0;
  int64_t offset = 0;
  int64_t n = 0;
  WireDtype dtype = WireDtype::kF32;
  uint32_t segment = 0;
  int64_t at = 0;
  // The worker's own buffer, which it leaves unchanged until the push's step has been applied or dropped (not a
  // staging copy that the next upload reuses): the ps may read the floats there instead of copying them
  // (SliceUpload::WriteInPlace).
  bool lent = false;
};

// n row gradients of `table` (dim values of `dtype` each) at byte `rows_at`, their int64 ids at byte `ids_at`,
// both in segment `segment`.
struct RowsRef {
  uint32_t table = 0;
  int64_t n = 0;
  int32_t dim = 0;
  WireDtype dtype = WireDtype::kF32;
  uint32_t segment = 0;
  int64_t ids_at = 0;
  int64_t rows_at = 0;
};

// What ended an upload (kPushResult), a pull (kPullEnd) or an abandon (kPushResult): the ps's status and, for
// an upload, its response. `transport_failure`: the data plane itself failed (a segment the ps could not map, a
// reference outside one); the worker then moves the call to gRPC (--transport=auto) or fails (shm).
struct PushResult {
  absl::Status status;
  bool transport_failure = false;
  PushResponse response;
};

// Where one slice of a pull goes.
struct Destination {
  enum class Kind : uint8_t {
    kSkip = 0,     // the worker has it already (a retried pull): not written
    kInPlace = 1,  // fp32 straight into the worker's buffer: `segment`, byte `at`
    kStaging = 2,  // as the pull's wire dtype into the staging segment at byte `at`; the worker copies it out
  };
  uint32_t key = 0;
  Kind kind = Kind::kSkip;
  uint32_t segment = 0;
  int64_t at = 0;
  int64_t length = 0;  // floats of the slice, as the worker knows it
};
// The sparse ids of one table a pull asks for (n int64 at byte `ids_at` of `segment`), and where their rows
// go: n * dim values of the pull's wire dtype at byte `rows_at` of the same segment.
struct SparseOrder {
  uint32_t table = 0;
  int64_t n = 0;
  int32_t dim = 0;
  uint32_t segment = 0;
  int64_t ids_at = 0;
  int64_t rows_at = 0;
};
// A pull: the request (its `sparse` ids are not in the frame but in shared memory: `sparse` below), and where
// every slice goes.
struct PullOrder {
  PullRequest request;  // cancel is not sent; request.sparse is left empty
  std::vector<Destination> destinations;
  std::vector<SparseOrder> sparse;
};

// Pieces a ps task has written since its last PiecesWritten: slices' floats [offset, offset + n) as `dtype`
// (where the slice's Destination says), and rows [first, first + n) of a table's SparseOrder.
struct SlicePiece {
  uint32_t key = 0;
  int64_t offset = 0;
  int64_t n = 0;
  WireDtype dtype = WireDtype::kF32;
};
struct RowPiece {
  uint32_t table = 0;
  int64_t first = 0;
  int64_t n = 0;
  WireDtype dtype = WireDtype::kF32;
};
struct PiecesWritten {
  std::vector<SlicePiece> slices;
  std::vector<RowPiece> rows;
};

std::string EncodeHello(const Hello& m);
absl::StatusOr<Hello> DecodeHello(absl::string_view payload);
std::string EncodeSegment(const SegmentInfo& m);
absl::StatusOr<SegmentInfo> DecodeSegment(absl::string_view payload);
// The gradient norm of a push (SliceUpload::SetGradientNorm): 8 bytes, an IEEE-754 double.
std::string EncodeNorm(double norm);
absl::StatusOr<double> DecodeNorm(absl::string_view payload);
std::string EncodePushHeader(const PushHeader& m);
absl::StatusOr<PushHeader> DecodePushHeader(absl::string_view payload);
std::string EncodeDataRef(const DataRef& m);
absl::StatusOr<DataRef> DecodeDataRef(absl::string_view payload);
std::string EncodeRowsRef(const RowsRef& m);
absl::StatusOr<RowsRef> DecodeRowsRef(absl::string_view payload);
std::string EncodePushResult(const PushResult& m);
absl::StatusOr<PushResult> DecodePushResult(absl::string_view payload);
std::string EncodePullOrder(const PullOrder& m);
absl::StatusOr<PullOrder> DecodePullOrder(absl::string_view payload);
std::string EncodePullHeader(const PullHeader& m);
absl::StatusOr<PullHeader> DecodePullHeader(absl::string_view payload);
std::string EncodePieces(const PiecesWritten& m);
absl::StatusOr<PiecesWritten> DecodePieces(absl::string_view payload);

}  // namespace dtrain::ps::shm

#endif  // DTRAIN_PS_SHM_SHM_FRAME_H_
