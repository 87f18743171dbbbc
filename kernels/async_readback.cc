#include "kernels/async_readback.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::kernels {

absl::StatusOr<std::unique_ptr<AsyncReadback>> AsyncReadback::Create(Device* device, int64_t n) {
  if (device == nullptr) return absl::InvalidArgumentError("AsyncReadback: no device");
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("AsyncReadback: n must be >= 1, got ", n));
  std::unique_ptr<AsyncReadback> r(new AsyncReadback(device, n));
  ASSIGN_OR_RETURN(r->host_, device->AllocHostPinned(n));
  for (int64_t i = 0; i < n; ++i) r->host_[i] = 0.0f;
  ASSIGN_OR_RETURN(r->ready_, device->MakeEvent());
  return r;
}

AsyncReadback::~AsyncReadback() {
  if (host_ != nullptr) {
    // The copy may still be in flight: let it land before the memory goes back.
    if (recorded_) (void)device_->SynchronizeEvent(ready_.get());
    device_->FreeHostPinned(host_);
  }
}

absl::Status AsyncReadback::Start(const float* src) {
  RETURN_IF_ERROR(EnqueueCopy(src));
  return RecordReady();
}

absl::Status AsyncReadback::EnqueueCopy(const float* src) {
  if (src == nullptr) return absl::InvalidArgumentError("AsyncReadback: null source");
  return device_->CopyToHostAsync(src, host_, n_, Queue::kCompute);
}

absl::Status AsyncReadback::RecordReady() {
  RETURN_IF_ERROR(device_->RecordEvent(ready_.get(), Queue::kCompute));
  recorded_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> AsyncReadback::Ready() {
  if (!recorded_) return false;
  return device_->QueryEvent(ready_.get());
}

absl::StatusOr<const float*> AsyncReadback::Wait() {
  if (!recorded_) return absl::FailedPreconditionError("AsyncReadback::Wait before any Start/RecordReady");
  RETURN_IF_ERROR(device_->SynchronizeEvent(ready_.get()));
  return static_cast<const float*>(host_);
}

}  // namespace dtrain::kernels
