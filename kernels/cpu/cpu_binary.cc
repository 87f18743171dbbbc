// Broadcasting Add/Sub/Mul/Div (kernels/device.h's Binary) as loops. The shape is simplified once, when the op
// is made: dimensions of size 1 are dropped and neighbours that are contiguous for a, b and y alike are merged,
// so that the common cases become one or two dimensions (same shape: [n] with strides 1/1; an NHWC tensor and a
// per-channel bias: [rows, c] with b's strides 0/1; a scalar: [n] with stride 0). The work is then a sequence
// of segments along the innermost dimension, each a loop specialized for unit and zero strides (vectorized),
// split over the OpenMP threads above kParallelMinElements.
//
// Backward: an input that is not broadcast gets its gradient written elementwise; a broadcast one is reduced:
// each thread sums its share of the output into its own copy of the gradient (the first thread into the
// caller's buffer), and the copies are added at the end (the extra copies are allocated when the op is made).
#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/parallel.h"

namespace dtrain::kernels::cpu {
namespace {

// The simplified shape: y is dense row-major over dims; a and b are addressed by their strides.
struct Layout {
  int rank = 1;
  int64_t dims[kMaxBroadcastRank] = {1};
  int64_t sa[kMaxBroadcastRank] = {0}, sb[kMaxBroadcastRank] = {0};
};

Layout Simplify(const BroadcastParams& p) {
  Layout l;
  int r = 0;
  int64_t sy[kMaxBroadcastRank];
  int64_t y_stride = 1;
  // Innermost first, so that a dimension merges into the one after it.
  int64_t dims[kMaxBroadcastRank], sa[kMaxBroadcastRank], sb[kMaxBroadcastRank];
  for (int d = p.rank - 1; d >= 0; --d) {
    const int64_t n = p.dims[d];
    const int64_t ys = y_stride;
    y_stride *= n;
    if (n == 1) continue;
    if (r > 0 && p.a_strides[d] == sa[r - 1] * dims[r - 1] && p.b_strides[d] == sb[r - 1] * dims[r - 1] &&
        ys == sy[r - 1] * dims[r - 1]) {
      dims[r - 1] *= n;  // merges with the (inner) neighbour; the inner one's strides stay
      continue;
    }
    dims[r] = n, sa[r] = p.a_strides[d], sb[r] = p.b_strides[d], sy[r] = ys;
    ++r;
  }
  if (r == 0) return l;  // a single element
  l.rank = r;
  for (int i = 0; i < r; ++i) {  // back to outermost first
    l.dims[i] = dims[r - 1 - i], l.sa[i] = sa[r - 1 - i], l.sb[i] = sb[r - 1 - i];
  }
  return l;
}

// Calls fn(a offset, b offset, y offset, n) for the innermost-dimension segments covering output elements
// [begin, end) in order.
template <typename Fn>
void ForSegments(const Layout& l, int64_t begin, int64_t end, Fn fn) {
  if (begin >= end) return;
  const int last = l.rank - 1;
  const int64_t inner = l.dims[last];
  int64_t idx[kMaxBroadcastRank];
  int64_t a = 0, b = 0, rest = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rest % l.dims[d];
    rest /= l.dims[d];
    a += idx[d] * l.sa[d];
    b += idx[d] * l.sb[d];
  }
  for (int64_t e = begin; e < end;) {
    const int64_t n = std::min(inner - idx[last], end - e);
    fn(a, b, e, n);
    e += n;
    idx[last] += n;
    a += n * l.sa[last];
    b += n * l.sb[last];
    if (idx[last] < inner) break;  // only the range's end stops inside a row
    a -= inner * l.sa[last];
    b -= inner * l.sb[last];
    idx[last] = 0;
    for (int d = last - 1; d >= 0; --d) {
      a += l.sa[d];
      b += l.sb[d];
      if (++idx[d] < l.dims[d]) break;
      a -= l.dims[d] * l.sa[d];
      b -= l.dims[d] * l.sb[d];
      idx[d] = 0;
    }
  }
}

template <BinaryOp op>
inline float Apply(float a, float b) {
  if constexpr (op == BinaryOp::kAdd) return a + b;
  if constexpr (op == BinaryOp::kSub) return a - b;
  if constexpr (op == BinaryOp::kMul) return a * b;
  return a / b;
}

// y[i] = a[i sa] op b[i sb], i < n, with the unit and zero strides as their own loops (they vectorize). y may
// alias a or b (same offsets).
template <BinaryOp op>
void ForwardSegment(const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = Apply<op>(a[i], b[i]);
  } else if (sa == 1 && sb == 0) {
    const float bv = *b;
    for (int64_t i = 0; i < n; ++i) y[i] = Apply<op>(a[i], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = *a;
    for (int64_t i = 0; i < n; ++i) y[i] = Apply<op>(av, b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = Apply<op>(a[i * sa], b[i * sb]);
  }
}

// dy * d(a op b)/d(a) (kWrtA) or /d(b) for a[ai] and b[bi]. Only Mul and Div read a and b (which may be null
// for Add and Sub: no pointer is formed from them then).
template <BinaryOp op, bool kWrtA>
inline float Grad(float dy, const float* a, int64_t ai, const float* b, int64_t bi) {
  if constexpr (op == BinaryOp::kAdd) {
    return dy;
  } else if constexpr (op == BinaryOp::kSub) {
    return kWrtA ? dy : -dy;
  } else if constexpr (op == BinaryOp::kMul) {
    return kWrtA ? dy * b[bi] : dy * a[ai];
  } else if constexpr (kWrtA) {
    return dy / b[bi];
  } else {
    return -(dy * a[ai]) / (b[bi] * b[bi]);
  }
}

// The gradient of a segment's n output elements (a at ao + i sa, b at bo + i sb, dy[i]) into dx[i sx]: written,
// or added when kAccumulate. sx == 0 (a broadcast innermost dimension) sums the segment first.
template <BinaryOp op, bool kWrtA, bool kAccumulate>
void GradSegment(const float* a, int64_t ao, int64_t sa, const float* b, int64_t bo, int64_t sb, const float* dy,
                 float* dx, int64_t sx, int64_t n) {
  constexpr bool kReadsInputs = op == BinaryOp::kMul || op == BinaryOp::kDiv;
  if (sx == 0) {
    // A sum: vectorized (omp simd) when the strides of the inputs it reads are compile-time 0 or 1.
    auto sum = [&](auto sa_c, auto sb_c) {
      constexpr int64_t kSa = decltype(sa_c)::value, kSb = decltype(sb_c)::value;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t i = 0; i < n; ++i) s += Grad<op, kWrtA>(dy[i], a, ao + i * kSa, b, bo + i * kSb);
      return s;
    };
    using Zero = std::integral_constant<int64_t, 0>;
    using One = std::integral_constant<int64_t, 1>;
    float s = 0;
    if (!kReadsInputs) {
      s = sum(Zero(), Zero());
    } else if (sa == 1 && sb == 0) {
      s = sum(One(), Zero());
    } else if (sa == 0 && sb == 1) {
      s = sum(Zero(), One());
    } else if (sa == 1 && sb == 1) {
      s = sum(One(), One());
    } else {
      for (int64_t i = 0; i < n; ++i) s += Grad<op, kWrtA>(dy[i], a, ao + i * sa, b, bo + i * sb);
    }
    *dx = kAccumulate ? *dx + s : s;
  } else if (sx == 1 && (!kReadsInputs || (sa == 1 && sb == 1))) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = Grad<op, kWrtA>(dy[i], a, ao + i, b, bo + i);
      dx[i] = kAccumulate ? dx[i] + g : g;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float g = Grad<op, kWrtA>(dy[i], a, ao + i * sa, b, bo + i * sb);
      dx[i * sx] = kAccumulate ? dx[i * sx] + g : g;
    }
  }
}

