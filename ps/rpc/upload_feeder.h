// What the ps's gRPC service does with the messages of one Push or Initialize stream: decodes each
// (ps/rpc/tensor_coding.h) and feeds the header (or worker id), the slice data and the sparse rows into an
// upload of a PsInterface. Separate from the service so that the ps-request fuzzer (ps/rpc/ps_request_fuzzer.cc) drives
// exactly this code.
//
// Errors: InvalidArgument for a malformed stream (a second header, data before the header, an unexpected field,
// an empty stream, a message that does not decode, a trailer outside a push or before its header, rows or a
// trailer in a PushPart stream, a striped push to a feeder without stripes); otherwise whatever the PsInterface
// (or PushStripes) answers.
//
// Thread-safety: one UploadFeeder belongs to one stream (one thread).
#ifndef DTRAIN_PS_RPC_UPLOAD_FEEDER_H_
#define DTRAIN_PS_RPC_UPLOAD_FEEDER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/api/ps_interface.h"
#include "ps/rpc/push_stripes.h"
#include "ps/rpc/tensor_coding.h"

namespace dtrain::ps {

class UploadFeeder : public coding::ChunkHandler {
 public:
  // `initialize`: an Initialize stream (its first message carries a worker id) rather than a Push (a header).
  // `stripes` (may be null: striped pushes are refused): where a Push striped over several connections
  // (ps/rpc/push_stripes.h) registers, and where a PushPart stream (`part`) finds its push, waiting for it
  // until `join_deadline`.
  // `stopped` (may be empty) ends that wait early.
  // `apply_early`: false drops a push header's PushHeader::apply_early (a worker on the ps's own host).
  UploadFeeder(PsInterface* ps, bool initialize, PushStripes* stripes = nullptr, bool part = false,
               absl::Time join_deadline = absl::InfinitePast(), std::function<bool()> stopped = nullptr,
               bool apply_early = true)
      : ps_(ps), initialize_(initialize), stripes_(stripes), part_(part), join_deadline_(join_deadline),
        stopped_(std::move(stopped)), apply_early_(apply_early) {}
  ~UploadFeeder() override;

  // One received message.
  absl::Status Feed(const grpc::ByteBuffer& message) { return coding::DecodeMessage(message, this); }
  // The stream ended: finishes the upload.
  absl::StatusOr<PushResponse> Finish();

  absl::Status OnHeader(const std::string& bytes) override;
  absl::Status OnWorkerId(int64_t worker_id) override;
  absl::Status OnTrailer(const std::string& bytes) override;
  absl::Status OnData(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) override;
  absl::Status OnRowGradients(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                              const void* data) override;

 private:
  PsInterface* ps_;
  const bool initialize_;
  PushStripes* const stripes_;
  const bool part_;
  const absl::Time join_deadline_;
  const std::function<bool()> stopped_;
  const bool apply_early_;
  std::unique_ptr<SliceUpload> upload_;
  // A striped push (main stream or part): the writes go through the stripe.
  std::shared_ptr<PushStripes::Stripe> stripe_;
  StripeMember member_;
  bool finished_ = false;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_UPLOAD_FEEDER_H_
