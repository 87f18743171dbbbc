// libFuzzer harness: arbitrary bytes as what a TCP lane receives (ps/tcp/tcp_lane.h, ps/tcp/tcp_frame.h), read by
// a real TcpLane over a socket pair the way the ps and the worker read it: frame after frame, each payload decoded
// by type, each piece's bulk checked against its payload and read (or skipped), until the bytes end. Anything but
// clean frames, DataLoss or the end of the stream (Unavailable) is a bug, and so is a payload that decodes but
// does not encode back to the same bytes.
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "ps/shm/shm_frame.h"
#include "ps/tcp/tcp_frame.h"
#include "ps/tcp/tcp_lane.h"

namespace {

using namespace dtrain::ps::tcp;  // NOLINT: a harness
namespace shm = dtrain::ps::shm;

void Expect(const absl::Status& s) {
  if (!s.ok() && s.code() != absl::StatusCode::kDataLoss && s.code() != absl::StatusCode::kUnavailable &&
      s.code() != absl::StatusCode::kInvalidArgument) {
    std::abort();
  }
}

template <typename T, typename Decode, typename Encode>
bool RoundTrip(const std::string& payload, Decode decode, Encode encode) {
  absl::StatusOr<T> v = decode(payload);
  if (!v.ok()) {
    if (v.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return false;
  }
  if (encode(*v) != payload) std::abort();
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  // Fuzz inputs are small: the socket buffer holds them whole.
  size_t sent = 0;
  while (sent < size) {
    const ssize_t k = write(fds[1], data + sent, size - sent);
    if (k <= 0) break;
    sent += static_cast<size_t>(k);
  }
  close(fds[1]);
  TcpLane lane(fds[0]);
  std::vector<char> sink;
  for (int frames = 0; frames < 64; ++frames) {
    const absl::Time deadline = absl::Now() + absl::Seconds(1);
    absl::StatusOr<TcpLane::Frame> f = lane.Receive(deadline);
    if (!f.ok()) {
      Expect(f.status());
      break;
    }
    const std::string& p = f->payload;
    uint64_t expected_bulk = 0;
    switch (f->type) {
      case TcpFrameType::kHello: RoundTrip<shm::Hello>(p, shm::DecodeHello, shm::EncodeHello); break;
      case TcpFrameType::kPushBegin:
        RoundTrip<dtrain::ps::PushHeader>(p, shm::DecodePushHeader, shm::EncodePushHeader);
        break;
      case TcpFrameType::kPushData:
      case TcpFrameType::kPullData:
      case TcpFrameType::kPullRows: {
        const bool rows = f->type == TcpFrameType::kPullRows;
        absl::StatusOr<Piece> piece = rows ? DecodeRowPiece(p) : DecodeSlicePiece(p);
        if (!piece.ok()) {
          Expect(piece.status());
          break;
        }
        if ((rows ? EncodeRowPiece(*piece) : EncodeSlicePiece(*piece)) != p) std::abort();
        absl::StatusOr<uint64_t> bytes = PieceBulkBytes(*piece, rows);
        if (!bytes.ok()) Expect(bytes.status());
        expected_bulk = bytes.ok() ? *bytes : 0;
        break;
      }
      case TcpFrameType::kPushRows: {
        absl::StatusOr<shm::RowsRef> r = shm::DecodeRowsRef(p);
        if (r.ok() && shm::EncodeRowsRef(*r) != p) std::abort();
        break;
      }
      case TcpFrameType::kPushNorm: {
        absl::StatusOr<double> norm = shm::DecodeNorm(p);
        if (norm.ok() && shm::EncodeNorm(*norm) != p) std::abort();
        break;
      }
      case TcpFrameType::kWelcome:
      case TcpFrameType::kPushResult:
      case TcpFrameType::kPullEnd:
        RoundTrip<shm::PushResult>(p, shm::DecodePushResult, shm::EncodePushResult);
        break;
      case TcpFrameType::kPullRequest: RoundTrip<shm::PullOrder>(p, shm::DecodePullOrder, shm::EncodePullOrder); break;
      case TcpFrameType::kPullHeader:
        RoundTrip<dtrain::ps::PullHeader>(p, shm::DecodePullHeader, shm::EncodePullHeader);
        break;
      case TcpFrameType::kPushFinish:
      case TcpFrameType::kPushAbandon: break;
    }
    if (f->bulk_bytes != 0 && !CarriesBulk(f->type)) std::abort();  // DecodeTcpHeader refuses those
    // The bulk: read in pieces of what the payload says (a receiver's destination), then the rest skipped.
    if (expected_bulk > 0 && expected_bulk <= f->bulk_bytes && expected_bulk <= (1 << 20)) {
      sink.resize(expected_bulk);
      absl::Status s = lane.ReadBulk(sink.data(), expected_bulk, deadline);
      if (!s.ok()) {
        Expect(s);
        break;
      }
    }
    if (absl::Status s = lane.SkipBulk(deadline); !s.ok()) {
      Expect(s);
      break;
    }
  }
  return 0;
}
