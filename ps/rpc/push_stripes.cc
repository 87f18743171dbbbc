#include "ps/rpc/push_stripes.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dtrain::ps {
namespace {

constexpr size_t kClosedRemembered = 4096;

}  // namespace

absl::Status PushStripes::Stripe::Ended() const {
  return absl::FailedPreconditionError(absl::StrCat("striped push ", main_.request_id, " of worker ",
                                                    main_.worker_id, " already ended"));
}

absl::Status PushStripes::Stripe::Write(uint32_t key, int64_t offset, int64_t n, WireDtype dtype, const void* data) {
  absl::MutexLock lock(&mu_);
  if (upload_ == nullptr) return Ended();
  return upload_->Write(key, offset, n, dtype, data);
}

absl::Status PushStripes::Stripe::WriteSparse(uint32_t table, const int64_t* ids, int64_t n, int dim,
                                              WireDtype dtype, const void* rows) {
  absl::MutexLock lock(&mu_);
  if (upload_ == nullptr) return Ended();
  return upload_->WriteSparse(table, ids, n, dim, dtype, rows);
}

absl::Status PushStripes::Stripe::SetGradientNorm(double norm) {
  absl::MutexLock lock(&mu_);
  if (upload_ == nullptr) return Ended();
  return upload_->SetGradientNorm(norm);
}

void PushStripes::Stripe::PartEnded(int part, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    ended_[part] = 1;
  } else if (part_error_.ok()) {
    part_error_ = absl::Status(status.code(), absl::StrCat("part ", part, " of the striped push: ", status.message()));
  }
}

absl::StatusOr<std::shared_ptr<PushStripes::Stripe>> PushStripes::Open(const StripeMember& main, int parts,
                                                                       SliceUpload* upload) {
  if (parts < 1 || parts > kMaxPushParts) {
    return absl::InvalidArgumentError(
        absl::StrCat("Push: striped over ", parts, " part streams (1 to ", kMaxPushParts, ")"));
  }
  std::shared_ptr<Stripe> stripe(new Stripe(main, parts, upload));
  absl::MutexLock lock(&mu_);
  if (open_.contains(main.stripe_id) || closed_.contains(main.stripe_id)) {
    return absl::InvalidArgumentError(absl::StrCat("Push: stripe id ", main.stripe_id, " is already in use"));
  }
  open_[main.stripe_id] = stripe;
  opened_.SignalAll();
  return stripe;
}

absl::Status PushStripes::Close(uint64_t stripe_id, bool finishing) {
  std::shared_ptr<Stripe> stripe;
  {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(stripe_id);
    if (it == open_.end()) return absl::InternalError(absl::StrCat("stripe ", stripe_id, " is not open"));
    stripe = std::move(it->second);
    open_.erase(it);
    closed_.insert(stripe_id);
    closed_order_.push_back(stripe_id);
    if (closed_order_.size() > kClosedRemembered) {
      closed_.erase(closed_order_.front());
      closed_order_.pop_front();
    }
  }
  absl::MutexLock lock(&stripe->mu_);
  stripe->upload_ = nullptr;
  if (!finishing) return absl::OkStatus();
  if (!stripe->part_error_.ok()) return stripe->part_error_;
  for (size_t part = 1; part < stripe->ended_.size(); ++part) {
    if (!stripe->ended_[part]) {
      return absl::UnavailableError(absl::StrCat("Push: part ", part, " of ", stripe->ended_.size() - 1,
                                                 " of the striped push did not arrive whole"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<PushStripes::Stripe>> PushStripes::Join(const StripeMember& part,
                                                                       absl::Time deadline,
                                                                       const std::function<bool()>& stopped) {
  std::shared_ptr<Stripe> stripe;
  {
    absl::MutexLock lock(&mu_);
    while (!open_.contains(part.stripe_id)) {
      if (closed_.contains(part.stripe_id)) {
        return absl::FailedPreconditionError(
            absl::StrCat("PushPart: the striped push ", part.stripe_id, " already ended"));
      }
      if (stopped && stopped()) return absl::CancelledError("PushPart: the call or the ps ended");
      if (absl::Now() >= deadline) {
        return absl::UnavailableError(absl::StrCat("PushPart: no push with stripe id ", part.stripe_id,
                                                   " arrived before the part's deadline"));
      }
      opened_.WaitWithDeadline(&mu_, std::min(deadline, absl::Now() + absl::Milliseconds(50)));
    }
    stripe = open_[part.stripe_id];
  }
  const StripeMember& main = stripe->main_;
  if (part.worker_id != main.worker_id || part.session != main.session || part.request_id != main.request_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("PushPart: worker ", part.worker_id, " request ", part.request_id,
                     " names a striped push of worker ", main.worker_id, " request ", main.request_id));
  }
  absl::MutexLock lock(&stripe->mu_);
  if (part.part < 1 || part.part >= static_cast<int>(stripe->joined_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("PushPart: part ", part.part, " of a push striped over ",
                                                   stripe->joined_.size() - 1, " parts"));
  }
  if (stripe->joined_[part.part]++) {
    return absl::InvalidArgumentError(absl::StrCat("PushPart: part ", part.part, " joined twice"));
  }
  if (stripe->upload_ == nullptr) return stripe->Ended();
  return stripe;
}

}  // namespace dtrain::ps
