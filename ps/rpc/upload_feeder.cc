#include "ps/rpc/upload_feeder.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "dtrain.pb.h"
#include "ps/rpc/wire_format.h"

namespace dtrain::ps {

absl::Status UploadFeeder::OnHeader(const std::string& bytes) {
  if (initialize_) return absl::InvalidArgumentError("Initialize: unexpected header");
  if (upload_) return absl::InvalidArgumentError("Push: a second header");
  ::dtrain::wire::PushHeader header;
  if (!header.ParseFromString(bytes)) return absl::InvalidArgumentError("Push: malformed header");
  ASSIGN_OR_RETURN(upload_, ps_->StartPush(wire::FromProto(header)));
  return absl::OkStatus();
}

absl::Status UploadFeeder::OnWorkerId(int64_t worker_id) {
  if (!initialize_) return absl::InvalidArgumentError("Push: unexpected worker id field");
  if (upload_) return absl::InvalidArgumentError("Initialize: a second worker id");
  if (worker_id < INT32_MIN || worker_id > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("Initialize: worker id ", worker_id, " out of range"));
  }
  ASSIGN_OR_RETURN(upload_, ps_->StartInitialize(static_cast<int>(worker_id)));
  return absl::OkStatus();
}

absl::Status UploadFeeder::OnTrailer(const std::string& bytes) {
  if (initialize_) return absl::InvalidArgumentError("Initialize: unexpected trailer");
  if (!upload_) return absl::InvalidArgumentError("Push: trailer before the header");
  ::dtrain::wire::PushTrailer trailer;
  if (!trailer.ParseFromString(bytes)) return absl::InvalidArgumentError("Push: malformed trailer");
  if (trailer.has_gradient_norm()) return upload_->SetGradientNorm(trailer.gradient_norm());
  return absl::OkStatus();
}

absl::Status UploadFeeder::OnData(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) {
  if (!upload_) {
    return absl::InvalidArgumentError(initialize_ ? "Initialize: slice data before the worker id"
                                                  : "Push: slice data before the header");
  }
  return upload_->Write(key, offset, n, dtype, data);
}

absl::Status UploadFeeder::OnRowGradients(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                                          const void* data) {
  if (!upload_) {
    return absl::InvalidArgumentError(initialize_ ? "Initialize: sparse rows before the worker id"
                                                  : "Push: sparse rows before the header");
  }
  return upload_->WriteSparse(table, ids, n, dim, dtype, data);
}

absl::StatusOr<PushResponse> UploadFeeder::Finish() {
  if (!upload_) return absl::InvalidArgumentError(initialize_ ? "Initialize: empty stream" : "Push: empty stream");
  return upload_->Finish();
}

}  // namespace dtrain::ps
