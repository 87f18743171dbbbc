// The rows of a sparse table in the type the ps keeps them in (SparseTableSpec::row_dtype, slot_dtype): fp32, or
// 16 bits (fp16, bf16). Rows are always computed on in fp32: decoded before an update and encoded after it.
//
// Rounding: a row's first value (its initializer, an initial value, a restored row) is rounded to nearest even;
// an update is written back with stochastic rounding: each value becomes one of its two neighbours in the
// 16-bit type, the upper one with probability (x - lower) / (upper - lower), so the stored value is x on
// average and small updates (below half a unit in the last place, which round-to-nearest would drop every time)
// move the row in expectation. The draws are a fixed function of (seed, element): the caller seeds with the id
// and the step, so a run is reproducible. fp16 saturates at +-65504 (inf and NaN stay); bf16 keeps fp32's range.
//
// Thread-safety: stateless functions.
#ifndef DTRAIN_PS_CORE_ROW_CODEC_H_
#define DTRAIN_PS_CORE_ROW_CODEC_H_

#include <cstdint>

#include "ps/api/ps_types.h"
#include "ps/api/slice_io.h"

namespace dtrain::ps {

inline WireDtype WireDtypeOf(RowDtype d) {
  return d == RowDtype::kF16 ? WireDtype::kF16 : d == RowDtype::kBF16 ? WireDtype::kBF16 : WireDtype::kF32;
}

// n values of type d at src (any alignment) to floats.
void DecodeRow(RowDtype d, const void* src, int n, float* dst);
// n floats to type d, rounded to nearest even.
void EncodeRowNearest(RowDtype d, const float* src, int n, void* dst);
// n floats to type d, rounded stochastically (see above) with draws from `seed`; a copy for fp32.
void EncodeRowStochastic(RowDtype d, const float* src, int n, void* dst, uint64_t seed);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_ROW_CODEC_H_