// Whether distinct output elements always read distinct elements of an input with strides s: no zero stride,
// and, taking the dimensions by decreasing stride, each stride steps over everything the smaller ones reach
// (false for overlapping views, which are then reduced like a broadcast).
bool Injective(const Layout& l, const int64_t* s) {
  std::vector<std::pair<int64_t, int64_t>> by_stride;  // (stride, dim)
  for (int d = 0; d < l.rank; ++d) {
    if (l.dims[d] == 1) continue;
    if (s[d] == 0) return false;
    by_stride.emplace_back(s[d], l.dims[d]);
  }
  std::sort(by_stride.begin(), by_stride.end());
  int64_t extent = 1;  // one past the largest offset the smaller strides reach
  for (const auto& [stride, dim] : by_stride) {
    if (stride < extent) return false;
    extent = stride * (dim - 1) + extent;
  }
  return true;
}

class LoopBinary final : public Binary {
 public:
  LoopBinary(const DnnlContext& ctx, const BroadcastParams& p) : ctx_(ctx), p_(p), l_(Simplify(p)) {
    n_ = p.out_size();
    parallel_ = ctx.threads > 1 && n_ >= kParallelMinElements;
    for (int x = 0; x < 2; ++x) {
      const int64_t* s = x == 0 ? l_.sa : l_.sb;
      input_[x].size = x == 0 ? p.a_size() : p.b_size();
      input_[x].broadcast = !Injective(l_, s);
      // Without sharing, the output reads out_size distinct elements: all of them, or there are gaps.
      input_[x].dense = !input_[x].broadcast && n_ == input_[x].size;
    }
    if (parallel_) {
      const int64_t most = std::max(input_[0].broadcast ? input_[0].size : 0, input_[1].broadcast ? input_[1].size : 0);
      partials_.resize(static_cast<size_t>(ctx.threads - 1) * most);
    }
  }

