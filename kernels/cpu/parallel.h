// OpenMP helpers for the CPU backend's loops (internal to kernels/cpu): a range split into one contiguous chunk
// per thread, inline below a size threshold. Thread-safe as long as fn is.
#ifndef DTRAIN_KERNELS_CPU_PARALLEL_H_
#define DTRAIN_KERNELS_CPU_PARALLEL_H_

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/dnnl_util.h"

namespace dtrain::kernels::cpu {

inline constexpr int kMaxThreads = 256;

// Runs fn(begin, end) over [0, n): inline when threads <= 1 or n < min_parallel, else one contiguous chunk (a
// multiple of `align` elements; 16 floats are one cache line) per OpenMP thread. fn may call
// omp_get_thread_num() to tell the chunks apart (0 when inline).
template <typename Fn>
void ForChunks(int64_t n, int threads, int64_t min_parallel, Fn fn, int64_t align = 16) {
  FlushDenormalsOnThreads(std::min(threads, kMaxThreads));
  if (threads <= 1 || n < min_parallel) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(std::min(threads, kMaxThreads))
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = ((n + nt - 1) / nt + align - 1) / align * align;
    const int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) fn(begin, end);
  }
}

// Sum over threads of fn(begin, end) -> double, the chunks as ForChunks makes them; the partial sums added in
// thread order (the same bits for the same thread count).
template <typename Fn>
double ParallelSum(int64_t n, int threads, int64_t min_parallel, Fn fn) {
  if (threads <= 1 || n < min_parallel) return fn(int64_t{0}, n);
  double partial[kMaxThreads] = {};
  ForChunks(n, threads, min_parallel, [&](int64_t b, int64_t e) { partial[omp_get_thread_num()] = fn(b, e); });
  double s = 0;
  for (double p : partial) s += p;
  return s;
}

}  // namespace dtrain::kernels::cpu

#endif  // DTRAIN_KERNELS_CPU_PARALLEL_H_
