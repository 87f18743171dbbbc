// The per-element index math and arithmetic of the CUDA backend's own kernels (pool_lrn.cu, broadcast.cu,
// batch_norm.cu, embedding.cu, loss.cu, elementwise.cu, tensor_ops.cu), and the GEMM plans of its MatMul, as
// __host__ __device__ functions: each kernel is a grid-stride loop (or a fixed-order reduction) around one of
// them, and cuda_op_math_test runs the same functions on the host against naive loops, so the index math is
// checked on machines without a GPU.
//
// Plain C++17 with no Abseil and no CUDA runtime calls: it compiles with nvcc and with the host compiler.
// Pointers are device pointers in the kernels and host pointers in the tests. Stateless; thread-safe.
#ifndef DTRAIN_KERNELS_CUDA_OP_MATH_H_
#define DTRAIN_KERNELS_CUDA_OP_MATH_H_

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define DTRAIN_HD __host__ __device__ inline
#else
#define DTRAIN_HD inline
#endif

namespace dtrain::kernels::cuda {

DTRAIN_HD int MinInt(int a, int b) { return a < b ? a : b; }
DTRAIN_HD int MaxInt(int a, int b) { return a > b ? a : b; }
DTRAIN_HD int64_t MinI64(int64_t a, int64_t b) { return a < b ? a : b; }

// Splits a reduction of `length` terms for each of `outputs` results into chunks, so that outputs * chunks
// threads keep the GPU busy while each chunk still sums at least a few dozen terms. The split depends only on
// the shape (chosen when an op is made), so the summation order, and the result, is the same every run.
struct ChunkSplit {
  int64_t chunks, chunk_len;
};
DTRAIN_HD ChunkSplit SplitReduction(int64_t outputs, int64_t length) {
  constexpr int64_t kTargetThreads = int64_t{1} << 16, kMinChunk = 32;
  if (length < 1) return {1, 0};
  int64_t chunks = 1;
  if (outputs < kTargetThreads && length > kMinChunk) {
    chunks = MinI64((kTargetThreads + outputs - 1) / outputs, (length + kMinChunk - 1) / kMinChunk);
  }
  const int64_t len = (length + chunks - 1) / chunks;
  return {(length + len - 1) / len, len};
}

// ---- pooling (NHWC) ----

struct PoolShape {
  int batch, in_h, in_w, channels, out_h, out_w;
  int window_h, window_w, stride_h, stride_w;
  int pad_top, pad_left;  // padding before the data
  // Padding after the data as given (without the ceil_mode overhang): the extent AvgPool's count_include_pad
  // counts. MaxPool ignores it (windows are clipped to the data).
  int pad_bottom, pad_right;
  int count_include_pad;  // AvgPool: 1 divides by the window clipped to the padded extent, 0 by its real elements
};

// The outputs (one dimension) whose window holds input position i: [*first, *last], empty when first > last.
// Output o covers [o * stride - pad_before, o * stride - pad_before + window).
DTRAIN_HD void CoveringOutputs(int i, int pad_before, int window, int stride, int out, int* first, int* last) {
  const int lo = i + pad_before - window + 1;  // o * stride >= lo
  *first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  *last = MinInt(out - 1, (i + pad_before) / stride);
}

// Output element o of max pooling over the window's real elements: the first maximum in row-major window
// order (padding never wins), and its flat input index in *argmax; -inf and -1 for a window of padding only.
DTRAIN_HD float MaxPoolOutput(const float* x, const PoolShape& s, int64_t o, int32_t* argmax) {
  int64_t t = o;
  const int c = static_cast<int>(t % s.channels);
  t /= s.channels;
  const int ow = static_cast<int>(t % s.out_w);
  t /= s.out_w;
  const int oh = static_cast<int>(t % s.out_h);
  const int64_t n = t / s.out_h;
  const int h0 = oh * s.stride_h - s.pad_top, w0 = ow * s.stride_w - s.pad_left;
  const int h_begin = MaxInt(h0, 0), h_end = MinInt(h0 + s.window_h, s.in_h);
  const int w_begin = MaxInt(w0, 0), w_end = MinInt(w0 + s.window_w, s.in_w);
  float best = -INFINITY;
  int64_t best_i = -1;
  for (int ih = h_begin; ih < h_end; ++ih) {
    for (int iw = w_begin; iw < w_end; ++iw) {
      const int64_t i = ((n * s.in_h + ih) * s.in_w + iw) * s.channels + c;
      const float v = x[i];
      if (best_i < 0 || v > best) {  // the first maximum wins ties
        best = v;
        best_i = i;
      }
    }
  }
  *argmax = static_cast<int32_t>(best_i);
  return best;
}

// dx[i]: the sum of dy over the outputs whose window holds i and chose it (a gather: no atomics).
DTRAIN_HD float MaxPoolInputGrad(const float* dy, const int32_t* argmax, const PoolShape& s, int64_t i) {
  int64_t t = i;
  const int c = static_cast<int>(t % s.channels);
  t /= s.channels;
  const int iw = static_cast<int>(t % s.in_w);
  t /= s.in_w;
  const int ih = static_cast<int>(t % s.in_h);
  const int64_t n = t / s.in_h;
  int oh_first, oh_last, ow_first, ow_last;
  CoveringOutputs(ih, s.pad_top, s.window_h, s.stride_h, s.out_h, &oh_first, &oh_last);
  CoveringOutputs(iw, s.pad_left, s.window_w, s.stride_w, s.out_w, &ow_first, &ow_last);
  float acc = 0.0f;
  for (int oh = oh_first; oh <= oh_last; ++oh) {
    for (int ow = ow_first; ow <= ow_last; ++ow) {
      const int64_t o = ((n * s.out_h + oh) * s.out_w + ow) * s.channels + c;
      if (argmax[o] == static_cast<int32_t>(i)) acc += dy[o];
    }
  }
  return acc;
}

// The divisor of average-pooling output (oh, ow): the window's real elements, or with count_include_pad the
// window clipped to the padded extent [-pad_before, in + pad_after) (the ceil_mode overhang never counts).
DTRAIN_HD int AvgPoolDivisor(const PoolShape& s, int oh, int ow) {
  const int h0 = oh * s.stride_h - s.pad_top, w0 = ow * s.stride_w - s.pad_left;
  int h_lo, h_hi, w_lo, w_hi;
  if (s.count_include_pad) {
    h_lo = MaxInt(h0, -s.pad_top);
    h_hi = MinInt(h0 + s.window_h, s.in_h + s.pad_bottom);
    w_lo = MaxInt(w0, -s.pad_left);
    w_hi = MinInt(w0 + s.window_w, s.in_w + s.pad_right);
  } else {
    h_lo = MaxInt(h0, 0);
    h_hi = MinInt(h0 + s.window_h, s.in_h);
    w_lo = MaxInt(w0, 0);
    w_hi = MinInt(w0 + s.window_w, s.in_w);
  }
  return MaxInt(h_hi - h_lo, 0) * MaxInt(w_hi - w_lo, 0);
}

// Output element o of average pooling (0 for a window that counts nothing).
DTRAIN_HD float AvgPoolOutput(const float* x, const PoolShape& s, int64_t o) {
  int64_t t = o;
  const int c = static_cast<int>(t % s.channels);
  t /= s.channels;
  const int ow = static_cast<int>(t % s.out_w);
  t /= s.out_w;
  const int oh = static_cast<int>(t % s.out_h);
  const int64_t n = t / s.out_h;
  const int divisor = AvgPoolDivisor(s, oh, ow);
  if (divisor == 0) return 0.0f;
  const int h0 = oh * s.stride_h - s.pad_top, w0 = ow * s.stride_w - s.pad_left;
  const int h_begin = MaxInt(h0, 0), h_end = MinInt(h0 + s.window_h, s.in_h);
  const int w_begin = MaxInt(w0, 0), w_end = MinInt(w0 + s.window_w, s.in_w);
  float acc = 0.0f;
  for (int ih = h_begin; ih < h_end; ++ih) {
    for (int iw = w_begin; iw < w_end; ++iw) acc += x[((n * s.in_h + ih) * s.in_w + iw) * s.channels + c];
  }
  return acc / static_cast<float>(divisor);
}

// dx[i] of average pooling: the sum of dy[o] / divisor(o) over the outputs whose window holds i.
DTRAIN_HD float AvgPoolInputGrad(const float* dy, const PoolShape& s, int64_t i) {
  int64_t t = i;
  const int c = static_cast<int>(t % s.channels);
  t /= s.channels;
  const int iw = static_cast<int>(t % s.in_w);
  t /= s.in_w;
  const int ih = static_cast<int>(t % s.in_h);
  const int64_t n = t / s.in_h;
  int oh_first, oh_last, ow_first, ow_last;
  CoveringOutputs(ih, s.pad_top, s.window_h, s.stride_h, s.out_h, &oh_first, &oh_last);
  CoveringOutputs(iw, s.pad_left, s.window_w, s.stride_w, s.out_w, &ow_first, &ow_last);
  float acc = 0.0f;
  for (int oh = oh_first; oh <= oh_last; ++oh) {
    for (int ow = ow_first; ow <= ow_last; ++ow) {
      const int divisor = AvgPoolDivisor(s, oh, ow);  // >= 1: the window holds i
      acc += dy[((n * s.out_h + oh) * s.out_w + ow) * s.channels + c] / static_cast<float>(divisor);
    }
  }
  return acc;
}

// ---- activations (ActivationParams; kind in ActivationParams::Kind's order) ----

enum ActivationKind : int {
  kActLeakyRelu = 0,
  kActClip = 1,
  kActSigmoid = 2,
  kActTanh = 3,
  kActHardSigmoid = 4,
  kActHardSwish = 5,
  kActGelu = 6,
  kActSilu = 7,
  kActErf = 8,
  kActSqrt = 9,
  kActPow = 10,
};
struct ActivationArgs {
  int kind;
  float alpha, lo, hi;  // LeakyRelu's slope and HardSigmoid's alpha; Clip's bounds
  float beta;           // HardSigmoid
  float exponent;       // Pow
};

// The float constants of the CPU backend's loops (kernels/cpu/graph_loops.cc), spelled out so that device code
// needs no M_* macros.
constexpr float kSqrtHalf = 0.70710678118654752f;        // 1 / sqrt(2)
constexpr float kTwoOverSqrtPi = 1.12837916709551257f;   // 2 / sqrt(pi): erf'(0)
constexpr float kInvSqrtTwoPi = 0.39894228040143268f;    // 1 / sqrt(2 pi): the standard normal density at 0

// 1 / (1 + e^-x) without overflow for either sign.
DTRAIN_HD float Sigmoid(float x) {
  if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
  const float e = expf(x);
  return e / (1.0f + e);
}

// min(max(v, 0), 1) with std::min / std::max's NaN behaviour (NaN passes through).
DTRAIN_HD float ClampUnit(float v) {
  const float m = v < 0.0f ? 0.0f : v;
  return 1.0f < m ? 1.0f : m;
}

DTRAIN_HD float ActivationValue(const ActivationArgs& a, float x) {
  switch (a.kind) {
    case kActLeakyRelu:
      return x < 0.0f ? a.alpha * x : x;
    case kActClip:  // min(max(x, lo), hi), NaN passing through as with std::min/std::max
      return x < a.lo ? a.lo : (a.hi < x ? a.hi : x);
    case kActSigmoid:
      return Sigmoid(x);
    case kActTanh:
      return tanhf(x);
    case kActHardSigmoid:
      return ClampUnit(a.alpha * x + a.beta);
    case kActHardSwish:
      return x * ClampUnit(x * (1.0f / 6.0f) + 0.5f);
    case kActGelu:  // the exact (erf) GELU
      return 0.5f * x * (1.0f + erff(x * kSqrtHalf));
    case kActSilu:
      return x * Sigmoid(x);
    case kActErf:
      return erff(x);
    case kActSqrt:
      return sqrtf(x);
    default:  // kActPow; squares exactly, as the CPU does
      return a.exponent == 2.0f ? x * x : powf(x, a.exponent);
  }
}

// Whether ActivationGrad reads the forward's output y (Sigmoid, Tanh, Sqrt) rather than its input x.
DTRAIN_HD bool ActivationGradReadsY(int kind) { return kind == kActSigmoid || kind == kActTanh || kind == kActSqrt; }

// dx = dy * f'(x), from the forward's input x and output y (only the one ActivationGradReadsY names is read).
// PyTorch's conventions at the kinks, as the CPU backend.
DTRAIN_HD float ActivationGrad(const ActivationArgs& a, float x, float y, float dy) {
  switch (a.kind) {
    case kActLeakyRelu:  // slope alpha at 0 and below, as PyTorch and oneDNN
      return x > 0.0f ? dy : a.alpha * dy;
    case kActClip:  // 1 strictly inside (lo, hi), 0 elsewhere
      return (x > a.lo && x < a.hi) ? dy : 0.0f;
    case kActSigmoid:
      return dy * y * (1.0f - y);
    case kActTanh:
      return dy * (1.0f - y * y);
    case kActHardSigmoid: {  // alpha strictly inside (0, 1)
      const float u = a.alpha * x + a.beta;
      return u > 0.0f && u < 1.0f ? a.alpha * dy : 0.0f;
    }
    case kActHardSwish:  // PyTorch's hardswish_backward: 0 below -3, x / 3 + 1 / 2 up to 3 (inclusive), 1 above
      return x < -3.0f ? 0.0f : (x <= 3.0f ? dy * (x * (1.0f / 3.0f) + 0.5f) : dy);
    case kActGelu: {
      const float cdf = 0.5f * (1.0f + erff(x * kSqrtHalf));
      const float pdf = expf(-0.5f * x * x) * kInvSqrtTwoPi;
      return dy * (cdf + x * pdf);
    }
    case kActSilu: {
      const float s = Sigmoid(x);
      return dy * s * (1.0f + x * (1.0f - s));
    }
    case kActErf:
      return dy * kTwoOverSqrtPi * expf(-x * x);
    case kActSqrt:
      return dy * 0.5f / y;
    default:  // kActPow
      return dy * a.exponent * powf(x, a.exponent - 1.0f);
  }
}

// ---- sigmoid cross-entropy ----

DTRAIN_HD bool IsBinaryLabel(float t) { return t == 0.0f || t == 1.0f; }
// max(z, 0) - z t + log(1 + e^-|z|).
DTRAIN_HD float SigmoidCrossEntropyLoss(float z, float t) {
  return (z > 0.0f ? z : 0.0f) - z * t + log1pf(expf(-fabsf(z)));
}

// ---- broadcasting binary ops (BroadcastParams, after MakeBroadcastShape in kernel_shapes.h) ----

constexpr int kMaxRank = 5;
enum BinaryKind : int { kBinAdd = 0, kBinSub = 1, kBinMul = 2, kBinDiv = 3 };  // BinaryOp's order

// The output's dims (outermost first; y dense row-major) and each input's stride per output dim.
struct BroadcastShape {
  int rank;
  int64_t dims[kMaxRank];
  int64_t a_strides[kMaxRank], b_strides[kMaxRank];
};

// Offsets into a and b of output element o.
DTRAIN_HD void BroadcastOffsets(const BroadcastShape& s, int64_t o, int64_t* a_off, int64_t* b_off) {
  int64_t ao = 0, bo = 0;
  for (int d = s.rank - 1; d >= 0; --d) {
    const int64_t c = o % s.dims[d];
    o /= s.dims[d];
    ao += c * s.a_strides[d];
    bo += c * s.b_strides[d];
  }
  *a_off = ao;
  *b_off = bo;
}

DTRAIN_HD float BinaryValue(int op, float a, float b) {
  switch (op) {
    case kBinAdd:
      return a + b;
    case kBinSub:
      return a - b;
    case kBinMul:
      return a * b;
    default:
      return a / b;
  }
}

// What one output element contributes to the gradient of input `which` (0: a, 1: b).
DTRAIN_HD float BinaryGradTerm(int op, int which, float dy, float a, float b) {
  switch (op) {
    case kBinAdd:
      return dy;
    case kBinSub:
      return which == 0 ? dy : -dy;
    case kBinMul:
      return which == 0 ? dy * b : dy * a;
    default:
      return which == 0 ? dy / b : -dy * a / (b * b);
  }
}

// The gradient of one input as a reduction: the output dims split into the input's own ("kept": stride != 0)
// and its broadcast ones ("reduced": stride 0). Kept index k and reduced index r (row-major over their dims)
// together name one output element; the reduced range is cut into `chunks` of `chunk_len`.
struct ReduceShape {
  int which;  // 0: a's gradient, 1: b's
  int kept_rank, reduced_rank;
  int64_t kept_dims[kMaxRank], kept_out[kMaxRank], kept_a[kMaxRank], kept_b[kMaxRank];
  int64_t reduced_dims[kMaxRank], reduced_out[kMaxRank], reduced_a[kMaxRank], reduced_b[kMaxRank];
  int64_t kept_count, reduced_count;
  int64_t chunks, chunk_len;
};

// Offsets (output, a, b) of index i over dims with the given strides.
DTRAIN_HD void SplitOffsets(int rank, const int64_t* dims, const int64_t* so, const int64_t* sa, const int64_t* sb,
                            int64_t i, int64_t* o, int64_t* a, int64_t* b) {
  int64_t oo = 0, ao = 0, bo = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t c = i % dims[d];
    i /= dims[d];
    oo += c * so[d];
    ao += c * sa[d];
    bo += c * sb[d];
  }
  *o = oo;
  *a = ao;
  *b = bo;
}

