// The CPU backend's loops for the stateless ops of imported graphs and sparse models (kernels/device.h:
// Activation, CopyStrided, Transpose, BatchNormRunningDelta, Gather, Interaction, SigmoidCrossEntropy). Like
// elementwise.h: plain loops split over `threads` OpenMP threads above a size threshold, pure functions of their
// arguments (thread-safe), semantics as documented in kernels/device.h. The caller (CpuDevice) validates sizes;
// the loops that read device data (indices, offsets, labels) validate it and return InvalidArgument with the
// header's messages.
#ifndef DTRAIN_KERNELS_CPU_GRAPH_LOOPS_H_
#define DTRAIN_KERNELS_CPU_GRAPH_LOOPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/device.h"

namespace dtrain::kernels::cpu {

void ActivationLoop(const ActivationParams& p, const float* x, float* y, int64_t n, int threads);
void ActivationBackwardLoop(const ActivationParams& p, const float* x, const float* y, const float* dy, float* dx,
                            int64_t n, int threads);
void CopyStridedLoop(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                     int64_t cols, bool accumulate, int threads);
void TransposeLoop(const float* x, float* y, int64_t batch, int64_t rows, int64_t cols, int threads);
void BatchNormRunningDeltaLoop(const float* running_mean, const float* running_var, const float* batch_mean,
                               const float* batch_var, int channels, int64_t count, float momentum, bool unbiased,
                               float* d_mean, float* d_var);
// InvalidArgument (naming `op`) for an index outside [0, rows) or offsets that are not a non-decreasing
// sequence in [0, count] ending at count.
absl::Status CheckGatherData(const char* op, const GatherParams& p, const int32_t* indices, const int32_t* offsets);
// Indices and offsets already checked.
void GatherLoop(const GatherParams& p, const float* table, const int32_t* indices, const int32_t* offsets, float* y,
                int threads);
void GatherBackwardLoop(const GatherParams& p, const float* dy, const int32_t* indices, const int32_t* offsets,
                        float* dtable, int threads);
void InteractionLoop(const InteractionParams& p, const float* x, float* y, int threads);
void InteractionBackwardLoop(const InteractionParams& p, const float* x, const float* dy, float* dx, int threads);
// Writes dlogits and *loss, or returns InvalidArgument for a label other than 0 or 1 (writing nothing).
absl::Status SigmoidCrossEntropyLoop(const float* logits, const float* labels, int batch, float* dlogits, float* loss,
                                     int threads);

}  // namespace dtrain::kernels::cpu

#endif  // DTRAIN_KERNELS_CPU_GRAPH_LOOPS_H_
