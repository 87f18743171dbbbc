// Reading a few device floats (the loss, a metric) back to the host without stalling the compute queue:
// Start() enqueues a copy into pinned memory behind the work enqueued so far and records an event; Ready()
// polls it and Wait() blocks until it is done. Use it to read the loss only at logging steps, while later
// steps keep running.
//
//   ASSIGN_OR_RETURN(auto loss_reader, AsyncReadback::Create(dev, 1));
//   ... enqueue step k (eagerly, or Graph::Launch) ...
//   if (k % log_every == 0) RETURN_IF_ERROR(loss_reader->Start(device_loss));
//   ... enqueue more steps ...
//   ASSIGN_OR_RETURN(const float* loss, loss_reader->Wait());   // step k's loss
//
// Inside a graph capture use EnqueueCopy() (capturable) and call RecordReady() after each Graph::Launch: an
// event recorded during a capture does not mark replays (kernels/device.h).
//
// Errors: Wait and Ready report what the device reports when synchronizing, including device-data errors such
// as an out-of-range label (InvalidArgument, kernels/device.h). Thread-safety: belongs to its Device's owning
// thread.
#ifndef DTRAIN_KERNELS_ASYNC_READBACK_H_
#define DTRAIN_KERNELS_ASYNC_READBACK_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace dtrain::kernels {

class AsyncReadback {
 public:
  // n floats of pinned host memory and an event on `device` (which must outlive this object). InvalidArgument
  // for n < 1.
  static absl::StatusOr<std::unique_ptr<AsyncReadback>> Create(Device* device, int64_t n);
  ~AsyncReadback();
  AsyncReadback(const AsyncReadback&) = delete;
  AsyncReadback& operator=(const AsyncReadback&) = delete;

  // EnqueueCopy(src) then RecordReady(). `src`: n device floats.
  absl::Status Start(const float* src);
  // Enqueues the copy of n floats from `src` on the compute queue (capturable).
  absl::Status EnqueueCopy(const float* src);
  // Records the event that Ready/Wait look at, behind everything enqueued on the compute queue so far.
  absl::Status RecordReady();
  // Whether the copy behind the last RecordReady has landed (false before any). Does not block.
  absl::StatusOr<bool> Ready();
  // Blocks until it has; the n values, valid until the next copy is enqueued. FailedPrecondition before any
  // RecordReady.
  absl::StatusOr<const float*> Wait();

 private:
  AsyncReadback(Device* device, int64_t n) : device_(device), n_(n) {}

  Device* device_;
  int64_t n_;
  float* host_ = nullptr;  // pinned
  std::unique_ptr<Event> ready_;
  bool recorded_ = false;
};

}  // namespace dtrain::kernels

#endif  // DTRAIN_KERNELS_ASYNC_READBACK_H_
