#include "ps/rpc/upload_feeder.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "dtrain.pb.h"
#include "ps/rpc/wire_format.h"

namespace dtrain::ps {

UploadFeeder::~UploadFeeder() {
  if (!stripe_) return;
  if (part_) {
    if (!finished_) stripe_->PartEnded(member_.part, absl::AbortedError("the part stream broke"));
  } else if (!finished_) {
    stripes_->Close(member_.stripe_id, /*finishing=*/false).IgnoreError();  // before upload_ goes
  }
}

absl::Status UploadFeeder::OnHeader(const std::string& bytes) {
  if (initialize_) return absl::InvalidArgumentError("Initialize: unexpected header");
  if (upload_ || stripe_) {
    return absl::InvalidArgumentError(part_ ? "PushPart: a second header" : "Push: a second header");
  }
  if (part_) {
    ::dtrain::wire::PushPartHeader header;
    if (!header.ParseFromString(bytes)) return absl::InvalidArgumentError("PushPart: malformed header");
    if (stripes_ == nullptr) return absl::InvalidArgumentError("PushPart: this ps takes no striped pushes");
    member_ = StripeMember{header.worker_id(), header.session(), header.request_id(), header.stripe_id(),
                           static_cast<int>(std::min<uint32_t>(header.part(), INT32_MAX))};
    ASSIGN_OR_RETURN(stripe_, stripes_->Join(member_, join_deadline_, stopped_));
    return absl::OkStatus();
  }
  ::dtrain::wire::PushHeader header;
  if (!header.ParseFromString(bytes)) return absl::InvalidArgumentError("Push: malformed header");
  PushHeader h = wire::FromProto(header);
  h.apply_early = h.apply_early && apply_early_;
  if (header.stripe_parts() > 0 && stripes_ == nullptr) {
    return absl::InvalidArgumentError("Push: striped over several connections, which this ps does not take");
  }
  ASSIGN_OR_RETURN(upload_, ps_->StartPush(h));
  if (header.stripe_parts() > 0) {
    member_ = StripeMember{h.worker_id, h.session, h.request_id, header.stripe_id(), 0};
    ASSIGN_OR_RETURN(stripe_, stripes_->Open(member_, static_cast<int>(std::min<uint32_t>(header.stripe_parts(),
                                                                                         INT32_MAX)),
                                             upload_.get()));
  }
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
  if (part_) return absl::InvalidArgumentError("PushPart: unexpected trailer (it goes on the main stream)");
  if (!upload_) return absl::InvalidArgumentError("Push: trailer before the header");
  ::dtrain::wire::PushTrailer trailer;
  if (!trailer.ParseFromString(bytes)) return absl::InvalidArgumentError("Push: malformed trailer");
  if (trailer.has_gradient_norm()) {
    const double norm = trailer.gradient_norm();
    return stripe_ ? stripe_->SetGradientNorm(norm) : upload_->SetGradientNorm(norm);
  }
  return absl::OkStatus();
}

absl::Status UploadFeeder::OnData(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) {
  if (stripe_) return stripe_->Write(key, offset, n, dtype, data);
  if (!upload_) {
    return absl::InvalidArgumentError(initialize_ ? "Initialize: slice data before the worker id"
                                                  : part_ ? "PushPart: slice data before the header"
                                                          : "Push: slice data before the header");
  }
  return upload_->Write(key, offset, n, dtype, data);
}

absl::Status UploadFeeder::OnRowGradients(uint32_t table, const int64_t* ids, int64_t n, int dim, WireDtype dtype,
                                          const void* data) {
  if (part_) return absl::InvalidArgumentError("PushPart: sparse rows (they go on the main stream)");
  if (stripe_) return stripe_->WriteSparse(table, ids, n, dim, dtype, data);
  if (!upload_) {
    return absl::InvalidArgumentError(initialize_ ? "Initialize: sparse rows before the worker id"
                                                  : "Push: sparse rows before the header");
  }
  return upload_->WriteSparse(table, ids, n, dim, dtype, data);
}

absl::StatusOr<PushResponse> UploadFeeder::Finish() {
  if (part_) {
    if (!stripe_) return absl::InvalidArgumentError("PushPart: empty stream");
    finished_ = true;
    stripe_->PartEnded(member_.part, absl::OkStatus());
    return PushResponse{};
  }
  if (!upload_) return absl::InvalidArgumentError(initialize_ ? "Initialize: empty stream" : "Push: empty stream");
  if (stripe_) {
    finished_ = true;
    RETURN_IF_ERROR(stripes_->Close(member_.stripe_id, /*finishing=*/true));
  }
  return upload_->Finish();
}

}  // namespace dtrain::ps
