#include "kernels/cpu/tensor_loops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/parallel.h"

namespace dtrain::kernels::cpu {
namespace {

// The dims a copy loop walks outside the one or two it handles itself, as an odometer over flat indices.
struct Outer {
  int rank = 0;
  int64_t dims[kMaxCopyRank];
  int64_t src[kMaxCopyRank];
  int64_t dst[kMaxCopyRank];
  int64_t count = 1;

  void Add(int64_t d, int64_t s, int64_t t) {
    dims[rank] = d;
    src[rank] = s;
    dst[rank] = t;
    ++rank;
    count *= d;
  }
  // Calls fn(src_offset, dst_offset) for the flat outer indices [b, e), in order.
  template <typename Fn>
  void ForRange(int64_t b, int64_t e, Fn fn) const {
    if (b >= e) return;
    int64_t idx[kMaxCopyRank];
    int64_t so = 0, dof = 0, rest = b;
    for (int k = rank - 1; k >= 0; --k) {
      idx[k] = rest % dims[k];
      rest /= dims[k];
      so += idx[k] * src[k];
      dof += idx[k] * dst[k];
    }
    for (int64_t f = b; f < e; ++f) {
      fn(so, dof);
      for (int k = rank - 1; k >= 0; --k) {
        so += src[k];
        dof += dst[k];
        if (++idx[k] < dims[k]) break;
        so -= src[k] * dims[k];
        dof -= dst[k] * dims[k];
        idx[k] = 0;
      }
    }
  }
};

// Rows of at least this many floats per chunk of outer work.
int64_t MinOuter(int64_t work_per_outer) {
  return std::max<int64_t>(1, kParallelMinElements / std::max<int64_t>(work_per_outer, 1));
}

}  // namespace

void StridedCopyLoop(const StridedCopyParams& params, const float* src, float* dst, bool accumulate, int threads) {
  const StridedCopyParams p = SimplifyStridedCopy(params);
  if (p.count() == 0) return;
  const int last = p.rank - 1;
  const int64_t n = p.dims[last], ss = p.src_strides[last], ds = p.dst_strides[last];
  // A dim other than the last that is contiguous in the source while the last is contiguous in the destination
  // (or the other way round): a transposition, done by tiles.
  int t = -1;
  if (ds == 1 && ss != 1) {
    for (int k = 0; k < last; ++k) {
      if (p.src_strides[k] == 1) t = k;
    }
  } else if (ss == 1 && ds != 1) {
    for (int k = 0; k < last; ++k) {
      if (p.dst_strides[k] == 1) t = k;
    }
  }
  Outer outer;
  for (int k = 0; k < last; ++k) {
    if (k != t) outer.Add(p.dims[k], p.src_strides[k], p.dst_strides[k]);
  }
  if (t >= 0) {
    // Tiles of the (t, last) plane: 32 x 32 elements whose reads and writes each touch 32 cache lines.
    constexpr int64_t kTile = 32;
    const int64_t m = p.dims[t], ms = p.src_strides[t], md = p.dst_strides[t];
    const int64_t mt = (m + kTile - 1) / kTile, nt = (n + kTile - 1) / kTile;
    const int64_t tiles = outer.count * mt * nt;
    ForChunks(
        tiles, threads, std::max<int64_t>(1, kParallelMinElements / (kTile * kTile)),
        [&](int64_t b, int64_t e) {
          for (int64_t tile = b; tile < e; ++tile) {
            const int64_t o = tile / (mt * nt), ti = tile / nt % mt, tj = tile % nt;
            outer.ForRange(o, o + 1, [&](int64_t so, int64_t dof) {
              const int64_t i1 = std::min(m, (ti + 1) * kTile), j1 = std::min(n, (tj + 1) * kTile);
              for (int64_t i = ti * kTile; i < i1; ++i) {
                const float* __restrict s = src + so + i * ms;
                float* __restrict d = dst + dof + i * md;
                if (accumulate) {
                  for (int64_t j = tj * kTile; j < j1; ++j) d[j * ds] += s[j * ss];
                } else {
                  for (int64_t j = tj * kTile; j < j1; ++j) d[j * ds] = s[j * ss];
                }
              }
            });
          }
        },
        /*align=*/1);
    return;
  }
  ForChunks(
      outer.count, threads, MinOuter(n),
      [&](int64_t b, int64_t e) {
        outer.ForRange(b, e, [&](int64_t so, int64_t dof) {
          const float* __restrict s = src + so;
          float* __restrict d = dst + dof;
          if (ss == 1 && ds == 1) {
            if (accumulate) {
              for (int64_t j = 0; j < n; ++j) d[j] += s[j];
            } else {
              std::memcpy(d, s, sizeof(float) * n);
            }
          } else if (ss == 0 && ds == 1) {
            const float v = *s;
            if (accumulate) {
              for (int64_t j = 0; j < n; ++j) d[j] += v;
            } else {
              std::fill(d, d + n, v);
            }
          } else if (accumulate) {
            for (int64_t j = 0; j < n; ++j) d[j * ds] += s[j * ss];
          } else {
            for (int64_t j = 0; j < n; ++j) d[j * ds] = s[j * ss];
          }
        });
      },
      /*align=*/1);
}

void ReduceLoop(const ReduceParams& p, const float* x, float* y, int32_t* argmax, int threads) {
  const int64_t R = p.reduce, I = p.inner;
  const float scale = p.kind == ReduceKind::kMean ? 1.0f / static_cast<float>(R) : 1.0f;
  if (I == 1) {
    // Each output is a contiguous run of R floats.
    ForChunks(
        p.outer, threads, MinOuter(R),
        [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o) {
            const float* __restrict v = x + o * R;
            if (p.kind == ReduceKind::kMax) {
              int64_t best = 0;
              for (int64_t r = 1; r < R; ++r) {
                if (v[r] > v[best]) best = r;
              }
              y[o] = v[best];
              argmax[o] = static_cast<int32_t>(best);
              continue;
            }
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int64_t r = 0; r < R; ++r) s += v[r];
            y[o] = s * scale;
          }
        },
        /*align=*/1);
    return;
  }
  // Rows of I contiguous floats, combined elementwise.
  ForChunks(
      p.outer, threads, MinOuter(R * I),
      [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const float* __restrict v = x + o * R * I;
          float* __restrict out = y + o * I;
          std::memcpy(out, v, sizeof(float) * I);
          if (p.kind == ReduceKind::kMax) {
            int32_t* __restrict arg = argmax + o * I;
            std::fill(arg, arg + I, 0);
            for (int64_t r = 1; r < R; ++r) {
              const float* __restrict row = v + r * I;
              for (int64_t i = 0; i < I; ++i) {
                const bool more = row[i] > out[i];
                out[i] = more ? row[i] : out[i];
                arg[i] = more ? static_cast<int32_t>(r) : arg[i];
              }
            }
            continue;
          }
          for (int64_t r = 1; r < R; ++r) {
            const float* __restrict row = v + r * I;
            for (int64_t i = 0; i < I; ++i) out[i] += row[i];
          }
          if (scale != 1.0f) {
            for (int64_t i = 0; i < I; ++i) out[i] *= scale;
          }
        }
      },
      /*align=*/1);
}

void ReduceBackwardLoop(const ReduceParams& p, const float* dy, const int32_t* argmax, float* dx, int threads) {
  const int64_t R = p.reduce, I = p.inner;
  const float scale = p.kind == ReduceKind::kMean ? 1.0f / static_cast<float>(R) : 1.0f;
  ForChunks(
      p.outer, threads, MinOuter(R * I),
      [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          float* __restrict g = dx + o * R * I;
          const float* __restrict d = dy + o * I;
          if (p.kind == ReduceKind::kMax) {
            std::fill(g, g + R * I, 0.0f);
            const int32_t* arg = argmax + o * I;
            for (int64_t i = 0; i < I; ++i) g[arg[i] * I + i] = d[i];
            continue;
          }
          for (int64_t r = 0; r < R; ++r) {
            float* __restrict row = g + r * I;
            for (int64_t i = 0; i < I; ++i) row[i] = d[i] * scale;
          }
        }
      },
      /*align=*/1);
}

}  // namespace dtrain::kernels::cpu
