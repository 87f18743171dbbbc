// Flush-to-zero (FTZ) and denormals-are-zero (DAZ) for the calling thread, as TensorFlow sets them in its
// thread pools. Adam's moments and small gradients drift into denormal floats after a few hundred steps, and
// x86 arithmetic on them is ~100x slower: a long run lost 30% of its speed on the CPU. Flushing them to zero
// changes no accuracy that matters (values below 1e-38).
//
// MXCSR is per thread; a new thread inherits its creator's. Every thread that computes calls
// SetFlushDenormals() when it starts: the training loop, the OpenMP pools (kernels/cpu), ps apply and RPC
// handler threads, the worker's transfer lanes.
//
// Thread-safety: affects only the calling thread.
#ifndef DTRAIN_COMMON_DENORMALS_H_
#define DTRAIN_COMMON_DENORMALS_H_

namespace dtrain {

// Sets FTZ and DAZ on the calling thread (a no-op where the CPU has no such mode).
void SetFlushDenormals();
// Whether both are set on the calling thread (tests).
bool FlushDenormalsEnabled();
// Clears both on the calling thread (tests: a thread made by a thread that had them inherits them).
void ClearFlushDenormals();

}  // namespace dtrain

#endif  // DTRAIN_COMMON_DENORMALS_H_
