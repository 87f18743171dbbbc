// What the ps's gRPC service does with the messages of one Push or Initialize stream: decodes each
// (ps/rpc/tensor_coding.h) and feeds the header (or worker id), the slice data and the sparse rows into an
// upload of a PsInterface. Separate from the service so that the ps-request fuzzer (ps/rpc/ps_request_fuzzer.cc) drives
// exactly this code.
//
// Errors: InvalidArgument for a malformed stream (a second header, data before the header, an unexpected field,
// an empty stream, a message that does not decode, a trailer outside a push or before its header); otherwise
// whatever the PsInterface answers.
//
// Thread-safety: one UploadFeeder belongs to one stream (one thread).
#ifndef DTRAIN_PS_RPC_UPLOAD_FEEDER_H_
#define DTRAIN_PS_RPC_UPLOAD_FEEDER_H_

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ps/api/ps_interface.h"
#include "ps/rpc/tensor_coding.h"

namespace dtrain::ps {

class UploadFeeder : public coding::ChunkHandler {
 public:
  // `initialize`: an Initialize stream (its first message carries a worker id) rather than a Push (a header).
  UploadFeeder(PsInterface* ps, bool initialize) : ps_(ps), initialize_(initialize) {}

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
  std::unique_ptr<SliceUpload> upload_;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_RPC_UPLOAD_FEEDER_H_