// The offset in the gradient's input (a or b) of kept index k.
DTRAIN_HD int64_t ReduceTarget(const ReduceShape& r, int64_t k) {
  int64_t o, a, b;
  SplitOffsets(r.kept_rank, r.kept_dims, r.kept_out, r.kept_a, r.kept_b, k, &o, &a, &b);
  return r.which == 0 ? a : b;
}

// Thread t (k = t % kept_count, chunk = t / kept_count): the sum, in reduced order, of the gradient terms of
// kept index k over its chunk of reduced indices.
DTRAIN_HD double BinaryGradPartial(const ReduceShape& r, int op, const float* a, const float* b, const float* dy,
                                   int64_t t) {
  const int64_t k = t % r.kept_count, chunk = t / r.kept_count;
  int64_t ko, ka, kb;
  SplitOffsets(r.kept_rank, r.kept_dims, r.kept_out, r.kept_a, r.kept_b, k, &ko, &ka, &kb);
  const int64_t begin = chunk * r.chunk_len, end = MinI64(begin + r.chunk_len, r.reduced_count);
  const bool needs_inputs = op == kBinMul || op == kBinDiv;
  double acc = 0.0;
  for (int64_t i = begin; i < end; ++i) {
    int64_t ro, ra, rb;
    SplitOffsets(r.reduced_rank, r.reduced_dims, r.reduced_out, r.reduced_a, r.reduced_b, i, &ro, &ra, &rb);
    const float av = needs_inputs ? a[ka + ra] : 0.0f, bv = needs_inputs ? b[kb + rb] : 0.0f;
    acc += static_cast<double>(BinaryGradTerm(op, r.which, dy[ko + ro], av, bv));
  }
  return acc;
}

