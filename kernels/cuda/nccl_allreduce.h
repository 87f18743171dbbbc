// In-place averaging of a gradient buffer across the CUDA towers of one worker process: after AverageInPlace,
// every tower's buffer holds the mean of all of them. No CUDA types appear here, so the worker can use it through
// kernels::Device pointers (include it only where DTRAIN_HAVE_CUDA is defined: it lives in dtrain_kernels_cuda).
//
// How: towers on the same GPU are first summed into that GPU's first tower with device-side Axpy (NCCL refuses
// two ranks on one GPU: "Duplicate GPU detected"); the per-GPU sums are then all-reduced with NCCL (ncclSum,
// one communicator per distinct GPU, made with ncclCommInitAll) when there is more than one GPU; each GPU's
// leader scales by 1/towers and copies the mean back to the other towers on its GPU. Ordering uses CUDA events,
// so the host does not wait: work enqueued on any tower's stream after AverageInPlace sees the mean.
//
// Example:
//   ASSIGN_OR_RETURN(auto reducer, CreateGradientAllReducer({dev0.get(), dev1.get()}, num_params));
//   RETURN_IF_ERROR(reducer->AverageInPlace({grads0, grads1}));  // grads_i: n floats on dev_i
//
// Thread-safety: call from one thread at a time, the one that currently drives all the listed towers (it enqueues
// on every tower's stream). The devices must outlive the reducer.
#ifndef DTRAIN_KERNELS_CUDA_NCCL_ALLREDUCE_H_
#define DTRAIN_KERNELS_CUDA_NCCL_ALLREDUCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"

namespace dtrain::kernels::cuda {

class GradientAllReducer {
 public:
  virtual ~GradientAllReducer() = default;
  // buffers[i]: n device floats of devices[i] (same order as at creation). InvalidArgument on a count mismatch or
  // a null buffer; Internal/ResourceExhausted (naming CUDA or NCCL) if the device work cannot be enqueued.
  virtual absl::Status AverageInPlace(const std::vector<float*>& buffers) = 0;
  virtual int64_t size() const = 0;     // n
  virtual int num_towers() const = 0;   // devices.size()
  virtual int num_gpus() const = 0;     // distinct GPUs among the devices (NCCL ranks)
};

// devices: CUDA Devices (from CreateDevice with a GPU spec), each listed once; several may share a GPU.
// InvalidArgument for an empty list, n <= 0, a non-CUDA or repeated Device; errors from NCCL initialization
// come back as Internal/Unavailable naming NCCL.
absl::StatusOr<std::unique_ptr<GradientAllReducer>> CreateGradientAllReducer(std::vector<Device*> devices,
                                                                             int64_t n);

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_NCCL_ALLREDUCE_H_
