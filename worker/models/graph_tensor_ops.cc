// GraphBuilder's shape inference for the tensor ops of imported graphs (graph.h: kTranspose ... kVariable).
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/graph.h"

namespace dtrain::models {
namespace {

// The per-example dims and batch axis of full symbolic dims (TensorShape::kBatchDim marks the batch).
TensorShape FromSymbolic(const std::vector<int64_t>& full) {
  TensorShape s;
  s.batch_axis = TensorShape::kNoBatch;
  s.plain = true;
  for (size_t k = 0; k < full.size(); ++k) {
    if (full[k] == TensorShape::kBatchDim) {
      s.batch_axis = static_cast<int>(k);
    } else {
      s.dims.push_back(full[k]);
    }
  }
  return s;
}

std::string AxesText(const std::vector<int>& v) { return absl::StrCat("[", absl::StrJoin(v, ","), "]"); }

}  // namespace

absl::Status GraphBuilder::InferTensorOp(Node& node, const std::vector<VariableInfo>& vars, TensorShape* out) const {
  const std::vector<int>& inputs = node.inputs;
  auto expect = [&](size_t n_inputs, size_t lo_vars, size_t hi_vars) -> absl::Status {
    if (inputs.size() != n_inputs || vars.size() < lo_vars || vars.size() > hi_vars) {
      return Error(node, absl::StrCat("takes ", n_inputs, " input tensor(s) and ", lo_vars,
                                      hi_vars > lo_vars ? absl::StrCat("-", hi_vars) : "", " variable(s), got ",
                                      inputs.size(), " and ", vars.size()));
    }
    return absl::OkStatus();
  };
  auto not_image = [&](int t) -> absl::Status {
    if (graph_.tensors[t].is_image()) {
      return Error(node, absl::StrCat("reads the image '", graph_.tensor_names[t],
                                      "' (C x H x W stored NHWC); supported: tensors stored in their logical order"));
    }
    return absl::OkStatus();
  };
  switch (node.op) {
    case Op::kTranspose: {
      RETURN_IF_ERROR(expect(1, 0, 0));
      const TensorShape& x = graph_.tensors[inputs[0]];
      const std::vector<int64_t> full = x.SymbolicDims();
      std::vector<int> sorted = node.perm;
      std::sort(sorted.begin(), sorted.end());
      bool permutation = sorted.size() == full.size();
      for (size_t k = 0; permutation && k < sorted.size(); ++k) permutation = sorted[k] == static_cast<int>(k);
      if (!permutation) {
        return Error(node, absl::StrCat("perm ", AxesText(node.perm), " is not a permutation of the ", full.size(),
                                        " axes of ", x.ToString()));
      }
      std::vector<int64_t> y;
      for (int k : node.perm) y.push_back(full[k]);
      *out = FromSymbolic(y);
      // An image result when that is the input's storage as it is (NHWC <-> a plain (N, H, W, C)): a view.
      if (out->dims.size() == 3 && out->batch_axis == 0) {
        TensorShape image = *out;
        image.plain = false;
        bool view = true;
        for (int64_t batch : {2, 3}) {
          const std::vector<int64_t> xs = x.Strides(batch), is = image.Strides(batch);
          for (size_t k = 0; k < node.perm.size(); ++k) view = view && xs[node.perm[k]] == is[k];
        }
        if (view) *out = image;
      }
      return absl::OkStatus();
    }
    case Op::kMatMul: {
      RETURN_IF_ERROR(expect(2, 0, 0));
      RETURN_IF_ERROR(not_image(inputs[0]));
      RETURN_IF_ERROR(not_image(inputs[1]));
      const TensorShape& ta = graph_.tensors[inputs[0]];
      const TensorShape& tb = graph_.tensors[inputs[1]];
      const std::vector<int64_t> a = ta.SymbolicDims(), b = tb.SymbolicDims();
      const size_t r = a.size();
      const bool ranks = r >= 2 && b.size() == r;
      const int64_t m = ranks ? a[node.trans_a ? r - 1 : r - 2] : 0, ka = ranks ? a[node.trans_a ? r - 2 : r - 1] : 0;
      const int64_t kb = ranks ? b[node.trans_b ? r - 1 : r - 2] : 0, n = ranks ? b[node.trans_b ? r - 2 : r - 1] : 0;
      const bool fits = ranks && std::equal(a.begin(), a.end() - 2, b.begin()) && ka == kb && m > 0 && ka > 0 && n > 0;
      if (!fits) {
        return Error(node, absl::StrCat("cannot multiply ", ta.ToString(), node.trans_a ? " (transposed)" : "", " by ",
                                        tb.ToString(), node.trans_b ? " (transposed)" : "",
                                        " (supported: [..., m, k] x [..., k, n] with the same leading axes, the "
                                        "batch's included, outside the last two)"));
      }
      std::vector<int64_t> y = a;
      y[r - 2] = m;
      y[r - 1] = n;
      *out = FromSymbolic(y);
      return absl::OkStatus();
    }
    case Op::kSoftmax: {
      RETURN_IF_ERROR(expect(1, 0, 0));
      RETURN_IF_ERROR(not_image(inputs[0]));
      const TensorShape& x = graph_.tensors[inputs[0]];
      if (node.axis < 0 || node.axis >= x.full_rank() || node.axis == x.batch_axis) {
        return Error(node, absl::StrCat("axis ", node.axis, " of ", x.ToString(),
                                        " (supported: an axis of the tensor other than the batch's)"));
      }
      *out = x;
      return absl::OkStatus();
    }
    case Op::kLayerNorm: {
      RETURN_IF_ERROR(expect(1, 1, 2));
      RETURN_IF_ERROR(not_image(inputs[0]));
      const TensorShape& x = graph_.tensors[inputs[0]];
      if (node.axis < 0 || node.axis >= x.full_rank() || node.axis <= x.batch_axis) {
        return Error(node, absl::StrCat("normalizes the axes from ", node.axis, " of ", x.ToString(),
                                        " (supported: trailing axes after the batch's)"));
      }
      const std::vector<int64_t> full = x.SymbolicDims();
      int64_t cols = 1;
      for (size_t k = node.axis; k < full.size(); ++k) cols *= full[k];
      for (const VariableInfo& v : vars) {
        if (v.size() != cols) {
          return Error(node, absl::StrCat("its ", &v == &vars[0] ? "scale" : "bias", " '", v.name, "' has shape ",
                                          ShapeText(v.shape), ", expected ", cols, " values (the normalized axes)"));
        }
      }
      if (!(node.epsilon >= 0.0f)) return Error(node, absl::StrCat("epsilon ", node.epsilon, " is negative"));
      *out = x;
      return absl::OkStatus();
    }
    case Op::kReduce: {
      RETURN_IF_ERROR(expect(1, 0, 0));
      RETURN_IF_ERROR(not_image(inputs[0]));
      const TensorShape& x = graph_.tensors[inputs[0]];
      std::set<int> seen;
      for (int a : node.axes) {
        if (a < 0 || a >= x.full_rank() || a == x.batch_axis || !seen.insert(a).second) {
          return Error(node, absl::StrCat("axes ", AxesText(node.axes), " of ", x.ToString(),
                                          " (supported: distinct axes other than the batch's)"));
        }
      }
      if (node.axes.empty()) return Error(node, "no axes to reduce");
      const auto [lo, hi] = std::minmax_element(node.axes.begin(), node.axes.end());
      if (*hi - *lo + 1 != static_cast<int>(node.axes.size())) {
        return Error(node, absl::StrCat("axes ", AxesText(node.axes), " are not adjacent (reduce each run apart)"));
      }
      std::vector<int64_t> y = x.SymbolicDims();
      for (int a : node.axes) y[a] = 1;
      *out = FromSymbolic(y);
      return absl::OkStatus();
    }
    case Op::kSlice: {
      RETURN_IF_ERROR(expect(1, 0, 0));
      const TensorShape& x = graph_.tensors[inputs[0]];
      const std::vector<int64_t> full = x.SymbolicDims();
      const size_t r = full.size();
      TensorShape y = x;
      y.dims = node.shape;
      if (node.starts.size() != r || node.steps.size() != r || y.dims.size() != x.dims.size()) {
        return Error(node, absl::StrCat("starts, steps and the output shape do not match the rank of ", x.ToString()));
      }
      const std::vector<int64_t> yf = y.SymbolicDims();
      for (size_t k = 0; k < r; ++k) {
        if (static_cast<int>(k) == x.batch_axis) {
          if (node.starts[k] != 0 || node.steps[k] != 1) return Error(node, "a slice of the batch axis");
          continue;
        }
        if (node.starts[k] < 0 || node.steps[k] < 1 || yf[k] < 1 ||
            node.starts[k] + (yf[k] - 1) * node.steps[k] >= full[k]) {
          return Error(node, absl::StrCat("axis ", k, ": ", yf[k], " elements from ", node.starts[k], " by ",
                                          node.steps[k], " do not fit its ", full[k]));
        }
      }
      *out = y;
      return absl::OkStatus();
    }
    case Op::kGather: {
      RETURN_IF_ERROR(expect(1, 0, 0));
      const TensorShape& x = graph_.tensors[inputs[0]];
      const std::vector<int64_t> full = x.SymbolicDims();
      if (node.axis < 0 || node.axis >= x.full_rank() || node.axis == x.batch_axis || node.indices.empty()) {
        return Error(node, absl::StrCat("axis ", node.axis, " of ", x.ToString(),
                                        " (supported: a non-empty list of rows along an axis other than the batch's)"));
      }
      for (int64_t i : node.indices) {
        if (i < 0 || i >= full[node.axis]) {
          return Error(node, absl::StrCat("index ", i, " is outside the ", full[node.axis], " rows of axis ",
                                          node.axis));
        }
      }
      std::vector<int64_t> y = full;
      y[node.axis] = static_cast<int64_t>(node.indices.size());
      *out = FromSymbolic(y);
      out->plain = x.plain || !x.is_image();
      return absl::OkStatus();
    }
    case Op::kExpand: {
      RETURN_IF_ERROR(expect(1, 0, 0));
      const TensorShape& x = graph_.tensors[inputs[0]];
      TensorShape y;
      y.dims = node.shape;
      y.batch_axis = node.batch_axis;
      y.plain = true;
      if (y.batched() && (y.batch_axis < 0 || y.batch_axis > static_cast<int>(y.dims.size()))) {
        return Error(node, absl::StrCat("batch axis ", y.batch_axis, " is outside the output's rank"));
      }
      const std::vector<int64_t> xf = x.SymbolicDims(), yf = y.SymbolicDims();
      bool fits = xf.size() <= yf.size();
      for (size_t k = 0; fits && k < xf.size(); ++k) {
        const int64_t d = xf[xf.size() - 1 - k], e = yf[yf.size() - 1 - k];
        fits = d == e || d == 1;  // a 1 broadcasts, over the batch too
      }
      for (int64_t d : y.dims) fits = fits && d >= 1;
      if (!fits) {
        return Error(node, absl::StrCat("cannot broadcast ", x.ToString(), " to ", y.ToString()));
      }
      *out = y;
      return absl::OkStatus();
    }
    case Op::kVariable: {
      RETURN_IF_ERROR(expect(0, 1, 1));
      out->dims = vars[0].shape;
      out->batch_axis = TensorShape::kNoBatch;
      out->plain = true;
      return absl::OkStatus();
    }
    default:
      return Error(node, "not a tensor op");
  }
}

}  // namespace dtrain::models
