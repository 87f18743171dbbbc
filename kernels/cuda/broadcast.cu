// Broadcasting binary ops (Add, Sub, Mul, Div with numpy strides) and their gradients. The gradient of an input
// is a reduction over the dimensions it is broadcast along, done as a gather in a fixed order: one thread per
// (gradient element, chunk of reduced positions) sums its terms in double, then one thread per element adds the
// chunks in order. No atomics: results are identical run to run. Kernels first, launchers below; the index math
// is op_math.h's (BroadcastOffsets, BinaryGradPartial).
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

// ---- kernels ----

__global__ void BinaryForwardKernel(int op, BroadcastShape s, const float* a, const float* b, float* y,
                                    int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(o, total) {
    int64_t ao, bo;
    BroadcastOffsets(s, o, &ao, &bo);
    y[o] = BinaryValue(op, a[ao], b[bo]);
  }
}

// chunks == 1: the partial sum is the gradient element itself.
__global__ void BinaryGradPartialKernel(int op, ReduceShape r, const float* a, const float* b, const float* dy,
                                        double* partial, float* dx, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(t, total) {
    const double v = BinaryGradPartial(r, op, a, b, dy, t);
    if (r.chunks == 1) {
      dx[ReduceTarget(r, t)] = static_cast<float>(v);
    } else {
      partial[t] = v;
    }
  }
}

__global__ void BinaryGradFinalKernel(ReduceShape r, const double* partial, float* dx) {
  DTRAIN_GRID_STRIDE_LOOP(k, r.kept_count) {
    double acc = 0.0;
    for (int64_t c = 0; c < r.chunks; ++c) acc += partial[c * r.kept_count + k];
    dx[ReduceTarget(r, k)] = static_cast<float>(acc);
  }
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchBinaryForward(int op, const BroadcastShape& s, const float* a, const float* b, float* y,
                                cudaStream_t stream) {
  int64_t total = 1;
  for (int d = 0; d < s.rank; ++d) total *= s.dims[d];
  if (total <= 0) return cudaSuccess;
  BinaryForwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(op, s, a, b, y, total);
  return cudaGetLastError();
}

cudaError_t LaunchBinaryBackward(int op, const ReduceShape& r, const float* a, const float* b, const float* dy,
                                 double* partial, float* dx, cudaStream_t stream) {
  const int64_t total = r.kept_count * r.chunks;
  if (total <= 0) return cudaSuccess;
  BinaryGradPartialKernel<<<BlocksFor(total), kThreads, 0, stream>>>(op, r, a, b, dy, partial, dx, total);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || r.chunks == 1) return err;
  BinaryGradFinalKernel<<<BlocksFor(r.kept_count), kThreads, 0, stream>>>(r, partial, dx);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
