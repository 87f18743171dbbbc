// Averaging a gradient buffer across the towers (Devices) of one worker process, behind one interface for
// every backend: after the average, the towers' buffers hold the mean of all of them (the seeds'
// average_gradients).
//
//   - CPU towers: a host sum over the towers' buffers into tower 0's, then a scale (and copies back with
//     kEveryTower), spread over the towers' threads. Synchronous.
//   - GPU towers (kernels/cuda/nccl_allreduce.cc): towers on the same GPU are summed into that GPU's first
//   tower
//     with device Axpy (NCCL refuses two ranks on one GPU), the per-GPU sums are all-reduced with NCCL across
//     GPUs, scaled, and copied back to the other towers of each GPU. This runs on the averager's own stream
//     per GPU and is ordered with the towers' compute queues by events: the host never waits.
//
// Bucketed use while backward runs (phase 2): AverageRange(buffers, offset, count) enqueues the average of
// one range after the work already enqueued on every tower's compute queue (e.g. the backward of the layers
// whose gradients live in that range) and returns at once; work enqueued afterwards on the compute queues
// does NOT wait for it, so the next layers' backward overlaps the all-reduce. Join() then makes every tower's
// compute queue wait for all the averages enqueued so far: call it before the optimizer or a copy reads the
// averaged gradients (and before the next step's backward overwrites them). AverageInPlace = AverageRange
// over everything + Join.
//
// Example:
//   ASSIGN_OR_RETURN(auto avg, CreateGradientAverager({dev0.get(), dev1.get()}, num_params));
//   RETURN_IF_ERROR(avg->AverageInPlace({grads0, grads1}));  // grads_i: num_params floats on dev_i
//
// Thread-safety: call from one thread at a time, the one that currently drives all the listed towers (it
// enqueues on every tower's queue). The devices must outlive the averager. Ranges averaged between two Joins
// must not overlap.
#ifndef DTRAIN_KERNELS_GRADIENT_AVERAGER_H_
#define DTRAIN_KERNELS_GRADIENT_AVERAGER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace dtrain::kernels {

// Which buffers must hold the mean afterwards.
enum class AverageTarget {
  kEveryTower,  // every tower's buffer (each tower then applies the same update to its own copy)
  kFirstTower,  // only buffers[0] (e.g. it alone is copied to the host for the push); the others are scratch
};

class GradientAverager {
 public:
  virtual ~GradientAverager() = default;

  // buffers[i]: size() floats of devices[i] (same order as at creation). Averages [offset, offset + count).
  // InvalidArgument on a count mismatch, a null buffer or a range outside [0, size()); device/NCCL errors as
  // Internal/ResourceExhausted/Unavailable naming the step that failed.
  virtual absl::Status AverageRange(const std::vector<float*>& buffers, int64_t offset, int64_t count) = 0;
  // Orders every tower's compute queue after the averages enqueued since the last Join (no-op on the CPU).
  virtual absl::Status Join() = 0;
  // Orders queue q of one tower after the averages enqueued so far, without making any compute queue wait
  // (unlike Join): e.g. tower 0's copy queue before it copies an averaged range to the host while backward
  // goes on. No-op on the CPU (its averages are synchronous). InvalidArgument for a tower outside
  // [0, num_towers()).
  virtual absl::Status WaitForAverages(int tower, Queue q) = 0;
  // AverageRange(buffers, 0, size()) followed by Join().
  absl::Status AverageInPlace(const std::vector<float*>& buffers);

  virtual int64_t size() const = 0;    // n
  virtual int num_towers() const = 0;  // devices.size()

 protected:
  // The argument checks every implementation shares.
  absl::Status CheckArguments(const std::vector<float*>& buffers, int64_t offset, int64_t count) const;
};

// devices: all CPU or all GPU Devices (from CreateDevice), each listed once; GPU towers may share a GPU.
// InvalidArgument for an empty list, n <= 0, a null or repeated Device, or a mix of CPU and GPU devices;
// NCCL initialization errors come back as Internal/Unavailable naming NCCL.
absl::StatusOr<std::unique_ptr<GradientAverager>> CreateGradientAverager(
    std::vector<Device*> devices, int64_t n, AverageTarget target = AverageTarget::kEveryTower);

}  // namespace dtrain::kernels

#endif  // DTRAIN_KERNELS_GRADIENT_AVERAGER_H_
