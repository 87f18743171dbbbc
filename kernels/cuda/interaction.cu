// DLRM's pairwise dot-product interaction (Device::Interaction) and its gradient, one block per example: the
// example's feature vectors (and, backward, its row of dy) are staged in shared memory when they fit in the
// default 48 KiB (rows padded to dim + 1 floats against bank conflicts), read from global memory otherwise.
// Every output sums in a fixed order (op_math.h's InteractionDot / InteractionInputGrad): deterministic, no
// atomics, no scratch. Kernels first, launchers below.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

constexpr int kInteractionThreads = 128;
constexpr size_t kMaxStagedBytes = size_t{48} << 10;
constexpr int64_t kMaxInteractionBlocks = 16384;

// ---- kernels ----

// `staged` is the same for every thread, so the barriers are uniform.
__global__ void InteractionKernel(const float* x, float* y, int64_t batch, int features, int dim, bool staged) {
  extern __shared__ float stage[];
  const int64_t pairs = PairIndex(features, 0);
  const int64_t elems = static_cast<int64_t>(features) * dim;
  const int ld = staged ? dim + 1 : dim;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const float* z = x + b * elems;
    if (staged) {
      for (int64_t e = threadIdx.x; e < elems; e += blockDim.x) stage[(e / dim) * ld + e % dim] = z[e];
      __syncthreads();
      z = stage;
    }
    for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
      int i, j;
      PairOf(p, &i, &j);
      y[b * pairs + p] = InteractionDot(z, ld, dim, i, j);
    }
    if (staged) __syncthreads();  // the next example overwrites the stage
  }
}

__global__ void InteractionBackwardKernel(const float* x, const float* dy, float* dx, int64_t batch, int features,
                                          int dim, bool staged) {
  extern __shared__ float stage[];
  const int64_t pairs = PairIndex(features, 0);
  const int64_t elems = static_cast<int64_t>(features) * dim;
  const int ld = staged ? dim + 1 : dim;
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x) {
    const float* z = x + b * elems;
    const float* g = dy + b * pairs;
    if (staged) {
      float* staged_g = stage + static_cast<int64_t>(features) * ld;
      for (int64_t e = threadIdx.x; e < elems; e += blockDim.x) stage[(e / dim) * ld + e % dim] = z[e];
      for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) staged_g[p] = g[p];
      __syncthreads();
      z = stage;
      g = staged_g;
    }
    for (int64_t e = threadIdx.x; e < elems; e += blockDim.x) {
      dx[b * elems + e] = InteractionInputGrad(z, ld, g, features, static_cast<int>(e / dim),
                                               static_cast<int>(e % dim));
    }
    if (staged) __syncthreads();
  }
}

int InteractionBlocks(int64_t batch) {
  return static_cast<int>(batch < kMaxInteractionBlocks ? batch : kMaxInteractionBlocks);
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchInteraction(const float* x, float* y, int batch, int features, int dim, cudaStream_t stream) {
  if (batch <= 0 || features < 2 || dim <= 0) return cudaSuccess;
  const size_t bytes = static_cast<size_t>(features) * (dim + 1) * sizeof(float);
  const bool staged = bytes <= kMaxStagedBytes;
  InteractionKernel<<<InteractionBlocks(batch), kInteractionThreads, staged ? bytes : 0, stream>>>(
      x, y, batch, features, dim, staged);
  return cudaGetLastError();
}

cudaError_t LaunchInteractionBackward(const float* x, const float* dy, float* dx, int batch, int features, int dim,
                                      cudaStream_t stream) {
  if (batch <= 0 || features <= 0 || dim <= 0) return cudaSuccess;
  const size_t bytes =
      (static_cast<size_t>(features) * (dim + 1) + static_cast<size_t>(PairIndex(features, 0))) * sizeof(float);
  const bool staged = bytes <= kMaxStagedBytes;
  InteractionBackwardKernel<<<InteractionBlocks(batch), kInteractionThreads, staged ? bytes : 0, stream>>>(
      x, dy, dx, batch, features, dim, staged);
  return cudaGetLastError();
}

}  // namespace dtrain::kernels::cuda