// ---- batch normalization over [rows, channels] ----

struct ColumnShape {
  int64_t rows;
  int channels;
  int64_t chunks, chunk_len;  // SplitReduction(channels, rows)
};

DTRAIN_HD float BatchNormInvStd(float var, float epsilon) { return 1.0f / sqrtf(var + epsilon); }

// Thread t (c = t % channels, chunk = t / channels): sums of x and x^2 over its chunk of rows.
DTRAIN_HD void BatchNormStatsPartial(const float* x, const ColumnShape& s, int64_t t, double* sum, double* sumsq) {
  const int c = static_cast<int>(t % s.channels);
  const int64_t begin = (t / s.channels) * s.chunk_len, end = MinI64(begin + s.chunk_len, s.rows);
  double a = 0.0, a2 = 0.0;
  for (int64_t r = begin; r < end; ++r) {
    const double v = x[r * s.channels + c];
    a += v;
    a2 += v * v;
  }
  *sum = a;
  *sumsq = a2;
}

// Channel c: the batch mean and biased variance from the chunks' partial sums (summed in chunk order).
DTRAIN_HD void BatchNormStatsFinal(const double* sum, const double* sumsq, const ColumnShape& s, int c, float* mean,
                                   float* var) {
  double a = 0.0, a2 = 0.0;
  for (int64_t k = 0; k < s.chunks; ++k) {
    a += sum[k * s.channels + c];
    a2 += sumsq[k * s.channels + c];
  }
  const double m = a / static_cast<double>(s.rows);
  const double v = a2 / static_cast<double>(s.rows) - m * m;
  mean[c] = static_cast<float>(m);
  var[c] = static_cast<float>(v > 0.0 ? v : 0.0);
}

