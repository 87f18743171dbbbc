// The mapper's tensor ops (onnx_mapper_internal.h): what transformers and today's convolutional nets add to
// convolutions and dense layers — Transpose, MatMul of two tensors, Softmax inside the graph, LayerNormalization
// (and the pattern opset < 17 exports emit), reductions, Gather / Slice / Split of tensors, Expand, Tile,
// Squeeze / Unsqueeze — and the fusions of GELU and SiLU as exported.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_attributes.h"
#include "worker/models/onnx/onnx_mapper_internal.h"

namespace dtrain::models::onnx {

using ::onnx::NodeProto;

namespace {

bool Near(double a, double b) { return std::fabs(a - b) <= 1e-6 * std::max(1.0, std::fabs(b)); }

// Axes of an op: an attribute, or from `input_opset` on its input 1.
std::vector<int64_t> IntsOf(const Const* c) { return c == nullptr ? std::vector<int64_t>{} : c->ints; }

}  // namespace

absl::Status Mapper::MapTranspose(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const int x, Tensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  const std::vector<int> span = SpanOf(*v);
  const int rank = static_cast<int>(span.size());
  std::vector<int64_t> perm = AttrInts(n, "perm");
  if (perm.empty()) {
    for (int k = rank - 1; k >= 0; --k) perm.push_back(k);
  }
  std::vector<int64_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  for (int k = 0; k < rank; ++k) {
    if (static_cast<int>(sorted.size()) != rank || sorted[k] != k) {
      return Refuse(i, absl::StrCat("perm [", absl::StrJoin(perm, ","), "] is not a permutation of ", rank, " axes"));
    }
  }
  // The full axes of each ONNX axis, in the new order.
  std::vector<int> first(rank, 0);
  for (int k = 1; k < rank; ++k) first[k] = first[k - 1] + span[k - 1];
  std::vector<int> full_perm, new_span;
  bool identity = true;
  for (int64_t p : perm) {
    for (int j = 0; j < span[p]; ++j) {
      identity = identity && first[p] + j == static_cast<int>(full_perm.size());
      full_perm.push_back(first[p] + j);
    }
    new_span.push_back(span[p]);
  }
  bool trivial = true;
  for (int s : new_span) trivial = trivial && s == 1;
  if (trivial) new_span.clear();
  if (identity) return Alias(i, x, new_span);
  Node t = Make(i, Op::kTranspose);
  t.perm = full_perm;
  return Emit(i, std::move(t), {x}, {}, "", new_span);
}

absl::Status Mapper::MapMatMulOfTensors(int i) {
  ASSIGN_OR_RETURN(const int a, PlainTensor(i, 0));
  ASSIGN_OR_RETURN(const int b, PlainTensor(i, 1));
  ASSIGN_OR_RETURN(const Value* va, Get(i, 0));
  ASSIGN_OR_RETURN(const Value* vb, Get(i, 1));
  if (SpanOf(*va).size() < 2 || SpanOf(*vb).size() < 2) {
    return Refuse(i, "a product with a 1-D operand (supported: [..., m, k] x [..., k, n])");
  }
  for (int k = 0; k < 2; ++k) {
    for (int64_t axis : {-1, -2}) RETURN_IF_ERROR(FullAxis(i, k, axis, "matrix axis").status());
  }
  const std::vector<int64_t> da = b_->shape(a).SymbolicDims(), db = b_->shape(b).SymbolicDims();
  if (da.size() != db.size() || !std::equal(da.begin(), da.end() - 2, db.begin()) ||
      da[da.size() - 1] != db[db.size() - 2]) {
    return Refuse(i, absl::StrCat("cannot multiply ", b_->shape(a).ToString(), " by ", b_->shape(b).ToString(),
                                  " (supported: [..., m, k] x [..., k, n] with the same leading axes)"));
  }
  return Emit(i, Make(i, Op::kMatMul), {a, b}, {}, "", va->span);
}

absl::Status Mapper::MapEinsum(int i) {
  const NodeProto& n = node(i);
  // Batched matrix products: "<batch> m k, <batch> k n -> <batch> m n", either operand's last two labels in
  // either order (MaxViT's "B G H I D, B G H J D -> B G H I J" is q k^T).
  std::string eq;
  for (char c : AttrString(n, "equation", "")) {
    if (c != ' ') eq.push_back(c);
  }
  const size_t comma = eq.find(','), arrow = eq.find("->");
  if (n.input_size() != 2 || comma == std::string::npos || arrow == std::string::npos || arrow < comma ||
      eq.find("...") != std::string::npos) {
    return Refuse(i, absl::StrCat("equation '", AttrString(n, "equation", ""), "' (supported: batched matrix "
                                  "products of two operands, every axis labelled)"));
  }
  const std::string a = eq.substr(0, comma), b = eq.substr(comma + 1, arrow - comma - 1), y = eq.substr(arrow + 2);
  const auto refuse = [&]() {
    return Refuse(i, absl::StrCat("equation '", AttrString(n, "equation", ""),
                                  "' is not a batched matrix product (supported: '<batch> m k, <batch> k n -> "
                                  "<batch> m n', the last two labels of an operand in either order)"));
  };
  if (a.size() < 2 || a.size() != b.size() || y.size() != a.size()) return refuse();
  const size_t r = a.size();
  if (a.substr(0, r - 2) != b.substr(0, r - 2) || y.substr(0, r - 2) != a.substr(0, r - 2)) return refuse();
  const char m = y[r - 2], nn = y[r - 1];
  const std::string am = a.substr(r - 2), bm = b.substr(r - 2);
  char k = 0;
  for (char c : am) {
    if (c != m) k = c;
  }
  if (k == 0 || am.find(m) == std::string::npos || bm.find(nn) == std::string::npos || bm.find(k) == std::string::npos ||
      m == nn) {
    return refuse();
  }
  ASSIGN_OR_RETURN(const int ta, PlainTensor(i, 0));
  ASSIGN_OR_RETURN(const int tb, PlainTensor(i, 1));
  ASSIGN_OR_RETURN(const Value* va, Get(i, 0));
  ASSIGN_OR_RETURN(const Value* vb, Get(i, 1));
  for (int j = 0; j < 2; ++j) {
    for (int64_t axis : {-1, -2}) RETURN_IF_ERROR(FullAxis(i, j, axis, "matrix axis").status());
  }
  if (SpanOf(*va) != SpanOf(*vb)) return Refuse(i, "operands whose axes merge the batch differently");
  Node mm = Make(i, Op::kMatMul);
  mm.trans_a = am[0] == k;
  mm.trans_b = bm[1] == k;
  return Emit(i, std::move(mm), {ta, tb}, {}, "", va->span);
}

absl::Status Mapper::MapSoftmax(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const int x, PlainTensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  const int64_t rank = static_cast<int64_t>(SpanOf(*v).size());
  int64_t axis = AttrInt(n, "axis", f_.opset >= 13 ? -1 : 1);
  if (axis < 0) axis += rank;
  if (f_.opset < 13 && axis != rank - 1) {
    return Refuse(i, absl::StrCat("attribute axis=", axis, " before opset 13 flattens the axes after it (supported: ",
                                  "the last axis, or opset 13 on)"));
  }
  ASSIGN_OR_RETURN(const int full, FullAxis(i, 0, axis, "axis"));
  Node s = Make(i, Op::kSoftmax);
  s.axis = full;
  s.log_softmax = n.op_type() == "LogSoftmax";
  return Emit(i, std::move(s), {x}, {}, "", v->span);
}

absl::Status Mapper::MapLayerNorm(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const int x, PlainTensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  const int64_t rank = static_cast<int64_t>(SpanOf(*v).size());
  int64_t axis = AttrInt(n, "axis", -1);
  if (axis < 0) axis += rank;
  int first = -1;
  for (int64_t k = axis; k < rank; ++k) {
    ASSIGN_OR_RETURN(const int full, FullAxis(i, 0, k, "normalized axis"));
    if (first < 0) first = full;
  }
  if (first < 0) return Refuse(i, "no axes to normalize");
  std::vector<VarSpec> vars;
  ASSIGN_OR_RETURN(VarSpec scale, Param(i, 1, "scale"));
  vars.push_back(std::move(scale));
  if (!InputName(n, 2).empty()) {
    ASSIGN_OR_RETURN(VarSpec bias, Param(i, 2, "bias"));
    vars.push_back(std::move(bias));
  }
  Node ln = Make(i, Op::kLayerNorm);
  ln.axis = first;
  ln.epsilon = AttrFloat(n, "epsilon", 1e-5f);
  Unavailable(i, 1, "LayerNormalization's Mean and InvStdDev, which dtrain does not expose");
  return Emit(i, std::move(ln), {x}, std::move(vars), "", v->span);
}

absl::Status Mapper::MapReduceOfTensor(int i) {
  const NodeProto& n = node(i);
  const std::string& op = n.op_type();
  std::vector<int64_t> axes = AttrInts(n, "axes");
  if (op == "ReduceSum" && f_.opset >= 13 && n.input_size() > 1) {
    ASSIGN_OR_RETURN(const Const* a, ConstIn(i, 1));
    axes = IntsOf(a);
  }
  const bool keepdims = AttrInt(n, "keepdims", 1) != 0;
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  const int64_t rank = static_cast<int64_t>(SpanOf(*v).size());
  if (axes.empty()) return Refuse(i, "reduces every axis, the batch's too (supported: axes other than the batch's)");
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  const kernels::ReduceKind kind = op == "ReduceMean"  ? kernels::ReduceKind::kMean
                                   : op == "ReduceMax" ? kernels::ReduceKind::kMax
                                                       : kernels::ReduceKind::kSum;
  const std::vector<Dim> in_dims = OnnxDims(*v);
  std::vector<Dim> out_dims;
  for (int64_t k = 0; k < rank; ++k) {
    if (!std::binary_search(axes.begin(), axes.end(), k)) out_dims.push_back(in_dims[k]);
  }
  const std::string out = n.output(0);
  const std::string reduced = keepdims ? out : out + "/keepdims";
  // An image over H and W: global pooling (x.mean([2, 3]) as MNASNet writes it).
  if (b_->shape(x).is_image() && axes == std::vector<int64_t>{2, 3} && kind != kernels::ReduceKind::kSum) {
    const TensorShape& s = b_->shape(x);
    Node p = Make(i, kind == kernels::ReduceKind::kMean ? Op::kAvgPool : Op::kMaxPool);
    p.pool.window = p.pool.window_h = static_cast<int>(s.dims[1]);
    p.pool.window_w = static_cast<int>(s.dims[2]);
    p.pool.stride = p.pool.stride_h = p.pool.stride_w = 1;
    p.pool.explicit_padding = true;
    RETURN_IF_ERROR(Emit(i, std::move(p), {x}, {}, reduced));
  } else {
    ASSIGN_OR_RETURN(x, PlainTensor(i, 0));
    // One reduction per run of adjacent full axes (the mean of means is the mean: each run has equal counts).
    std::vector<int> full;
    for (int64_t a : axes) {
      ASSIGN_OR_RETURN(const int f, FullAxis(i, 0, a, "axis"));
      full.push_back(f);
    }
    std::vector<std::vector<int>> runs;
    for (int f : full) {
      if (runs.empty() || runs.back().back() + 1 != f) runs.emplace_back();
      runs.back().push_back(f);
    }
    int t = x;
    for (size_t r = 0; r < runs.size(); ++r) {
      Node red = Make(i, Op::kReduce);
      if (runs.size() > 1) red.name = absl::StrCat(red.name, "/", r);
      red.reduce = kind;
      red.axes = runs[r];
      const std::string name = r + 1 == runs.size() ? reduced : absl::StrCat(out, "/run", r);
      ASSIGN_OR_RETURN(t, b_->Add(std::move(red), {t}, {}, name));
    }
    RETURN_IF_ERROR(Alias(i, t, v->span, reduced));
  }
  if (keepdims) return absl::OkStatus();
  return ReshapeTo(i, values_[reduced], out_dims);
}

absl::Status Mapper::MapGatherOfTensor(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const Const* idx, ConstIn(i, 1));
  if (idx->type != Const::Type::kInt || idx->any_batch()) return Refuse(i, "its indices are not integer constants");
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  const std::vector<Dim> dims = OnnxDims(*v);
  int64_t axis = AttrInt(n, "axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(dims.size());
  ASSIGN_OR_RETURN(const int full, FullAxis(i, 0, axis, "axis"));
  const int64_t rows = dims[axis].size;
  std::vector<int64_t> indices;
  for (int64_t k : idx->ints) {
    const int64_t r = k < 0 ? k + rows : k;
    if (r < 0 || r >= rows) return Refuse(i, absl::StrCat("index ", k, " is outside the ", rows, " rows of axis ", axis));
    indices.push_back(r);
  }
  bool progression = indices.size() == 1;
  if (indices.size() > 1) {
    const int64_t step = indices[1] - indices[0];
    progression = step >= 1;
    for (size_t j = 1; progression && j < indices.size(); ++j) progression = indices[j] - indices[j - 1] == step;
  }
  if (!progression) {
    ASSIGN_OR_RETURN(x, PlainTensor(i, 0));
  }
  Node g = Make(i, Op::kGather);
  g.axis = full;
  g.indices = indices;
  // A 1-D index list keeps the axis; a scalar drops it, an index tensor of more dims spreads over them.
  if (idx->dims.size() == 1) return Emit(i, std::move(g), {x}, {}, "", v->span);
  const std::string rows_name = n.output(0) + "/rows";
  RETURN_IF_ERROR(Emit(i, std::move(g), {x}, {}, rows_name, v->span));
  std::vector<Dim> target(dims.begin(), dims.begin() + axis);
  for (int64_t d : idx->dims) target.push_back(Dim{d, 0});
  target.insert(target.end(), dims.begin() + axis + 1, dims.end());
  return ReshapeTo(i, values_[rows_name], target);
}

absl::Status Mapper::MapSlice(int i) {
  if (f_.opset < 10) return Refuse(i, "Slice before opset 10");
  ASSIGN_OR_RETURN(const int x, Tensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  ASSIGN_OR_RETURN(const Const* starts, ConstIn(i, 1));
  ASSIGN_OR_RETURN(const Const* ends, ConstIn(i, 2));
  ASSIGN_OR_RETURN(const Const* axes_in, ConstIn(i, 3));
  ASSIGN_OR_RETURN(const Const* steps_in, ConstIn(i, 4));
  if (starts == nullptr || ends == nullptr || starts->size() != ends->size()) {
    return Refuse(i, "its starts and ends are not constants of one length");
  }
  const std::vector<Dim> dims = OnnxDims(*v);
  const TensorShape& s = b_->shape(x);
  const std::vector<int64_t> full_dims = s.SymbolicDims();
  std::vector<int64_t> begin(full_dims.size(), 0), step(full_dims.size(), 1), out = full_dims;
  bool changes = false;
  for (int64_t j = 0; j < starts->size(); ++j) {
    int64_t axis = axes_in != nullptr ? axes_in->ints[j] : j;
    if (axis < 0) axis += static_cast<int64_t>(dims.size());
    const int64_t st = steps_in != nullptr ? steps_in->ints[j] : 1;
    ASSIGN_OR_RETURN(const int f, FullAxis(i, 0, axis, "axis", /*batch_ok=*/true));
    const int64_t b0 = starts->ints[j], e0 = ends->ints[j];
    if (f == kBatchAxis) {
      // The whole batch (x[:, ...] written out): nothing to do.
      if (b0 == 0 && st == 1 && (e0 >= std::numeric_limits<int32_t>::max() || ends->batch_factor(j) == 1)) continue;
      return Refuse(i, "a Slice of the batch axis (supported: slices of the other axes)");
    }
    if (st < 1) return Refuse(i, absl::StrCat("step ", st, " (supported: positive steps)"));
    const int64_t d = dims[axis].size;
    auto clamp = [&](int64_t x) { return std::clamp<int64_t>(x < 0 ? x + d : x, 0, d); };
    const int64_t b = clamp(b0), e = clamp(e0);
    const int64_t count = e > b ? (e - b + st - 1) / st : 0;
    if (count == 0) return Refuse(i, absl::StrCat("the slice of axis ", axis, " is empty"));
    begin[f] = b;
    step[f] = st;
    out[f] = count;
    changes = changes || count != d;
  }
  if (!changes) return Alias(i, x, v->span);
  Node sl = Make(i, Op::kSlice);
  sl.starts = begin;
  sl.steps = step;
  for (size_t k = 0; k < out.size(); ++k) {
    if (static_cast<int>(k) != s.batch_axis) sl.shape.push_back(out[k]);
  }
  return Emit(i, std::move(sl), {x}, {}, "", v->span);
}

absl::Status Mapper::MapSplit(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const int x, Tensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  const std::vector<Dim> dims = OnnxDims(*v);
  int64_t axis = AttrInt(n, "axis", 0);
  if (axis < 0) axis += static_cast<int64_t>(dims.size());
  ASSIGN_OR_RETURN(const int f, FullAxis(i, 0, axis, "axis"));
  std::vector<int64_t> sizes = AttrInts(n, "split");
  if (f_.opset >= 13 && n.input_size() > 1) {
    ASSIGN_OR_RETURN(const Const* sp, ConstIn(i, 1));
    sizes = IntsOf(sp);
  }
  const int64_t d = dims[axis].size, parts = n.output_size();
  if (sizes.empty()) {
    if (d % parts != 0) return Refuse(i, absl::StrCat("axis ", axis, " of ", d, " does not split into ", parts));
    sizes.assign(parts, d / parts);
  }
  int64_t total = 0;
  for (int64_t z : sizes) total += z;
  if (static_cast<int64_t>(sizes.size()) != parts || total != d) {
    return Refuse(i, absl::StrCat("split [", absl::StrJoin(sizes, ","), "] does not cover axis ", axis, " of ", d));
  }
  const TensorShape s = b_->shape(x);  // a copy: Emit below adds shapes (a reference would dangle)
  const std::vector<int64_t> full_dims = s.SymbolicDims();
  int64_t offset = 0;
  for (int64_t k = 0; k < parts; ++k) {
    Node sl = Make(i, Op::kSlice);
    sl.name = absl::StrCat(sl.name, ":", k);
    sl.starts.assign(full_dims.size(), 0);
    sl.steps.assign(full_dims.size(), 1);
    sl.starts[f] = offset;
    std::vector<int64_t> out = full_dims;
    out[f] = sizes[k];
    for (size_t j = 0; j < out.size(); ++j) {
      if (static_cast<int>(j) != s.batch_axis) sl.shape.push_back(out[j]);
    }
    offset += sizes[k];
    if (!n.output(k).empty()) RETURN_IF_ERROR(Emit(i, std::move(sl), {x}, {}, n.output(k), v->span));
  }
  return absl::OkStatus();
}

absl::Status Mapper::MapExpand(int i) {
  ASSIGN_OR_RETURN(const int x, Tensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  ASSIGN_OR_RETURN(const Const* shape, ConstIn(i, 1));
  if (shape == nullptr || shape->type != Const::Type::kInt || shape->dims.size() != 1) {
    return Refuse(i, "its shape is not a 1-D integer constant");
  }
  if (!v->span.empty()) return Refuse(i, "Expand of a tensor that merges the batch with other rows");
  const std::vector<Dim> in = OnnxDims(*v);
  const size_t rank = std::max<size_t>(in.size(), shape->size());
  std::vector<Dim> out(rank);
  for (size_t k = 0; k < rank; ++k) {
    const int64_t ki = static_cast<int64_t>(k) - static_cast<int64_t>(rank - in.size());
    const int64_t ks = static_cast<int64_t>(k) - static_cast<int64_t>(rank - shape->size());
    const Dim a = ki >= 0 ? in[ki] : Dim{1, 0};
    Dim b{1, 0};
    if (ks >= 0) b = shape->batch_factor(ks) > 0 ? Dim{1, shape->batch_factor(ks)} : Dim{shape->ints[ks], 0};
    if (a.batch() || b.batch()) {
      const bool fits = (a.batch() && b.batch() && a.factor == b.factor) || (a.batch() && !b.batch() && b.size == 1) ||
                        (!a.batch() && a.size == 1);
      if (!fits || (a.batch() ? a.factor : b.factor) != 1) {
        return Refuse(i, "an Expand that merges the batch with other rows (supported: the batch as an axis of its own)");
      }
      out[k] = a.batch() ? a : b;
    } else if (a.size == b.size || b.size == 1) {
      out[k] = a;
    } else if (a.size == 1) {
      out[k] = b;
    } else {
      return Refuse(i, absl::StrCat("cannot expand axis ", k, " of ", a.size, " to ", b.size));
    }
  }
  Node e = Make(i, Op::kExpand);
  e.batch_axis = TensorShape::kNoBatch;
  for (size_t k = 0; k < rank; ++k) {
    if (out[k].batch()) {
      e.batch_axis = static_cast<int>(k);
    } else {
      e.shape.push_back(out[k].size);
    }
  }
  const TensorShape& s = b_->shape(x);
  if (s.dims == e.shape && s.batch_axis == e.batch_axis) return Alias(i, x);
  ASSIGN_OR_RETURN(const int px, PlainTensor(i, 0));
  return Emit(i, std::move(e), {px}, {});
}

absl::Status Mapper::MapTile(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const int x, PlainTensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  ASSIGN_OR_RETURN(const Const* reps, ConstIn(i, 1));
  const std::vector<Dim> dims = OnnxDims(*v);
  if (reps == nullptr || reps->any_batch() || reps->size() != static_cast<int64_t>(dims.size()) || !v->span.empty()) {
    return Refuse(i, "its repeats are not one constant per axis");
  }
  // [d0, d1, ...] -> [1, d0, 1, d1, ...] -> expanded to [r0, d0, r1, d1, ...] -> [r0 d0, r1 d1, ...].
  std::vector<Dim> spread, tiled;
  Node e = Make(i, Op::kExpand);
  e.name += "/expand";
  e.batch_axis = TensorShape::kNoBatch;
  for (size_t k = 0; k < dims.size(); ++k) {
    const int64_t r = reps->ints[k];
    if (r < 1 || (dims[k].batch() && r != 1)) return Refuse(i, absl::StrCat("repeat ", r, " of axis ", k));
    spread.push_back(Dim{1, 0});
    spread.push_back(dims[k]);
    e.shape.push_back(r);
    if (dims[k].batch()) {
      e.batch_axis = static_cast<int>(e.shape.size());
      tiled.push_back(dims[k]);
    } else {
      e.shape.push_back(dims[k].size);
      tiled.push_back(Dim{r * dims[k].size, 0});
    }
  }
  const std::string spread_name = n.output(0) + "/spread", expanded = n.output(0) + "/expanded";
  Value whole = *v;
  whole.tensor = x;
  RETURN_IF_ERROR(ReshapeTo(i, whole, spread, spread_name));
  RETURN_IF_ERROR(Emit(i, std::move(e), {values_[spread_name].tensor}, {}, expanded));
  return ReshapeTo(i, values_[expanded], tiled);
}

absl::Status Mapper::MapSqueezeOfTensor(int i) {
  const NodeProto& n = node(i);
  const bool squeeze = n.op_type() == "Squeeze";
  std::vector<int64_t> axes = AttrInts(n, "axes");
  if (f_.opset >= 13 && n.input_size() > 1) {
    ASSIGN_OR_RETURN(const Const* a, ConstIn(i, 1));
    if (a != nullptr) axes = a->ints;
  }
  ASSIGN_OR_RETURN(const int x, Tensor(i, 0));
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  const std::vector<Dim> dims = OnnxDims(*v);
  const int64_t rank = static_cast<int64_t>(dims.size());
  std::vector<Dim> target;
  if (squeeze) {
    if (axes.empty()) {
      for (int64_t k = 0; k < rank; ++k) {
        if (!dims[k].batch() && dims[k].size == 1) axes.push_back(k);
      }
    }
    for (int64_t& a : axes) {
      if (a < 0) a += rank;
      if (a < 0 || a >= rank || dims[a].batch() || dims[a].size != 1) {
        return Refuse(i, absl::StrCat("Squeeze of axis ", a, ", which is not a 1 (supported: axes of size 1 other "
                                      "than the batch's)"));
      }
    }
    for (int64_t k = 0; k < rank; ++k) {
      if (std::find(axes.begin(), axes.end(), k) == axes.end()) target.push_back(dims[k]);
    }
    if (target.size() == 1 && target[0].batch() && target[0].factor == 1) {
      // One logit squeezed to [N] (BCEWithLogitsLoss against [N] labels): the model's output, or the input of its
      // Sigmoid head.
      const std::string& out = n.output(0);
      const int reader = SoleReader(out);
      const bool to_head =
          reader >= 0 && node(reader).op_type() == "Sigmoid" && IsFinalOutput(node(reader).output(0));
      if (o_.forward_only || (!IsFinalOutput(out) && !to_head) || b_->shape(x).dims != std::vector<int64_t>{1} ||
          b_->shape(x).batch_axis != 0) {
        return Refuse(i, "Squeeze to one value per example is supported only for the model's one logit at its "
                         "output (or before its Sigmoid head)");
      }
      Value head;
      head.head_of = x;
      values_[out] = head;
      return absl::OkStatus();
    }
  } else {
    const int64_t out_rank = rank + static_cast<int64_t>(axes.size());
    for (int64_t& a : axes) {
      if (a < 0) a += out_rank;
      if (a < 0 || a >= out_rank) return Refuse(i, absl::StrCat("Unsqueeze axis ", a, " is outside the rank"));
    }
    size_t next = 0;
    for (int64_t k = 0; k < out_rank; ++k) {
      target.push_back(std::find(axes.begin(), axes.end(), k) != axes.end() ? Dim{1, 0} : dims[next++]);
    }
  }
  return ReshapeTo(i, *v, target);
}

// ---- fusions ----

absl::StatusOr<bool> Mapper::TryLayerNormPattern(int i) {
  const NodeProto& mean = node(i);
  // Each step's output read by the next step alone (and by nothing outside the pattern).
  auto next = [&](const std::string& value, const char* op) -> int {
    const int j = IsGraphOutput(value) ? -1 : SoleReader(value);
    return j >= 0 && node(j).op_type() == op ? j : -1;
  };
  auto other_input = [&](int j, const std::string& mine) -> std::string {
    return node(j).input(0) == mine ? node(j).input(1) : node(j).input(0);
  };
  auto constant = [&](const std::string& name) -> const Const* {
    auto it = values_.find(name);
    return it != values_.end() && it->second.constant != nullptr && it->second.constant->size() == 1
               ? it->second.constant.get()
               : nullptr;
  };
  const std::string x = mean.input(0);
  const std::vector<int64_t> axes = AttrInts(mean, "axes");
  if (AttrInt(mean, "keepdims", 1) == 0 || axes.empty()) return false;
  const int sub = next(mean.output(0), "Sub");
  if (sub < 0 || node(sub).input(0) != x || node(sub).input(1) != mean.output(0)) return false;
  const std::string d = node(sub).output(0);
  auto readers = f_.readers.find(d);
  if (IsGraphOutput(d) || readers == f_.readers.end() || readers->second.size() != 2) return false;
  int pow = -1, div = -1;
  for (int j : readers->second) {
    if (node(j).op_type() == "Pow" && node(j).input(0) == d) pow = j;
    if (node(j).op_type() == "Div" && node(j).input(0) == d) div = j;
  }
  if (pow < 0 || div < 0) return false;
  const Const* two = constant(node(pow).input(1));
  if (two == nullptr || two->at(0) != 2.0) return false;
  const int var = next(node(pow).output(0), "ReduceMean");
  if (var < 0 || AttrInts(node(var), "axes") != axes || AttrInt(node(var), "keepdims", 1) == 0) return false;
  const int add = next(node(var).output(0), "Add");
  if (add < 0) return false;
  const Const* eps = constant(other_input(add, node(var).output(0)));
  if (eps == nullptr || eps->type != Const::Type::kFloat) return false;
  const int sqrt = next(node(add).output(0), "Sqrt");
  if (sqrt < 0 || next(node(sqrt).output(0), "Div") != div || node(div).input(1) != node(sqrt).output(0)) return false;
  // The normalized axes: the trailing ones, none holding the batch.
  ASSIGN_OR_RETURN(const Value* xv, Get(i, 0));
  if (xv->tensor < 0) return false;
  const int64_t rank = static_cast<int64_t>(SpanOf(*xv).size());
  std::vector<int64_t> norm = axes;
  for (int64_t& a : norm) a = a < 0 ? a + rank : a;
  std::sort(norm.begin(), norm.end());
  for (size_t k = 0; k < norm.size(); ++k) {
    if (norm[k] != rank - static_cast<int64_t>(norm.size() - k)) return false;
  }
  // Optional scale and bias (x * weight + bias, each an initializer of the normalized size).
  int64_t cols = 1;
  const std::vector<Dim> dims = OnnxDims(*xv);
  for (int64_t a : norm) {
    if (dims[a].batch()) return false;
    cols *= dims[a].size;
  }
  auto param = [&](int j, const std::string& mine) -> int {
    const std::string other = other_input(j, mine);
    auto it = values_.find(other);
    if (it == values_.end() || it->second.constant == nullptr) return -1;
    const Const& c = *it->second.constant;
    if (c.type != Const::Type::kFloat || c.size() != cols) return -1;
    return node(j).input(0) == other ? 0 : 1;
  };
  std::vector<int> fused = {sub, pow, var, add, sqrt, div};
  std::string out = node(div).output(0);
  int mul = next(out, "Mul"), scale_k = -1, bias_add = -1, bias_k = -1;
  if (mul >= 0) scale_k = param(mul, out);
  if (scale_k >= 0) {
    fused.push_back(mul);
    out = node(mul).output(0);
    bias_add = next(out, "Add");
    if (bias_add >= 0) bias_k = param(bias_add, out);
    if (bias_k >= 0) {
      fused.push_back(bias_add);
      out = node(bias_add).output(0);
    }
  }
  ASSIGN_OR_RETURN(const int t, PlainTensor(i, 0));
  ASSIGN_OR_RETURN(const int first, FullAxis(i, 0, norm[0], "normalized axis"));
  for (int64_t a : norm) RETURN_IF_ERROR(FullAxis(i, 0, a, "normalized axis").status());
  std::vector<VarSpec> vars;
  if (scale_k >= 0) {
    ASSIGN_OR_RETURN(VarSpec s, Param(mul, scale_k, "scale"));
    vars.push_back(std::move(s));
  } else {
    Initializer ones;
    ones.kind = Initializer::Kind::kValues;
    ones.values = std::make_shared<const std::vector<float>>(cols, 1.0f);
    const std::string name = absl::StrCat(out, "/unit_scale");
    var_names_.insert(name);
    vars.push_back(VarSpec(name, {cols}, std::move(ones), 0.0f, /*trainable=*/false));
  }
  if (bias_k >= 0) {
    ASSIGN_OR_RETURN(VarSpec b, Param(bias_add, bias_k, "bias"));
    vars.push_back(std::move(b));
  }
  Node ln = Make(i, Op::kLayerNorm);
  ln.name = absl::StrCat(ln.name, "/layer_norm");
  ln.axis = first;
  ln.epsilon = static_cast<float>(eps->at(0));
  RETURN_IF_ERROR(Emit(i, std::move(ln), {t}, std::move(vars), out, xv->span));
  for (int j : fused) fused_.insert(j);
  return true;
}

absl::StatusOr<bool> Mapper::TryGeluPattern(int i) {
  const NodeProto& div = node(i);
  auto next = [&](const std::string& value, const char* op) -> int {
    const int j = IsGraphOutput(value) ? -1 : SoleReader(value);
    return j >= 0 && node(j).op_type() == op ? j : -1;
  };
  auto scalar = [&](const std::string& name, double want) {
    auto it = values_.find(name);
    return it != values_.end() && it->second.constant != nullptr && it->second.constant->size() == 1 &&
           Near(it->second.constant->at(0), want);
  };
  auto other = [&](int j, const std::string& mine) {
    return node(j).input(0) == mine ? node(j).input(1) : node(j).input(0);
  };
  const std::string x = div.input(0);
  if (!scalar(div.input(1), std::sqrt(2.0))) return false;
  const int erf = next(div.output(0), "Erf");
  if (erf < 0) return false;
  const int add = next(node(erf).output(0), "Add");
  if (add < 0 || !scalar(other(add, node(erf).output(0)), 1.0)) return false;
  const int mul = next(node(add).output(0), "Mul");
  if (mul < 0 || other(mul, node(add).output(0)) != x) return false;
  const int half = next(node(mul).output(0), "Mul");
  if (half < 0 || !scalar(other(half, node(mul).output(0)), 0.5)) return false;
  ASSIGN_OR_RETURN(const Value* xv, Get(i, 0));
  if (xv->tensor < 0) return false;
  ASSIGN_OR_RETURN(const int t, Tensor(i, 0));
  Node g = Make(i, Op::kActivation);
  g.name = absl::StrCat(g.name, "/gelu");
  g.activation.kind = kernels::ActivationParams::Kind::kGelu;
  RETURN_IF_ERROR(Emit(i, std::move(g), {t}, {}, node(half).output(0), xv->span));
  for (int j : {erf, add, mul, half}) fused_.insert(j);
  return true;
}

absl::StatusOr<bool> Mapper::TrySiluPattern(int i) {
  const NodeProto& sig = node(i);
  const std::string& s = sig.output(0);
  const int mul = IsGraphOutput(s) ? -1 : SoleReader(s);
  if (mul < 0 || node(mul).op_type() != "Mul") return false;
  const std::string other = node(mul).input(0) == s ? node(mul).input(1) : node(mul).input(0);
  if (other != sig.input(0)) return false;
  ASSIGN_OR_RETURN(const Value* xv, Get(i, 0));
  if (xv->tensor < 0) return false;
  ASSIGN_OR_RETURN(const int t, Tensor(i, 0));
  Node a = Make(i, Op::kActivation);
  a.name = absl::StrCat(a.name, "/silu");
  a.activation.kind = kernels::ActivationParams::Kind::kSilu;
  RETURN_IF_ERROR(Emit(i, std::move(a), {t}, {}, node(mul).output(0), xv->span));
  fused_.insert(mul);
  return true;
}

}  // namespace dtrain::models::onnx
