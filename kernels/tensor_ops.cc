#include "kernels/tensor_ops.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain::kernels {

int64_t StridedCopyParams::count() const {
  int64_t n = 1;
  for (int k = 0; k < rank; ++k) n *= dims[k];
  return n;
}

namespace {

int64_t Span(const StridedCopyParams& p, const int64_t* strides) {
  if (p.count() == 0) return 0;
  int64_t last = 0;
  for (int k = 0; k < p.rank; ++k) last += (p.dims[k] - 1) * strides[k];
  return last + 1;
}

const char* KindName(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum: return "sum";
    case ReduceKind::kMean: return "mean";
    case ReduceKind::kMax: return "max";
  }
  return "?";
}

}  // namespace

int64_t StridedCopyParams::src_span() const { return Span(*this, src_strides); }
int64_t StridedCopyParams::dst_span() const { return Span(*this, dst_strides); }

std::string Describe(const StridedCopyParams& p) {
  std::vector<int64_t> d(p.dims, p.dims + std::clamp(p.rank, 0, kMaxCopyRank));
  std::vector<int64_t> s(p.src_strides, p.src_strides + d.size()), t(p.dst_strides, p.dst_strides + d.size());
  return absl::StrCat("strided_copy[dims ", absl::StrJoin(d, "x"), " src strides ", absl::StrJoin(s, ","),
                      " dst strides ", absl::StrJoin(t, ","), "]");
}

absl::Status CheckStridedCopyParams(const char* op, const StridedCopyParams& p) {
  if (p.rank < 1 || p.rank > kMaxCopyRank) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": rank ", p.rank, " is outside [1, ", kMaxCopyRank, "]"));
  }
  for (int k = 0; k < p.rank; ++k) {
    if (p.dims[k] < 0 || p.src_strides[k] < 0 || p.dst_strides[k] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": negative size or stride in ", Describe(p)));
    }
  }
  if (p.count() == 0) return absl::OkStatus();
  // The destination's dims > 1, by increasing stride, must nest: each stride at least the extent of the
  // smaller ones, so that no two indices reach one element.
  std::vector<int> order;
  for (int k = 0; k < p.rank; ++k) {
    if (p.dims[k] > 1) order.push_back(k);
  }
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p.dst_strides[a] < p.dst_strides[b]; });
  int64_t extent = 1;
  for (int k : order) {
    if (p.dst_strides[k] < extent) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": the destination strides reach an element twice in ", Describe(p)));
    }
    extent = p.dst_strides[k] * (p.dims[k] - 1) + extent;
  }
  return absl::OkStatus();
}

StridedCopyParams SimplifyStridedCopy(const StridedCopyParams& p) {
  StridedCopyParams s;
  s.rank = 0;
  for (int k = 0; k < p.rank; ++k) {
    if (p.dims[k] == 1) continue;
    if (s.rank > 0 && s.src_strides[s.rank - 1] == p.src_strides[k] * p.dims[k] &&
        s.dst_strides[s.rank - 1] == p.dst_strides[k] * p.dims[k]) {
      s.dims[s.rank - 1] *= p.dims[k];
      s.src_strides[s.rank - 1] = p.src_strides[k];
      s.dst_strides[s.rank - 1] = p.dst_strides[k];
      continue;
    }
    s.dims[s.rank] = p.dims[k];
    s.src_strides[s.rank] = p.src_strides[k];
    s.dst_strides[s.rank] = p.dst_strides[k];
    ++s.rank;
  }
  if (s.rank == 0) {
    s.rank = 1;
    s.dims[0] = p.count() == 0 ? 0 : 1;
    s.src_strides[0] = 0;
    s.dst_strides[0] = 1;
  }
  return s;
}

std::string Describe(const ReduceParams& p) {
  return absl::StrCat("reduce[", KindName(p.kind), " ", p.outer, "x", p.reduce, "x", p.inner, "]");
}
std::string Describe(const SoftmaxParams& p) {
  return absl::StrCat(p.log ? "log_softmax[" : "softmax[", p.outer, "x", p.n, "x", p.inner, "]");
}
std::string Describe(const LayerNormParams& p) {
  return absl::StrCat("layer_norm[", p.rows, "x", p.cols, " epsilon=", p.epsilon, p.has_bias ? "" : " no_bias", "]");
}
std::string Describe(const MatMulParams& p) {
  return absl::StrCat("matmul[batch=", p.batch, " m=", p.m, " n=", p.n, " k=", p.k, p.trans_a ? " trans_a" : "",
                      p.trans_b ? " trans_b" : "", "]");
}

absl::Status CheckReduceParams(const char* op, const ReduceParams& p) {
  if (p.outer < 1 || p.reduce < 1 || p.inner < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": every size must be positive: ", Describe(p)));
  }
  return absl::OkStatus();
}

absl::Status CheckSoftmaxParams(const char* op, const SoftmaxParams& p) {
  if (p.outer < 1 || p.n < 1 || p.inner < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": every size must be positive: ", Describe(p)));
  }
  return absl::OkStatus();
}

absl::Status CheckLayerNormParams(const char* op, const LayerNormParams& p) {
  if (p.rows < 1 || p.cols < 1 || !(p.epsilon >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rows and cols must be positive and epsilon >= 0: ", Describe(p)));
  }
  return absl::OkStatus();
}

absl::Status CheckMatMulParams(const char* op, const MatMulParams& p) {
  if (p.batch < 1 || p.m < 1 || p.n < 1 || p.k < 1) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": every size must be positive: ", Describe(p)));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::kernels