DTRAIN_HD float BatchNormValue(float x, float scale, float bias, float mean, float var, float epsilon) {
  return (x - mean) * BatchNormInvStd(var, epsilon) * scale + bias;
}

// Thread t: sums of dy and dy * xhat over its chunk of rows (xhat = (x - mean) / sqrt(var + epsilon)).
DTRAIN_HD void BatchNormGradPartial(const float* x, const float* dy, const float* mean, const float* var,
                                    float epsilon, const ColumnShape& s, int64_t t, double* sum_dy,
                                    double* sum_dy_xhat) {
  const int c = static_cast<int>(t % s.channels);
  const int64_t begin = (t / s.channels) * s.chunk_len, end = MinI64(begin + s.chunk_len, s.rows);
  const float m = mean[c], inv_std = BatchNormInvStd(var[c], epsilon);
  double a = 0.0, b = 0.0;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t i = r * s.channels + c;
    const double g = dy[i];
    a += g;
    b += g * static_cast<double>((x[i] - m) * inv_std);
  }
  *sum_dy = a;
  *sum_dy_xhat = b;
}

// Channel c: dbias = sum dy, dscale = sum dy xhat.
DTRAIN_HD void BatchNormGradFinal(const double* sum_dy, const double* sum_dy_xhat, const ColumnShape& s, int c,
                                  float* dscale, float* dbias) {
  double a = 0.0, b = 0.0;
  for (int64_t k = 0; k < s.chunks; ++k) {
    a += sum_dy[k * s.channels + c];
    b += sum_dy_xhat[k * s.channels + c];
  }
  dbias[c] = static_cast<float>(a);
  dscale[c] = static_cast<float>(b);
}

