// libFuzzer harness: arbitrary bytes as one frame a lane received (ps/shm/shm_frame.h), decoded as the ps or the
// worker would (the frame, then its payload by type). Anything but a clean decode or a DataLoss is a bug; a
// payload that decodes must encode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "ps/shm/shm_frame.h"

namespace {

using namespace dtrain::ps::shm;  // NOLINT: a harness

template <typename T, typename Decode, typename Encode>
void RoundTrip(const std::string& payload, Decode decode, Encode encode) {
  absl::StatusOr<T> v = decode(payload);
  if (!v.ok()) {
    if (v.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return;
  }
  if (encode(*v) != payload) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<Frame> frame = DecodeFrame(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!frame.ok()) {
    if (frame.status().code() != absl::StatusCode::kDataLoss) std::abort();
    return 0;
  }
  const std::string& p = frame->payload;
  switch (frame->type) {
    case FrameType::kHello: RoundTrip<Hello>(p, DecodeHello, EncodeHello); break;
    case FrameType::kSegment: RoundTrip<SegmentInfo>(p, DecodeSegment, EncodeSegment); break;
    case FrameType::kPushBegin: RoundTrip<dtrain::ps::PushHeader>(p, DecodePushHeader, EncodePushHeader); break;
    case FrameType::kPushData: RoundTrip<DataRef>(p, DecodeDataRef, EncodeDataRef); break;
    case FrameType::kPushRows: RoundTrip<RowsRef>(p, DecodeRowsRef, EncodeRowsRef); break;
    case FrameType::kPushNorm: {
      absl::StatusOr<double> norm = DecodeNorm(p);
      if (norm.ok() && EncodeNorm(*norm) != p) std::abort();  // bit for bit, NaN payloads included
      break;
    }
    case FrameType::kWelcome:
    case FrameType::kPushResult:
    case FrameType::kPullEnd: RoundTrip<PushResult>(p, DecodePushResult, EncodePushResult); break;
    case FrameType::kPullRequest: RoundTrip<PullOrder>(p, DecodePullOrder, EncodePullOrder); break;
    case FrameType::kPullHeader: RoundTrip<dtrain::ps::PullHeader>(p, DecodePullHeader, EncodePullHeader); break;
    case FrameType::kPullPieces: RoundTrip<PiecesWritten>(p, DecodePieces, EncodePieces); break;
    case FrameType::kPushFinish:
    case FrameType::kPushAbandon: break;
  }
  if (EncodeFrame(frame->type, p) != std::string(reinterpret_cast<const char*>(data), size)) std::abort();
  return 0;
}
