#include "kernels/cuda/kernel_shapes.h"

#include <algorithm>
#include <climits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dtrain::kernels::cuda {

// The device math's copies of the interface's constants (op_math.h cannot include device.h): kept in step here.
static_assert(kMaxRank == kMaxBroadcastRank, "op_math.h kMaxRank");
static_assert(kBinAdd == static_cast<int>(BinaryOp::kAdd) && kBinSub == static_cast<int>(BinaryOp::kSub) &&
                  kBinMul == static_cast<int>(BinaryOp::kMul) && kBinDiv == static_cast<int>(BinaryOp::kDiv),
              "op_math.h BinaryKind follows BinaryOp's order");

absl::StatusOr<PoolShape> MakePoolShape(const PoolParams& p, absl::string_view op) {
  if (p.batch <= 0 || p.in_h <= 0 || p.in_w <= 0 || p.channels <= 0 || p.kh() <= 0 || p.kw() <= 0 ||
      p.sh() <= 0 || p.sw() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": sizes must be positive, got batch=", p.batch, " in=",
                                                   p.in_h, "x", p.in_w, "x", p.channels, " window=", p.kh(), "x",
                                                   p.kw(), " stride=", p.sh(), "x", p.sw()));
  }
  // As the CPU (CheckPoolParams): pads smaller than the window keep a real input in every window.
  if (p.explicit_padding && (p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 || p.pad_right < 0 ||
                             p.pad_top >= p.kh() || p.pad_bottom >= p.kh() || p.pad_left >= p.kw() ||
                             p.pad_right >= p.kw())) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": explicit pads must be in [0, window) on each side, got top=",
                                                   p.pad_top, " bottom=", p.pad_bottom, " left=", p.pad_left,
                                                   " right=", p.pad_right, " for a ", p.kh(), "x", p.kw(),
                                                   " window"));
  }
  if (p.out_h() <= 0 || p.out_w() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": the ", p.kh(), "x", p.kw(),
                                                   " window does not fit the padded ", p.in_h, "x", p.in_w,
                                                   " input"));
  }
  const int64_t in_elems = int64_t{p.batch} * p.in_h * p.in_w * p.channels;
  const int64_t out_elems = int64_t{p.batch} * p.out_h() * p.out_w() * p.channels;
  if (in_elems > INT_MAX || out_elems > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": tensors over 2^31 elements are not supported"));
  }
  const Pads ph = p.pads_h(), pw = p.pads_w();
  PoolShape s{};
  s.batch = p.batch;
  s.in_h = p.in_h;
  s.in_w = p.in_w;
  s.channels = p.channels;
  s.out_h = p.out_h();
  s.out_w = p.out_w();
  s.window_h = p.kh();
  s.window_w = p.kw();
  s.stride_h = p.sh();
  s.stride_w = p.sw();
  s.pad_top = ph.before;
  s.pad_left = pw.before;
  s.pad_bottom = ph.after;
  s.pad_right = pw.after;
  s.count_include_pad = p.count_include_pad ? 1 : 0;
  return s;
}

bool NeedsExplicitPadding(const Conv2DParams& p) {
  const int span_h = p.in_h + 2 * p.pads_h().before - p.dilated_k_h();
  const int span_w = p.in_w + 2 * p.pads_w().before - p.dilated_k_w();
  return span_h < 0 || span_w < 0 || span_h / p.stride_h + 1 != p.out_h() || span_w / p.stride_w + 1 != p.out_w();
}

