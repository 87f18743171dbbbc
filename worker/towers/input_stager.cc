#include "worker/towers/input_stager.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::worker {

using kernels::Queue;

absl::StatusOr<std::unique_ptr<InputStager>> InputStager::Create(kernels::Device* device,
                                                                 int64_t image_floats, int batch) {
  if (device == nullptr) return absl::InvalidArgumentError("InputStager: no device");
  if (image_floats < 1 || batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("InputStager: sizes must be positive, got ", image_floats,
                                                   " image floats, batch ", batch));
  }
  std::unique_ptr<InputStager> s(new InputStager(device, image_floats, batch));
  for (int k = 0; k < 2; ++k) {
    ASSIGN_OR_RETURN(s->pinned_[k], device->AllocHostPinned(image_floats + batch));
    ASSIGN_OR_RETURN(s->staged_[k], device->Alloc(image_floats + batch));
    ASSIGN_OR_RETURN(s->uploaded_[k], device->MakeEvent());
    ASSIGN_OR_RETURN(s->consumed_[k], device->MakeEvent());
  }
  return s;
}

InputStager::~InputStager() {
  for (int k = 0; k < 2; ++k) {
    // An upload may still read the pinned slot: let it land first.
    if (uploaded_[k] != nullptr) (void)device_->SynchronizeEvent(uploaded_[k].get());
    if (pinned_[k] != nullptr) device_->FreeHostPinned(pinned_[k]);
    if (staged_[k] != nullptr) device_->Free(staged_[k]);
  }
}

absl::Status InputStager::Stage(const models::HostBatch& batch, float* images, float* labels) {
  const int64_t image_floats =
      static_cast<int64_t>(batch.batch) * batch.height * batch.width * batch.channels;
  if (batch.batch != batch_ || image_floats != image_floats_ || batch.images == nullptr ||
      batch.labels == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("InputStager: a batch of ", batch.batch, " examples (",
                                                   image_floats, " floats), expected ", batch_, " (",
                                                   image_floats_, ")"));
  }
  const int s = next_;
  next_ ^= 1;
  // The upload two steps back read this pinned slot: the host may refill it once that has landed.
  RETURN_IF_ERROR(device_->SynchronizeEvent(uploaded_[s].get()));
  std::memcpy(pinned_[s], batch.images, sizeof(float) * image_floats_);
  std::memcpy(pinned_[s] + image_floats_, batch.labels, sizeof(float) * batch_);
  // The compute queue copied staged_[s] out two steps back (event never recorded: nothing to wait for).
  RETURN_IF_ERROR(device_->WaitEvent(consumed_[s].get(), Queue::kCopy));
  RETURN_IF_ERROR(device_->CopyToDeviceAsync(pinned_[s], staged_[s], image_floats_ + batch_, Queue::kCopy));
  RETURN_IF_ERROR(device_->RecordEvent(uploaded_[s].get(), Queue::kCopy));
  RETURN_IF_ERROR(device_->WaitEvent(uploaded_[s].get(), Queue::kCompute));
  RETURN_IF_ERROR(device_->CopyOnDevice(staged_[s], images, image_floats_));
  RETURN_IF_ERROR(device_->CopyOnDevice(staged_[s] + image_floats_, labels, batch_));
  return device_->RecordEvent(consumed_[s].get(), Queue::kCompute);
}

}  // namespace dtrain::worker