  absl::Status Forward(const float* a, const float* b, float* y) override {
    switch (p_.op) {
      case BinaryOp::kAdd:
        return Run<BinaryOp::kAdd>(a, b, y);
      case BinaryOp::kSub:
        return Run<BinaryOp::kSub>(a, b, y);
      case BinaryOp::kMul:
        return Run<BinaryOp::kMul>(a, b, y);
      case BinaryOp::kDiv:
        return Run<BinaryOp::kDiv>(a, b, y);
    }
    return absl::InternalError("Binary: unknown op");
  }

  absl::Status Backward(const float* a, const float* b, const float* dy, float* da, float* db) override {
    switch (p_.op) {
      case BinaryOp::kAdd:
        return RunBackward<BinaryOp::kAdd>(a, b, dy, da, db);
      case BinaryOp::kSub:
        return RunBackward<BinaryOp::kSub>(a, b, dy, da, db);
      case BinaryOp::kMul:
        return RunBackward<BinaryOp::kMul>(a, b, dy, da, db);
      case BinaryOp::kDiv:
        return RunBackward<BinaryOp::kDiv>(a, b, dy, da, db);
    }
    return absl::InternalError("Binary: unknown op");
  }

 private:
  struct Input {
    int64_t size = 0;        // a_size() / b_size()
    bool broadcast = false;  // some output elements share an element of it (a zero stride or an overlap)
    bool dense = false;      // the output reads every element of it, each once
  };

  template <BinaryOp op>
  absl::Status Run(const float* a, const float* b, float* y) {
    const int last = l_.rank - 1;
    ForChunks(n_, parallel_ ? ctx_.threads : 1, kParallelMinElements, [&](int64_t begin, int64_t end) {
      ForSegments(l_, begin, end, [&](int64_t ao, int64_t bo, int64_t yo, int64_t n) {
        ForwardSegment<op>(a + ao, l_.sa[last], b + bo, l_.sb[last], y + yo, n);
      });
    });
    return absl::OkStatus();
  }

  template <BinaryOp op>
  absl::Status RunBackward(const float* a, const float* b, const float* dy, float* da, float* db) {
    if (da != nullptr) Reduce<op, true>(a, b, dy, da);
    if (db != nullptr) Reduce<op, false>(a, b, dy, db);
    return absl::OkStatus();
  }

