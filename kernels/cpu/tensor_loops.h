// The CPU backend's loops for the strided copies and reductions of imported graphs (kernels/tensor_ops.h). Like
// elementwise.h: split over `threads` OpenMP threads above a size threshold, pure functions of their arguments
// (thread-safe). The caller (CpuDevice, the Reduce op) validates the params.
#ifndef DTRAIN_KERNELS_CPU_TENSOR_LOOPS_H_
#define DTRAIN_KERNELS_CPU_TENSOR_LOOPS_H_

#include <cstdint>

#include "kernels/tensor_ops.h"

namespace dtrain::kernels::cpu {

// StridedCopyParams' copy: contiguous rows are copied whole, a transposition of two dims goes by 32x32 tiles,
// anything else element by element.
void StridedCopyLoop(const StridedCopyParams& p, const float* src, float* dst, bool accumulate, int threads);

// y = reduce(x) over the middle axis of [outer, reduce, inner]; for kMax, argmax[o * inner + i] receives the
// first maximum's r (null for the other kinds).
void ReduceLoop(const ReduceParams& p, const float* x, float* y, int32_t* argmax, int threads);
// dx from dy (kMax: through argmax, as ReduceLoop wrote it).
void ReduceBackwardLoop(const ReduceParams& p, const float* dy, const int32_t* argmax, float* dx, int threads);

}  // namespace dtrain::kernels::cpu

#endif  // DTRAIN_KERNELS_CPU_TENSOR_LOOPS_H_
