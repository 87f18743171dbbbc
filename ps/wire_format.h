// The one place where the plain structs of ps/ps_types.h meet the generated proto messages, and where gRPC
// and absl statuses are converted. Used only by ps/grpc_ps_service and ps/grpc_ps_client.
//
// Thread-safety: free functions, no shared state.
#ifndef DTRAIN_PS_WIRE_FORMAT_H_
#define DTRAIN_PS_WIRE_FORMAT_H_

#include <cstdint>
#include <functional>
#include <vector>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "dtrain.pb.h"
#include "ps/ps_types.h"

namespace dtrain::ps::wire {

// Largest payload (bytes of float data) in one streamed message.
inline constexpr int64_t kChunkBytes = 2 << 20;

grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

void ToProto(const TrainConfig& in, dtrain::wire::TrainConfig* out);
TrainConfig FromProto(const dtrain::wire::TrainConfig& in);
void ToProto(const StepDecision& in, dtrain::wire::StepDecision* out);
StepDecision FromProto(const dtrain::wire::StepDecision& in);
void ToProto(const TrainingStats& in, dtrain::wire::StatsResponse* out);
TrainingStats FromProto(const dtrain::wire::StatsResponse& in);
dtrain::wire::PushResponse::Outcome ToProto(PushResponse::Outcome o);
PushResponse::Outcome FromProto(dtrain::wire::PushResponse::Outcome o);

// A slice's floats somewhere in memory (e.g. in the model's flat buffer), not owned.
struct SliceView {
  uint32_t key = 0;
  const float* data = nullptr;
  int64_t length = 0;
};
std::vector<SliceView> Views(const std::vector<SliceData>& slices);
std::vector<SliceView> Views(const std::vector<SliceSpec>& slices, const float* flat);

// Splits slices into groups of chunks of at most kChunkBytes each and calls `emit` once per group (in order).
// `emit` fills the chunks into the message it is building; returns false to stop (stream broken).
using ChunkSink = std::function<bool(std::vector<dtrain::wire::SliceChunk>&&)>;
bool ForEachChunkGroup(const std::vector<SliceView>& slices, const ChunkSink& emit);
bool ForEachChunkGroup(const std::vector<SliceData>& slices, const ChunkSink& emit);

// Writes chunks straight into a flat buffer at each slice's flat_offset (no intermediate copy). Finish() checks
// that every slice arrived whole. DataLoss on an unknown key, a gap, an overflow or a missing slice.
class FlatAssembler {
 public:
  FlatAssembler(const std::vector<SliceSpec>& slices, float* flat);
  absl::Status Add(const dtrain::wire::SliceChunk& chunk);
  absl::Status Finish() const;
  int64_t bytes() const { return bytes_; }

 private:
  const std::vector<SliceSpec>& slices_;
  float* flat_;
  std::vector<int64_t> received_;  // floats received per slice (index in slices_)
  int64_t bytes_ = 0;
};

// Reassembles chunks into slices. Slices appear in first-seen key order; chunks of one slice must arrive in
// order without gaps. InvalidArgument on a gap, overlap or misaligned byte count.
class SliceAssembler {
 public:
  absl::Status Add(const dtrain::wire::SliceChunk& chunk);
  std::vector<SliceData> Take();
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<SliceData> slices_;
  int64_t bytes_ = 0;
};

}  // namespace dtrain::ps::wire

#endif  // DTRAIN_PS_WIRE_FORMAT_H_