  template <BinaryOp op, bool kWrtA>
  void Reduce(const float* a, const float* b, const float* dy, float* dx) {
    const Input& in = input_[kWrtA ? 0 : 1];
    const int last = l_.rank - 1;
    const int64_t sa = l_.sa[last], sb = l_.sb[last], sx = kWrtA ? sa : sb;
    const int threads = parallel_ ? ctx_.threads : 1;
    if (!in.broadcast) {
      if (!in.dense) FillLoop(0.0f, dx, in.size, threads);  // elements no output reads get 0
      ForChunks(n_, threads, kParallelMinElements, [&](int64_t begin, int64_t end) {
        ForSegments(l_, begin, end, [&](int64_t ao, int64_t bo, int64_t yo, int64_t n) {
          GradSegment<op, kWrtA, false>(a, ao, sa, b, bo, sb, dy + yo, dx + (kWrtA ? ao : bo), sx, n);
        });
      });
      return;
    }
    // Thread t sums its share into dx (t = 0) or into its partial copy; the copies are then added into dx.
    bool filled[kMaxThreads] = {};
    std::fill(dx, dx + in.size, 0.0f);
    ForChunks(n_, threads, kParallelMinElements, [&](int64_t begin, int64_t end) {
      const int t = omp_get_thread_num();
      float* target = dx;
      if (t > 0) {
        target = partials_.data() + static_cast<size_t>(t - 1) * in.size;
        std::fill(target, target + in.size, 0.0f);
        filled[t] = true;
      }
      ForSegments(l_, begin, end, [&](int64_t ao, int64_t bo, int64_t yo, int64_t n) {
        GradSegment<op, kWrtA, true>(a, ao, sa, b, bo, sb, dy + yo, target + (kWrtA ? ao : bo), sx, n);
      });
    });
    if (threads <= 1) return;
    ForChunks(in.size, threads, kParallelMinElements, [&](int64_t begin, int64_t end) {
      for (int t = 1; t < threads && t < kMaxThreads; ++t) {
        if (!filled[t]) continue;
        const float* __restrict part = partials_.data() + static_cast<size_t>(t - 1) * in.size;
        for (int64_t i = begin; i < end; ++i) dx[i] += part[i];
      }
    });
  }

  DnnlContext ctx_;
  BroadcastParams p_;
  Layout l_;
  int64_t n_ = 0;
  bool parallel_ = false;
  Input input_[2];
  std::vector<float> partials_;  // (threads - 1) copies of the larger broadcast input's gradient
};

const char* OpName(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return "add";
    case BinaryOp::kSub:
      return "sub";
    case BinaryOp::kMul:
      return "mul";
    case BinaryOp::kDiv:
      return "div";
  }
  return "?";
}

}  // namespace

std::string Describe(const BroadcastParams& p) {
  std::string dims, sa, sb;
  for (int d = 0; d < p.rank && d < kMaxBroadcastRank; ++d) {
    const char* sep = d == 0 ? "" : ",";
    absl::StrAppend(&dims, sep, p.dims[d]);
    absl::StrAppend(&sa, sep, p.a_strides[d]);
    absl::StrAppend(&sb, sep, p.b_strides[d]);
  }
  return absl::StrCat("binary[", OpName(p.op), " dims={", dims, "} a_strides={", sa, "} b_strides={", sb, "}]");
}

absl::StatusOr<std::unique_ptr<Binary>> MakeCpuBinary(const DnnlContext& ctx, const BroadcastParams& p) {
  if (p.rank < 1 || p.rank > kMaxBroadcastRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeBinary: rank must be in [1, ", kMaxBroadcastRank, "], got ", p.rank));
  }
  if (static_cast<int>(p.op) < 0 || static_cast<int>(p.op) > static_cast<int>(BinaryOp::kDiv)) {
    return absl::InvalidArgumentError("MakeBinary: unknown op");
  }
  for (int d = 0; d < p.rank; ++d) {
    if (p.dims[d] < 1 || p.a_strides[d] < 0 || p.b_strides[d] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MakeBinary: dims must be positive and strides non-negative: ", Describe(p)));
    }
  }
  return std::unique_ptr<Binary>(std::make_unique<LoopBinary>(ctx, p));
}

}  // namespace dtrain::kernels::cpu
