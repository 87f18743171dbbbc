// The mapper's axis bookkeeping (onnx_mapper_internal.h): an ONNX value's axes against its tensor's full axes
// (the batch's included, graph.h), its ONNX dims with the batch symbolic, and Reshape's algebra that keeps the
// batch where the row-major order puts it.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_attributes.h"
#include "worker/models/onnx/onnx_mapper_internal.h"

namespace dtrain::models::onnx {
namespace {

std::string DimsText(const std::vector<Dim>& dims) {
  std::vector<std::string> parts;
  for (const Dim& d : dims) {
    parts.push_back(!d.batch() ? absl::StrCat(d.size) : d.factor == 1 ? "N" : absl::StrCat(d.factor, "N"));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

}  // namespace

std::vector<int> Mapper::SpanOf(const Value& v) const {
  if (!v.span.empty()) return v.span;
  // A constant read as a tensor is one without a batch axis, of its own dims (Tensor).
  if (v.tensor < 0 && v.constant != nullptr) return std::vector<int>(v.constant->dims.size(), 1);
  return std::vector<int>(b_->shape(v.tensor).full_rank(), 1);
}

std::vector<Dim> Mapper::OnnxDims(const Value& v) const {
  if (v.tensor < 0 && v.constant != nullptr) {
    std::vector<Dim> dims;
    for (int64_t d : v.constant->dims) dims.push_back(Dim{d, 0});
    return dims;
  }
  const std::vector<int64_t> full = b_->shape(v.tensor).SymbolicDims();
  std::vector<Dim> dims;
  size_t next = 0;
  for (int n : SpanOf(v)) {
    Dim d;
    int64_t product = 1;
    bool batch = false;
    for (int k = 0; k < n; ++k, ++next) {
      if (full[next] == TensorShape::kBatchDim) {
        batch = true;
      } else {
        product *= full[next];
      }
    }
    if (batch) {
      d.factor = product;
    } else {
      d.size = product;
    }
    dims.push_back(d);
  }
  return dims;
}

absl::StatusOr<int> Mapper::FullAxis(int i, int k, int64_t axis, const char* what, bool batch_ok) const {
  ASSIGN_OR_RETURN(const Value* v, Get(i, k));
  if (v->tensor < 0 && v->constant == nullptr) {
    return Refuse(i, absl::StrCat("its ", what, " is taken of a value that is not a tensor"));
  }
  const std::vector<int> span = SpanOf(*v);
  const int64_t rank = static_cast<int64_t>(span.size());
  const int64_t given = axis;
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) {
    return Refuse(i, absl::StrCat(what, " ", given, " is outside the rank ", rank, " of '", InputName(node(i), k), "'"));
  }
  int first = 0;
  for (int64_t a = 0; a < axis; ++a) first += span[a];
  const bool holds_batch = v->tensor >= 0 && b_->shape(v->tensor).batched() &&
                           b_->shape(v->tensor).batch_axis >= first &&
                           b_->shape(v->tensor).batch_axis < first + span[axis];
  if (holds_batch) {
    if (batch_ok && span[axis] == 1) return kBatchAxis;
    return Refuse(i, absl::StrCat(what, " ", given, " of '", InputName(node(i), k), "' (", DimsText(OnnxDims(*v)),
                                  ") holds the batch (supported: ", what, "s other than the batch's)"));
  }
  return first;
}

absl::Status Mapper::ReshapeTo(int i, const Value& v, const std::vector<Dim>& target, const std::string& out_name) {
  if (v.tensor < 0) return Refuse(i, "reshapes a value that is not a tensor");
  const TensorShape& in = b_->shape(v.tensor);
  const std::vector<int64_t> full = in.SymbolicDims();
  const std::string text = DimsText(target);
  int symbolic = -1;
  int64_t before = 1;  // the static sizes before the batch's axis
  for (size_t k = 0; k < target.size(); ++k) {
    if (target[k].batch()) {
      if (symbolic >= 0) return Refuse(i, absl::StrCat("shape ", text, " holds the batch size twice"));
      symbolic = static_cast<int>(k);
    } else if (target[k].size < 1) {
      return Refuse(i, absl::StrCat("shape ", text, " has a size below 1"));
    } else if (symbolic < 0) {
      before *= target[k].size;
    }
  }
  int64_t out_size = 1;
  for (const Dim& d : target) out_size *= d.batch() ? d.factor : d.size;
  if (out_size != in.size() || in.batched() != (symbolic >= 0)) {
    return Refuse(i, absl::StrCat("shape ", text, " does not fit ", DimsText(OnnxDims(v)), " (", in.size(),
                                  " values per example", in.batched() ? "" : ", no batch axis", ")"));
  }
  // The output's full dims: the batch's axis split into N and its factor, on the side the row-major order puts
  // the batch (as many values before it as in the input).
  std::vector<int64_t> dims;
  std::vector<int> span;
  int batch_axis = TensorShape::kNoBatch;
  if (symbolic >= 0) {
    int64_t in_before = 1;
    for (int k = 0; k < in.batch_axis; ++k) in_before *= full[k];
    const int64_t f = target[symbolic].factor;
    const bool n_outer = before == in_before, f_outer = before * f == in_before;
    if (!n_outer && !f_outer) {
      return Refuse(i, absl::StrCat("shape ", text, " of ", DimsText(OnnxDims(v)),
                                    " moves values across the batch axis (supported: reshapes that keep each "
                                    "example's values together and in place)"));
    }
    for (size_t k = 0; k < target.size(); ++k) {
      if (static_cast<int>(k) != symbolic) {
        dims.push_back(target[k].size);
        span.push_back(1);
        continue;
      }
      if (f_outer && !n_outer && f > 1) dims.push_back(f);
      batch_axis = static_cast<int>(dims.size());
      if (n_outer && f > 1) dims.push_back(f);
      span.push_back(f > 1 ? 2 : 1);
    }
  } else {
    for (const Dim& d : target) dims.push_back(d.size);
  }
  bool trivial = true;
  for (int n : span) trivial = trivial && n == 1;
  if (trivial) span.clear();
  TensorShape want;
  want.dims = dims;
  want.batch_axis = batch_axis;
  want.plain = true;
  // Nothing to do when the tensor already has these dims (an image stays one).
  if (in.dims == want.dims && in.batch_axis == want.batch_axis) return Alias(i, v.tensor, span, out_name);
  Node r = Node::Reshape(NodeName(node(i), i), dims, FlattenOrder::kChannelsFirst);
  r.batch_axis = batch_axis < 0 ? 0 : batch_axis;
  r.plain = true;
  return Emit(i, std::move(r), {v.tensor}, {}, out_name, span);
}

}  // namespace dtrain::models::onnx
