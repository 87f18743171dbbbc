// The CPU backend's elementwise and reduction loops (the stateless ops of Device). Plain loops that GCC
// vectorizes at -O3 -march=native; above kParallelMinElements they are split over `threads` OpenMP threads,
// below it they run on the calling thread. All are pure functions of their arguments: thread-safe.
// Semantics are those documented in kernels/device.h; argument validation is the caller's (CpuDevice's).
#ifndef DTRAIN_KERNELS_CPU_ELEMENTWISE_H_
#define DTRAIN_KERNELS_CPU_ELEMENTWISE_H_

#include <cstdint>

namespace dtrain::kernels::cpu {

// Arrays smaller than this run single-threaded (thread start-up costs more than the loop).
inline constexpr int64_t kParallelMinElements = int64_t{1} << 16;

void ReluLoop(const float* x, float* y, int64_t n, int threads);
void ReluBackwardLoop(const float* y, const float* dy, float* dx, int64_t n, int threads);
// keep_prob in (0, 1]; the mask is kernels/dropout_rng.h's.
void DropoutLoop(const float* x, float* y, float* mask, int64_t n, float keep_prob, uint64_t seed,
                 uint64_t counter, int threads);
void MulLoop(const float* a, const float* b, float* y, int64_t n, int threads);  // y = a * b
// Returns the mean loss; writes dlogits. Returns -1 (and writes nothing meaningful) if a label is not an
// integer in [0, classes), reporting the first bad row in *bad_row.
double SoftmaxCrossEntropyLoop(const float* logits, const float* labels, int batch, int classes,
                               float* dlogits, int threads, int* bad_row);
double SumSquaresHalf(const float* x, int64_t n, int threads);  // sum(x^2) / 2, accumulated in double
void AxpyLoop(float a, const float* x, float* y, int64_t n, int threads);
void ScaleLoop(float a, const float* x, float* y, int64_t n, int threads);
void FillLoop(float value, float* x, int64_t n, int threads);
void CopyLoop(const float* src, float* dst, int64_t n, int threads);

}  // namespace dtrain::kernels::cpu

#endif  // DTRAIN_KERNELS_CPU_ELEMENTWISE_H_
