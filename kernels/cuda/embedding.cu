// Embedding lookups (Device::Gather) and their backward. Lookups are gathers (one thread per output float,
// deterministic); the backward scatters into the table with atomicAdd, so a row looked up several times in one
// call sums its gradients in an order that can change run to run (the last bits of dtable may differ). A bad
// index or bag never touches memory outside the buffers: its output is NaN (forward) or skipped (backward) and
// the first one is recorded in the device's DeviceErrorInfo by a one-thread kernel that follows. Kernels first,
// launchers below.
#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.cuh"

namespace dtrain::kernels::cuda {
namespace {

constexpr unsigned long long kNoneBad = ~0ull;  // first_bad's value between calls

// ---- kernels ----

__global__ void GatherRowsKernel(GatherShape s, const float* table, const int32_t* indices, float* y,
                                 unsigned long long* first_bad, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(t, total) {
    const int64_t i = t / s.dim;
    const int d = static_cast<int>(t % s.dim);
    const int32_t index = indices[i];
    if (IsTableRow(index, s.rows)) {
      y[t] = table[static_cast<int64_t>(index) * s.dim + d];
    } else {
      y[t] = NAN;
      if (d == 0) atomicMin(&first_bad[0], static_cast<unsigned long long>(i));
    }
  }
}

__global__ void GatherBagsKernel(GatherShape s, const float* table, const int32_t* indices, const int32_t* offsets,
                                 float* y, unsigned long long* first_bad, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(t, total) {
    const int64_t bag = t / s.dim;
    const int d = static_cast<int>(t % s.dim);
    int64_t lo, hi;
    if (!BagRange(offsets, s, bag, &lo, &hi)) {
      y[t] = NAN;
      if (d == 0) atomicMin(&first_bad[1], static_cast<unsigned long long>(bag));
      continue;
    }
    float acc = 0.0f;
    bool bad = false;
    for (int64_t j = lo; j < hi; ++j) {
      const int32_t index = indices[j];
      if (!IsTableRow(index, s.rows)) {
        bad = true;
        if (d == 0) atomicMin(&first_bad[0], static_cast<unsigned long long>(j));
        continue;
      }
      acc += table[static_cast<int64_t>(index) * s.dim + d];
    }
    if (s.mean && hi > lo) acc /= static_cast<float>(hi - lo);
    y[t] = bad ? NAN : acc;
  }
}

__global__ void GatherRowsBackwardKernel(GatherShape s, const float* dy, const int32_t* indices, float* dtable,
                                         unsigned long long* first_bad, int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(t, total) {
    const int64_t i = t / s.dim;
    const int d = static_cast<int>(t % s.dim);
    const int32_t index = indices[i];
    if (IsTableRow(index, s.rows)) {
      atomicAdd(&dtable[static_cast<int64_t>(index) * s.dim + d], dy[t]);
    } else if (d == 0) {
      atomicMin(&first_bad[0], static_cast<unsigned long long>(i));
    }
  }
}

__global__ void GatherBagsBackwardKernel(GatherShape s, const float* dy, const int32_t* indices,
                                         const int32_t* offsets, float* dtable, unsigned long long* first_bad,
                                         int64_t total) {
  DTRAIN_GRID_STRIDE_LOOP(t, total) {
    const int64_t bag = t / s.dim;
    const int d = static_cast<int>(t % s.dim);
    int64_t lo, hi;
    if (!BagRange(offsets, s, bag, &lo, &hi)) {
      if (d == 0) atomicMin(&first_bad[1], static_cast<unsigned long long>(bag));
      continue;
    }
    float g = dy[t];
    if (s.mean && hi > lo) g /= static_cast<float>(hi - lo);
    for (int64_t j = lo; j < hi; ++j) {
      const int32_t index = indices[j];
      if (IsTableRow(index, s.rows)) {
        atomicAdd(&dtable[static_cast<int64_t>(index) * s.dim + d], g);
      } else if (d == 0) {
        atomicMin(&first_bad[0], static_cast<unsigned long long>(j));
      }
    }
  }
}

// One thread, after the gather: records the first bad bag (else the first bad lookup) unless an error is
// pending, and resets first_bad.
__global__ void ReportGatherErrorKernel(unsigned long long* first_bad, const int32_t* indices,
                                        const int32_t* offsets, int64_t rows, int64_t count, int backward,
                                        DeviceErrorInfo* error) {
  const unsigned long long bad_lookup = first_bad[0], bad_bag = first_bad[1];
  if (bad_lookup == kNoneBad && bad_bag == kNoneBad) return;
  if (error != nullptr && error->code == DeviceErrorInfo::kNone) {
    int32_t code;
    if (bad_bag != kNoneBad) {
      code = DeviceErrorInfo::kBadGatherOffsets;
      error->position = static_cast<int64_t>(bad_bag);
      error->value = offsets[bad_bag];
      error->value2 = offsets[bad_bag + 1];
      error->bound = count;
    } else {
      code = DeviceErrorInfo::kBadGatherIndex;
      error->position = static_cast<int64_t>(bad_lookup);
      error->value = indices[bad_lookup];
      error->bound = rows;
    }
    error->backward = backward;
    __threadfence_system();
    error->code = code;
  }
  first_bad[0] = kNoneBad;
  first_bad[1] = kNoneBad;
}

cudaError_t Report(const GatherShape& s, const int32_t* indices, const int32_t* offsets,
                   unsigned long long* first_bad, int backward, DeviceErrorInfo* error, cudaStream_t stream) {
  ReportGatherErrorKernel<<<1, 1, 0, stream>>>(first_bad, indices, offsets, s.rows, s.count, backward, error);
  return cudaGetLastError();
}

}  // namespace

// ---- launchers ----

cudaError_t LaunchGather(const GatherShape& s, const float* table, const int32_t* indices, const int32_t* offsets,
                         float* y, unsigned long long* first_bad, DeviceErrorInfo* error, cudaStream_t stream) {
  const int64_t total = (s.num_bags > 0 ? s.num_bags : s.count) * s.dim;
  if (total <= 0) return cudaSuccess;
  if (s.num_bags > 0) {
    GatherBagsKernel<<<BlocksFor(total), kThreads, 0, stream>>>(s, table, indices, offsets, y, first_bad, total);
  } else {
    GatherRowsKernel<<<BlocksFor(total), kThreads, 0, stream>>>(s, table, indices, y, first_bad, total);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return Report(s, indices, offsets, first_bad, 0, error, stream);
}

cudaError_t LaunchGatherBackward(const GatherShape& s, const float* dy, const int32_t* indices,
                                 const int32_t* offsets, float* dtable, unsigned long long* first_bad,
                                 DeviceErrorInfo* error, cudaStream_t stream) {
  const int64_t total = (s.num_bags > 0 ? s.num_bags : s.count) * s.dim;
  if (total <= 0) return cudaSuccess;
  if (s.num_bags > 0) {
    GatherBagsBackwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(s, dy, indices, offsets, dtable, first_bad,
                                                                        total);
  } else {
    GatherRowsBackwardKernel<<<BlocksFor(total), kThreads, 0, stream>>>(s, dy, indices, dtable, first_bad, total);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return Report(s, indices, offsets, first_bad, 1, error, stream);
}

}  // namespace dtrain::kernels::cuda