// dx = scale / sqrt(var + eps) * (dy - dbias / N - xhat * dscale / N), N = rows.
DTRAIN_HD float BatchNormInputGrad(float x, float dy, float scale, float mean, float var, float dscale, float dbias,
                                   float epsilon, float inv_rows) {
  const float inv_std = BatchNormInvStd(var, epsilon);
  const float xhat = (x - mean) * inv_std;
  return scale * inv_std * (dy - dbias * inv_rows - xhat * dscale * inv_rows);
}

// ---- embedding lookups (GatherParams) ----

struct GatherShape {
  int64_t rows;
  int dim;
  int64_t count, num_bags;
  int mean;
};

DTRAIN_HD bool IsTableRow(int32_t index, int64_t rows) { return index >= 0 && index < rows; }
// Bag b's lookups [*lo, *hi); false (and an empty range) when its offsets are not ascending within [0, count] or
// the last bag does not end at count (the CPU's rule: every lookup belongs to a bag).
DTRAIN_HD bool BagRange(const int32_t* offsets, const GatherShape& s, int64_t b, int64_t* lo, int64_t* hi) {
  const int64_t l = offsets[b], h = offsets[b + 1];
  if (l < 0 || h < l || h > s.count || (b + 1 == s.num_bags && h != s.count)) {
    *lo = *hi = 0;
    return false;
  }
  *lo = l;
  *hi = h;
  return true;
}

