// Uploads one tower's training batches to its device without stalling it: each batch is copied into one of
// two pinned host slots, uploaded on the device's copy queue into a device staging buffer, and copied from
// there into the model's inputs on the compute queue, ordered by events. So the upload of step k+1 overlaps
// the compute of step k (the compute queue only waits for it right before step k+1), and the inputs a
// captured CUDA graph reads keep their addresses.
//
// Back-pressure: refilling a pinned slot waits (on the host) for the upload that last read it, i.e. the one
// two steps back; so the host runs at most about two steps ahead of the device, and never blocks when the
// device keeps up. On the CPU backend every copy is a plain synchronous copy.
//
//   ASSIGN_OR_RETURN(auto stager, InputStager::Create(dev, images_per_batch, batch_size));
//   RETURN_IF_ERROR(stager->Stage(host_batch, model->device_images(), model->device_labels()));
//   ... enqueue the step on the compute queue ...
//
// Thread-safety: belongs to the thread that drives its Device.
#ifndef DTRAIN_WORKER_TOWERS_INPUT_STAGER_H_
#define DTRAIN_WORKER_TOWERS_INPUT_STAGER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/models/model.h"

namespace dtrain::worker {

class InputStager {
 public:
  // Two pinned slots and two device staging buffers of image_floats + batch floats, and their events, on
  // `device` (which must outlive the stager). InvalidArgument for non-positive sizes; device errors as the
  // device reports them.
  static absl::StatusOr<std::unique_ptr<InputStager>> Create(kernels::Device* device, int64_t image_floats,
                                                             int batch);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;

  // Stages `batch` (exactly `batch` examples of image_floats / batch floats each; InvalidArgument otherwise)
  // and enqueues on the compute queue its copy into `images` (image_floats floats) and `labels` (batch
  // floats), device buffers. Returns once the batch is in pinned memory: `batch` may be reused at once.
  absl::Status Stage(const models::HostBatch& batch, float* images, float* labels);

 private:
  InputStager(kernels::Device* device, int64_t image_floats, int batch)
      : device_(device), image_floats_(image_floats), batch_(batch) {}

  kernels::Device* device_;
  const int64_t image_floats_;
  const int batch_;
  float* pinned_[2] = {nullptr, nullptr};        // [images | labels]
  float* staged_[2] = {nullptr, nullptr};        // device copies of the slots
  std::unique_ptr<kernels::Event> uploaded_[2];  // copy queue: slot s is on the device (pinned slot free)
  std::unique_ptr<kernels::Event> consumed_[2];  // compute queue: staged_[s] was copied into the inputs
  int next_ = 0;
};

}  // namespace dtrain::worker

#endif  // DTRAIN_WORKER_TOWERS_INPUT_STAGER_H_
