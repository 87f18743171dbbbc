// Launch geometry shared by the .cu files: 1-D grid-stride loops over int64 element counts.
#ifndef DTRAIN_KERNELS_CUDA_LAUNCH_CONFIG_CUH_
#define DTRAIN_KERNELS_CUDA_LAUNCH_CONFIG_CUH_

#include <cstdint>

namespace dtrain::kernels::cuda {

constexpr int kThreads = 256;
// Enough blocks to fill an H100/H200 several times over; grid-stride loops cover the rest.
constexpr int64_t kMaxBlocks = 4096;

inline int BlocksFor(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  return static_cast<int>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

#define DTRAIN_GRID_STRIDE_LOOP(i, n)                                                    \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_LAUNCH_CONFIG_CUH_