// ---- DLRM interaction ----

// Position of the dot product z[i] . z[j] (i > j) in the row-major lower triangle.
DTRAIN_HD int64_t PairIndex(int i, int j) { return static_cast<int64_t>(i) * (i - 1) / 2 + j; }
DTRAIN_HD void PairOf(int64_t p, int* i, int* j) {
  int r = static_cast<int>((1.0 + sqrt(1.0 + 8.0 * static_cast<double>(p))) / 2.0);
  while (r > 1 && PairIndex(r, 0) > p) --r;  // guard against sqrt rounding either way
  while (PairIndex(r + 1, 0) <= p) ++r;
  *i = r;
  *j = static_cast<int>(p - PairIndex(r, 0));
}

// dot(z[i], z[j]) of one example's features z (rows `ld` floats apart).
DTRAIN_HD float InteractionDot(const float* z, int ld, int dim, int i, int j) {
  const float* zi = z + static_cast<int64_t>(i) * ld;
  const float* zj = z + static_cast<int64_t>(j) * ld;
  float acc = 0.0f;
  for (int k = 0; k < dim; ++k) acc += zi[k] * zj[k];
  return acc;
}

// dx[i][k] = sum over j != i of dy(pair of i and j) * z[j][k], j ascending.
DTRAIN_HD float InteractionInputGrad(const float* z, int ld, const float* dy_row, int features, int i, int k) {
  float acc = 0.0f;
  for (int j = 0; j < features; ++j) {
    if (j == i) continue;
    const int64_t p = j < i ? PairIndex(i, j) : PairIndex(j, i);
    acc += dy_row[p] * z[static_cast<int64_t>(j) * ld + k];
  }
  return acc;
}

// ---- tensor ops of imported graphs (kernels/tensor_ops.h; tensor_ops.cu) ----

// A strided copy (StridedCopyParams after SimplifyStridedCopy): dims outermost first, one thread per element of
// the index space, which addresses one destination element each (so accumulating needs no atomics).
constexpr int kMaxCopyDims = 8;  // kernels::kMaxCopyRank
struct CopyShape {
  int rank;
  int64_t dims[kMaxCopyDims];
  int64_t src_strides[kMaxCopyDims], dst_strides[kMaxCopyDims];
};

// Offsets into src and dst of element i of the index space (row-major over dims).
DTRAIN_HD void CopyOffsets(const CopyShape& s, int64_t i, int64_t* src, int64_t* dst) {
  int64_t so = 0, d = 0;
  for (int k = s.rank - 1; k >= 0; --k) {
    const int64_t c = i % s.dims[k];
    i /= s.dims[k];
    so += c * s.src_strides[k];
    d += c * s.dst_strides[k];
  }
  *src = so;
  *dst = d;
}

// x viewed as [outer, reduce, inner]; y as [outer, inner]. kind in ReduceKind's order.
enum ReduceOpKind : int { kReduceSum = 0, kReduceMean = 1, kReduceMax = 2 };
struct ReduceDims {
  int kind;
  int64_t outer, reduce, inner;
};

// Output o (= outer index * inner + inner index) of the reduction, summed (or compared) in increasing r, as the
// CPU backend's loops: the first maximum wins (a later element must be greater), and its r goes to *argmax
// (kReduceMax only; argmax may be null otherwise). Mean multiplies the sum by 1 / reduce.
DTRAIN_HD float ReduceOutput(const float* x, const ReduceDims& s, int64_t o, int32_t* argmax) {
  const int64_t outer = o / s.inner, i = o % s.inner;
  const float* v = x + outer * s.reduce * s.inner + i;
  if (s.kind == kReduceMax) {
    float best = v[0];
    int64_t best_r = 0;
    for (int64_t r = 1; r < s.reduce; ++r) {
      const float e = v[r * s.inner];
      if (e > best) {
        best = e;
        best_r = r;
      }
    }
    *argmax = static_cast<int32_t>(best_r);
    return best;
  }
  float acc = 0.0f;
  for (int64_t r = 0; r < s.reduce; ++r) acc += v[r * s.inner];
  return s.kind == kReduceMean ? acc * (1.0f / static_cast<float>(s.reduce)) : acc;
}