absl::StatusOr<BroadcastShape> MakeBroadcastShape(const BroadcastParams& p) {
  if (p.rank < 1 || p.rank > kMaxBroadcastRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeBinary: rank must be in [1, ", kMaxBroadcastRank, "], got ", p.rank));
  }
  for (int d = 0; d < p.rank; ++d) {
    if (p.dims[d] < 1 || p.a_strides[d] < 0 || p.b_strides[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("MakeBinary: dimension ", d, " has size ", p.dims[d],
                                                     " and strides a=", p.a_strides[d], " b=", p.b_strides[d],
                                                     " (sizes must be >= 1, strides >= 0)"));
    }
  }
  // Innermost first, without size-1 dimensions; an outer dimension merges into the one inside it when both
  // inputs step over it as over one longer dimension (the output is dense, so it always does).
  struct Dim {
    int64_t size, a, b;
  };
  std::vector<Dim> inner_first;
  for (int d = p.rank - 1; d >= 0; --d) {
    if (p.dims[d] == 1) continue;
    const Dim dim{p.dims[d], p.a_strides[d], p.b_strides[d]};
    if (!inner_first.empty()) {
      Dim& in = inner_first.back();
      if (dim.a == in.a * in.size && dim.b == in.b * in.size) {
        in.size *= dim.size;
        continue;
      }
    }
    inner_first.push_back(dim);
  }
  if (inner_first.empty()) inner_first.push_back({1, 0, 0});
  BroadcastShape s{};
  s.rank = static_cast<int>(inner_first.size());
  for (int d = 0; d < s.rank; ++d) {
    const Dim& dim = inner_first[s.rank - 1 - d];
    s.dims[d] = dim.size;
    s.a_strides[d] = dim.a;
    s.b_strides[d] = dim.b;
  }
  return s;
}

ReduceShape MakeReduceShape(const BroadcastShape& s, int which) {
  ReduceShape r{};
  r.which = which;
  int64_t out_stride[kMaxRank];
  int64_t stride = 1;
  for (int d = s.rank - 1; d >= 0; --d) {
    out_stride[d] = stride;
    stride *= s.dims[d];
  }
  r.kept_count = 1;
  r.reduced_count = 1;
  for (int d = 0; d < s.rank; ++d) {
    const int64_t own = which == 0 ? s.a_strides[d] : s.b_strides[d];
    if (own != 0) {
      const int k = r.kept_rank++;
      r.kept_dims[k] = s.dims[d];
      r.kept_out[k] = out_stride[d];
      r.kept_a[k] = s.a_strides[d];
      r.kept_b[k] = s.b_strides[d];
      r.kept_count *= s.dims[d];
    } else {
      const int k = r.reduced_rank++;
      r.reduced_dims[k] = s.dims[d];
      r.reduced_out[k] = out_stride[d];
      r.reduced_a[k] = s.a_strides[d];
      r.reduced_b[k] = s.b_strides[d];
      r.reduced_count *= s.dims[d];
    }
  }
  const ChunkSplit split = SplitReduction(r.kept_count, r.reduced_count);
  r.chunks = split.chunks;
  r.chunk_len = split.chunk_len;
  return r;
}

bool ReduceTargetsAreDistinct(const ReduceShape& r) {
  // Sorted by stride, each stride must step past everything the smaller ones reach.
  std::vector<std::pair<int64_t, int64_t>> stride_size;
  for (int k = 0; k < r.kept_rank; ++k) {
    stride_size.emplace_back(r.which == 0 ? r.kept_a[k] : r.kept_b[k], r.kept_dims[k]);
  }
  std::sort(stride_size.begin(), stride_size.end());
  int64_t reach = 0;  // largest offset the smaller strides reach
  for (const auto& [stride, size] : stride_size) {
    if (stride <= reach) return false;
    reach += (size - 1) * stride;
  }
  return true;
}

CopyShape MakeCopyShape(const StridedCopyParams& p) {
  const StridedCopyParams q = SimplifyStridedCopy(p);
  CopyShape s{};
  s.rank = q.rank;
  for (int k = 0; k < q.rank; ++k) {
    s.dims[k] = q.dims[k];
    s.src_strides[k] = q.src_strides[k];
    s.dst_strides[k] = q.dst_strides[k];
  }
  return s;
}

}  // namespace dtrain::kernels::cuda