// Two candidates of a parallel max (value, r): whether b replaces a (greater, or equal and earlier: the first
// maximum wins whichever order the partial results meet in).
DTRAIN_HD bool MaxCandidateWins(float b, int64_t rb, float a, int64_t ra) { return b > a || (b == a && rb < ra); }

// dx[i] (i over [outer, reduce, inner]) from dy [outer, inner]: sum: dy; mean: dy / reduce; max: dy at the
// remembered maximum, 0 elsewhere.
DTRAIN_HD float ReduceInputGrad(const float* dy, const int32_t* argmax, const ReduceDims& s, int64_t i) {
  const int64_t inner_i = i % s.inner;
  const int64_t t = i / s.inner;
  const int64_t r = t % s.reduce, outer = t / s.reduce;
  const int64_t o = outer * s.inner + inner_i;
  if (s.kind == kReduceMax) return argmax[o] == r ? dy[o] : 0.0f;
  return s.kind == kReduceMean ? dy[o] * (1.0f / static_cast<float>(s.reduce)) : dy[o];
}

// Softmax along the middle axis of [outer, n, inner]: element j of the column starting at `base` is base[j *
// inner]. Column c (= outer index * inner + inner index) starts at (outer index * n) * inner + inner index.
DTRAIN_HD int64_t SoftmaxColumnStart(int64_t c, int64_t n, int64_t inner) {
  return (c / inner) * n * inner + c % inner;
}
// y from x, the column's maximum m and sum of exp(x - m).
DTRAIN_HD float SoftmaxValue(float x, float m, float sum, bool log) {
  return log ? x - m - logf(sum) : expf(x - m) / sum;
}
// dx from y, dy and the column's s = sum(dy y) (softmax) or sum(dy) (log-softmax).
DTRAIN_HD float SoftmaxGrad(float y, float dy, float s, bool log) { return log ? dy - expf(y) * s : y * (dy - s); }
// What the backward's column sum adds for one element.
DTRAIN_HD float SoftmaxGradTerm(float y, float dy, bool log) { return log ? dy : dy * y; }

// One column by one thread, in three (forward) or two (backward) passes; dx may alias dy (each element is read
// before it is written, by the same thread).
DTRAIN_HD void SoftmaxColumnForward(const float* x, float* y, int64_t n, int64_t inner, bool log) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = fmaxf(m, x[j * inner]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += expf(x[j * inner] - m);
  for (int64_t j = 0; j < n; ++j) y[j * inner] = SoftmaxValue(x[j * inner], m, sum, log);
}
DTRAIN_HD void SoftmaxColumnBackward(const float* y, const float* dy, float* dx, int64_t n, int64_t inner,
                                     bool log) {
  float s = 0.0f;
  for (int64_t j = 0; j < n; ++j) s += SoftmaxGradTerm(y[j * inner], dy[j * inner], log);
  for (int64_t j = 0; j < n; ++j) dx[j * inner] = SoftmaxGrad(y[j * inner], dy[j * inner], s, log);
}

// Layer normalization of rows of `cols` floats. xhat = (x - mean) * inv_std, inv_std = 1 / sqrt(var + epsilon).
DTRAIN_HD float LayerNormValue(float x, float mean, float inv_std, float scale, float bias) {
  return (x - mean) * inv_std * scale + bias;
}
// dx = inv_std (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy scale; m1, m2 are those two means.
DTRAIN_HD float LayerNormInputGrad(float x, float dy, float scale, float mean, float inv_std, float m1, float m2) {
  const float xhat = (x - mean) * inv_std;
  return inv_std * (dy * scale - m1 - xhat * m2);
}
// The parameters' gradients as column reductions over the rows (ColumnShape: channels = cols, rows = rows):
// thread t (c = t % cols, chunk = t / cols) sums dy and dy xhat over its chunk of rows, in double.
DTRAIN_HD void LayerNormParamGradPartial(const float* x, const float* dy, const float* mean, const float* var,
                                         float epsilon, const ColumnShape& s, int64_t t, double* sum_dy,
                                         double* sum_dy_xhat) {
  const int c = static_cast<int>(t % s.channels);
  const int64_t begin = (t / s.channels) * s.chunk_len, end = MinI64(begin + s.chunk_len, s.rows);
  double a = 0.0, b = 0.0;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t i = r * s.channels + c;
    const double g = dy[i];
    a += g;
    b += g * static_cast<double>((x[i] - mean[r]) * BatchNormInvStd(var[r], epsilon));
  }
  *sum_dy = a;
  *sum_dy_xhat = b;
}
// Column c: dscale = sum dy xhat, dbias = sum dy (dbias may be null: no bias), the chunks added in order.
DTRAIN_HD void LayerNormParamGradFinal(const double* sum_dy, const double* sum_dy_xhat, const ColumnShape& s, int c,
                                       float* dscale, float* dbias) {
  double a = 0.0, b = 0.0;
  for (int64_t k = 0; k < s.chunks; ++k) {
    a += sum_dy[k * s.channels + c];
    b += sum_dy_xhat[k * s.channels + c];
  }
  dscale[c] = static_cast<float>(b);
  if (dbias != nullptr) dbias[c] = static_cast<float>(a);
}

// A row-major product C[M, N] = op(X)[M, K] op(Z)[K, N] (X stored [M, K], or [K, M] when trans_x; Z stored
// [K, N], or [N, K] when trans_z; C dense), batched with dense strides, as the column-major GEMM cuBLAS
// computes: a row-major [r, c] matrix is the column-major [c, r] one, so C^T[N, M] = op(Z)^T op(X)^T, i.e.
// cublasSgemmStridedBatched(op_first, op_second, m, n, k, first (ld_first, stride_first), second (ld_second,
// stride_second), C (ldc, stride_c)) with first = Z and second = X.
struct GemmPlan {
  bool trans_first, trans_second;  // CUBLAS_OP_T when true
  int64_t m, n, k;                 // cuBLAS's (column-major) sizes
  int64_t ld_first, ld_second, ldc;
  int64_t stride_first, stride_second, stride_c;
};
DTRAIN_HD GemmPlan PlanRowMajorGemm(int64_t M, int64_t N, int64_t K, bool trans_x, bool trans_z) {
  GemmPlan g;
  g.trans_first = trans_z;   // Z stored [K, N] is column-major [N, K] = op(Z)^T already
  g.trans_second = trans_x;  // X stored [M, K] is column-major [K, M] = op(X)^T already
  g.m = N;
  g.n = M;
  g.k = K;
  g.ld_first = trans_z ? K : N;
  g.ld_second = trans_x ? M : K;
  g.ldc = N;
  g.stride_first = K * N;
  g.stride_second = M * K;
  g.stride_c = M * N;
  return g;
}

// The three GEMMs of a batched MatMul (MatMulParams: y = op(a) op(b), op(a) [m, k], op(b) [k, n]) and which of
// the pass's operands is cuBLAS's first and second matrix. Forward: y = op(a) op(b). BackwardA: da = dy op(b)^T
// in a's layout (trans_a: da^T = op(b) dy^T). BackwardB: db = op(a)^T dy in b's layout (trans_b: db^T = dy^T
// op(a)).
enum MatMulPass : int { kMatMulForward = 0, kMatMulBackwardA = 1, kMatMulBackwardB = 2 };
enum MatMulOperand : int { kOperandA = 0, kOperandB = 1, kOperandDy = 2 };
struct MatMulGemm {
  GemmPlan plan;
  int first, second;  // MatMulOperand
};
// Row-major C[M, N] = op(X) op(Z) with operands x and z: cuBLAS's first matrix is Z, its second X.
DTRAIN_HD MatMulGemm MakeMatMulGemm(int64_t M, int64_t N, int64_t K, int x, bool tx, int z, bool tz) {
  return MatMulGemm{PlanRowMajorGemm(M, N, K, tx, tz), z, x};
}
DTRAIN_HD MatMulGemm PlanMatMul(int pass, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b) {
  if (pass == kMatMulForward) return MakeMatMulGemm(m, n, k, kOperandA, trans_a, kOperandB, trans_b);
  if (pass == kMatMulBackwardA) {
    // op(b)^T [n, k] is b read transposed unless trans_b; dy^T [n, m] is dy read transposed.
    return trans_a ? MakeMatMulGemm(k, m, n, kOperandB, trans_b, kOperandDy, true)
                   : MakeMatMulGemm(m, k, n, kOperandDy, false, kOperandB, !trans_b);
  }
  // op(a)^T [k, m] is a read transposed unless trans_a; dy^T [n, m] likewise.
  return trans_b ? MakeMatMulGemm(n, k, m, kOperandDy, true, kOperandA, trans_a)
                 : MakeMatMulGemm(k, n, m, kOperandA, !trans_a, kOperandDy, false);
}

}  // namespace dtrain::kernels::cuda

#endif  // DTRAIN_KERNELS_CUDA_OP_MATH_H_
