// The mapper's dense layers and shape ops (onnx_mapper_internal.h): Gemm, MatMul with a weight, element-wise
// binaries and activations, Flatten, Reshape, Concat.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <tuple>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_attributes.h"
#include "worker/models/onnx/onnx_mapper_internal.h"

namespace dtrain::models::onnx {

using ::onnx::NodeProto;

absl::Status Mapper::MapGemm(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, PlainTensor(i, 0));
  ASSIGN_OR_RETURN(const Value* xv, Get(i, 0));
  const std::vector<int> span = xv->span;
  if (AttrInt(n, "transA", 0) != 0) {
    return Refuse(i, "attribute transA=1 is not supported (supported: transA=0, the batch along A's first axis)");
  }
  ASSIGN_OR_RETURN(VarSpec w, Param(i, 1, "weight"));
  if (w.shape.size() != 2) {
    return Refuse(i, absl::StrCat("its weight '", w.name, "' has shape ", ShapeText(w.shape), " (supported: 2-D)"));
  }
  const bool trans_b = AttrInt(n, "transB", 0) != 0;
  const float alpha = AttrFloat(n, "alpha", 1.0f), beta = AttrFloat(n, "beta", 1.0f);
  const int64_t out = trans_b ? w.shape[0] : w.shape[1];
  Node d = Node::Dense(NodeName(n, i), static_cast<int>(out));
  d.dense.weights_transposed = trans_b;
  d.dense.alpha = alpha;
  d.dense.beta = beta;
  std::vector<VarSpec> vars = {std::move(w)};
  if (InputName(n, 2).empty()) return Emit(i, std::move(d), {x}, std::move(vars), "", span);
  ASSIGN_OR_RETURN(VarSpec c, Param(i, 2, "bias C"));
  if (c.shape == std::vector<int64_t>{out} || c.shape == std::vector<int64_t>{1, out}) {
    vars.push_back(std::move(c));
    return Emit(i, std::move(d), {x}, std::move(vars), "", span);
  }
  // A bias broadcast from a single element or [1, out]: Dense, then Add.
  int64_t size = 1;
  for (int64_t s : c.shape) size *= s;
  const bool broadcast = c.shape.size() <= 2 && size == 1;
  if (!broadcast) {
    return Refuse(i, absl::StrCat("its bias C '", c.name, "' has shape ", ShapeText(c.shape), " (supported: [", out,
                                  "], [1, ", out, "] or one element; a bias per example is not)"));
  }
  if (beta != 1.0f) {
    return Refuse(i, absl::StrCat("attribute beta=", beta, " with a bias C of shape ", ShapeText(c.shape),
                                  " is not supported (supported: beta=1 there, any beta with a bias of shape [", out,
                                  "] or [1, ", out, "])"));
  }
  const std::string product = n.output(0) + "/product";
  RETURN_IF_ERROR(Emit(i, std::move(d), {x}, std::move(vars), product, span));
  Node add = Make(i, Op::kBinary);
  add.name += "/bias";
  add.binary = kernels::BinaryOp::kAdd;
  return Emit(i, std::move(add), {values_[product].tensor}, {std::move(c)}, "", span);
}

absl::Status Mapper::MapMatMul(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, PlainTensor(i, 0));
  ASSIGN_OR_RETURN(const Value* xv, Get(i, 0));
  const std::vector<int> span = xv->span;
  ASSIGN_OR_RETURN(const Value* bv, Get(i, 1));
  // B: a weight [in, out], or the transpose of one [out, in] (PyTorch's Linear on a 3-D input: x W^T).
  const Const& b = *bv->constant;
  const bool transposed = !b.transpose_of.empty();
  VarSpec w("", {}, {});
  if (transposed) {
    if (var_names_.count(b.transpose_of)) {
      return Refuse(i, absl::StrCat("its weight '", b.transpose_of, "' is also read by another node (shared weights "
                                    "are not supported)"));
    }
    Initializer init;
    init.kind = Initializer::Kind::kValues;
    const Const& whole = *f_.initializers.at(b.transpose_of);
    init.values = whole.floats;
    var_names_.insert(b.transpose_of);
    w = VarSpec(b.transpose_of, whole.dims, std::move(init));
  } else {
    ASSIGN_OR_RETURN(w, Param(i, 1, "weight"));
  }
  if (w.shape.size() != 2) {
    return Refuse(i, absl::StrCat("its weight '", w.name, "' has shape ", ShapeText(w.shape), " (supported: 2-D)"));
  }
  const int64_t out = transposed ? w.shape[0] : w.shape[1];
  std::vector<VarSpec> vars = {std::move(w)};
  std::string out_name;
  // MatMul + Add of a bias initializer [out] (PyTorch's Linear on 3-D inputs, tf2onnx's Dense): one Dense.
  const std::string& product = n.output(0);
  const int j = IsGraphOutput(product) ? -1 : SoleReader(product);
  if (j >= 0) {
    const NodeProto& add = node(j);
    if (add.op_type() == "Add" && add.input_size() == 2) {
      const std::string other = add.input(0) == product ? add.input(1) : add.input(0);
      auto it = f_.initializers.find(other);
      if (it != f_.initializers.end() && it->second->dims == std::vector<int64_t>{out} &&
          it->second->data_type == ::onnx::TensorProto::FLOAT && other != product) {
        const int k = add.input(0) == product ? 1 : 0;
        ASSIGN_OR_RETURN(VarSpec bias, Param(j, k, "bias"));
        vars.push_back(std::move(bias));
        fused_.insert(j);
        out_name = add.output(0);
      }
    }
  }
  Node d = Node::Dense(NodeName(n, i), static_cast<int>(out));
  d.dense.weights_transposed = transposed;
  return Emit(i, std::move(d), {x}, std::move(vars), out_name, span);
}

absl::Status Mapper::MapBinary(int i) {
  const NodeProto& n = node(i);
  const std::string& op = n.op_type();
  Node node_out = Make(i, Op::kBinary);
  node_out.binary = op == "Add"   ? kernels::BinaryOp::kAdd
                    : op == "Sub" ? kernels::BinaryOp::kSub
                    : op == "Mul" ? kernels::BinaryOp::kMul
                                  : kernels::BinaryOp::kDiv;
  ASSIGN_OR_RETURN(const Value* a, Get(i, 0));
  ASSIGN_OR_RETURN(const Value* b, Get(i, 1));
  const bool a_const = a->constant != nullptr, b_const = b->constant != nullptr;
  // (A constant minus or divided by a tensor takes the constant as a tensor, below.)
  const bool variable_operand = b_const ? !a_const : (a_const && (op == "Add" || op == "Mul"));
  if (variable_operand) {
    // A tensor and a constant operand (a variable: an initializer trains, a Constant's value does not), unless the
    // tensor merges the batch with other rows: then the constant is a tensor too, viewed in the same axes.
    const int tensor_k = b_const ? 0 : 1;
    ASSIGN_OR_RETURN(const Value* tv, Get(i, tensor_k));
    if (tv->span.empty() || tv->tensor < 0) {
      ASSIGN_OR_RETURN(int t, Tensor(i, tensor_k));
      ASSIGN_OR_RETURN(tv, Get(i, tensor_k));
      const std::vector<int> span = tv->span;
      ASSIGN_OR_RETURN(VarSpec v, Param(i, 1 - tensor_k, "operand"));
      return Emit(i, std::move(node_out), {t}, {std::move(v)}, "", span);
    }
  }
  // Two tensors, numpy-broadcast over their ONNX axes: each viewed in the output's full axes (an axis merged with
  // the batch in one operand is a 1 in the other, which gets one more 1).
  ASSIGN_OR_RETURN(int ta, Tensor(i, 0));
  ASSIGN_OR_RETURN(int tb, Tensor(i, 1));
  ASSIGN_OR_RETURN(a, Get(i, 0));
  ASSIGN_OR_RETURN(b, Get(i, 1));
  const std::vector<int> sa = SpanOf(*a), sb = SpanOf(*b);
  const size_t rank = std::max(sa.size(), sb.size());
  std::vector<int> span(rank, 1);
  for (size_t k = 0; k < rank; ++k) {
    const int ka = static_cast<int>(k) - static_cast<int>(rank - sa.size());
    const int kb = static_cast<int>(k) - static_cast<int>(rank - sb.size());
    span[k] = std::max(ka >= 0 ? sa[ka] : 1, kb >= 0 ? sb[kb] : 1);
  }
  int operands[2] = {ta, tb};
  const Value* values[2] = {a, b};
  for (int side = 0; side < 2; ++side) {
    const std::vector<int> own = SpanOf(*values[side]);
    const std::vector<Dim> dims = OnnxDims(*values[side]);
    const size_t shift = rank - own.size();
    bool differs = false;
    std::vector<int64_t> full;  // the operand's full dims in the output's axes
    const std::vector<int64_t> sym = b_->shape(operands[side]).SymbolicDims();
    size_t next = 0;
    for (size_t k = 0; k < own.size(); ++k) {
      if (own[k] == span[k + shift]) {
        for (int j = 0; j < own[k]; ++j) full.push_back(sym[next++]);
        continue;
      }
      if (dims[k].batch() || dims[k].size != 1) {
        return Refuse(i, absl::StrCat("operand ", side, " does not broadcast against the other's axis ", k + shift,
                                      ", which merges the batch with other rows"));
      }
      for (int j = 0; j < span[k + shift]; ++j) full.push_back(1);
      ++next;
      differs = true;
    }
    if (!differs) continue;
    Node r = Node::Reshape(absl::StrCat(NodeName(n, i), "/operand", side), {}, FlattenOrder::kChannelsFirst);
    r.batch_axis = 0;
    for (size_t k = 0; k < full.size(); ++k) {
      if (full[k] == TensorShape::kBatchDim) {
        r.batch_axis = static_cast<int>(k);
      } else {
        r.shape.push_back(full[k]);
      }
    }
    r.plain = true;
    ASSIGN_OR_RETURN(operands[side], b_->Add(std::move(r), {operands[side]}, {},
                                            absl::StrCat(n.output(0), "/operand", side)));
  }
  bool trivial = true;
  for (int x : span) trivial = trivial && x == 1;
  if (trivial) span.clear();
  return Emit(i, std::move(node_out), {operands[0], operands[1]}, {}, "", span);
}

absl::Status Mapper::MapActivation(int i) {
  const NodeProto& n = node(i);
  const std::string& op = n.op_type();
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  ASSIGN_OR_RETURN(const Value* xv, Get(i, 0));
  const std::vector<int> span = xv->span;
  if (op == "Relu") return Emit(i, Node::Relu(NodeName(n, i)), {x}, {}, "", span);
  using Kind = kernels::ActivationParams::Kind;
  Node a = Make(i, Op::kActivation);
  if (op == "LeakyRelu") {
    a.activation.kind = Kind::kLeakyRelu;
    a.activation.alpha = AttrFloat(n, "alpha", 0.01f);
  } else if (op == "Sigmoid") {
    a.activation.kind = Kind::kSigmoid;
  } else if (op == "Tanh") {
    a.activation.kind = Kind::kTanh;
  } else if (op == "HardSigmoid") {
    a.activation.kind = Kind::kHardSigmoid;
    a.activation.alpha = AttrFloat(n, "alpha", 0.2f);
    a.activation.beta = AttrFloat(n, "beta", 0.5f);
  } else if (op == "HardSwish") {
    a.activation.kind = Kind::kHardSwish;
  } else if (op == "Erf") {
    a.activation.kind = Kind::kErf;
  } else if (op == "Sqrt") {
    a.activation.kind = Kind::kSqrt;
  } else if (op == "Pow") {  // by a constant exponent
    ASSIGN_OR_RETURN(const Const* e, ConstIn(i, 1));
    if (e == nullptr || e->size() != 1) {
      return Refuse(i, "its exponent is not one constant (supported: x ^ c)");
    }
    a.activation.kind = Kind::kPow;
    a.activation.exponent = static_cast<float>(e->at(0));
  } else {  // Clip: bounds from inputs 1 and 2 (opset 11 on), each optional
    a.activation.kind = Kind::kClip;
    a.activation.lo = -std::numeric_limits<float>::infinity();
    a.activation.hi = std::numeric_limits<float>::infinity();
    for (int k = 1; k <= 2; ++k) {
      ASSIGN_OR_RETURN(const Const* c, ConstIn(i, k));
      if (c == nullptr) continue;
      if (c->size() != 1) {
        return Refuse(i, absl::StrCat(k == 1 ? "min" : "max", " has shape ", ShapeText(c->dims),
                                      " (supported: one value)"));
      }
      (k == 1 ? a.activation.lo : a.activation.hi) = static_cast<float>(c->at(0));
    }
  }
  return Emit(i, std::move(a), {x}, {}, "", span);
}

absl::Status Mapper::MapFlatten(int i) {
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  (void)x;
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  const std::vector<Dim> dims = OnnxDims(*v);
  const int64_t rank = static_cast<int64_t>(dims.size());
  int64_t axis = AttrInt(node(i), "axis", 1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis > rank) return Refuse(i, absl::StrCat("attribute axis=", AttrInt(node(i), "axis", 1), " is outside the rank"));
  // [product of dims before axis, product from axis]: one side holds the batch.
  std::vector<Dim> target(2);
  for (int64_t k = 0; k < rank; ++k) {
    Dim& t = target[k < axis ? 0 : 1];
    if (dims[k].batch()) {
      t.factor = dims[k].factor * t.size;
    } else if (t.batch()) {
      t.factor *= dims[k].size;
    } else {
      t.size *= dims[k].size;
    }
  }
  return ReshapeTo(i, *v, target);
}

absl::Status Mapper::MapReshape(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  (void)x;
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  ASSIGN_OR_RETURN(const Const* shape, ConstIn(i, 1));
  if (shape == nullptr || shape->type != Const::Type::kInt || shape->dims.size() != 1 || shape->size() < 1) {
    return Refuse(i, "its shape is not a 1-D integer constant (supported: a constant shape, or one computed from "
                     "Shape/Gather/Unsqueeze/Concat)");
  }
  const std::vector<Dim> in = OnnxDims(*v);
  const TensorShape& ts = b_->shape(v->tensor);
  const bool allowzero = AttrInt(n, "allowzero", 0) != 0;
  const std::string text = absl::StrCat("shape [", absl::StrJoin(shape->ints, ","), "]");
  std::vector<Dim> target;
  int infer = -1, symbolic = -1;
  int64_t known = 1;
  for (int64_t k = 0; k < shape->size(); ++k) {
    Dim d;
    const int64_t value = shape->ints[k];
    if (shape->batch_factor(k) > 0) {
      d.factor = shape->batch_factor(k);
    } else if (value == 0 && !allowzero) {
      if (k >= static_cast<int64_t>(in.size())) return Refuse(i, absl::StrCat(text, ": a 0 beyond the input's rank"));
      d = in[k];
    } else if (value == -1) {
      if (infer >= 0) return Refuse(i, absl::StrCat(text, " has two -1"));
      infer = static_cast<int>(k);
    } else if (value < 1) {
      return Refuse(i, absl::StrCat(text, " has size ", value, " at axis ", k, " (supported: positive sizes, 0, -1)"));
    } else {
      d.size = value;
    }
    if (d.batch()) {
      if (symbolic >= 0) return Refuse(i, absl::StrCat(text, " holds the batch size twice"));
      symbolic = static_cast<int>(k);
    } else if (static_cast<int>(k) != infer) {
      known *= d.size;
    }
    target.push_back(d);
  }
  // An export without a dynamic batch axis writes the batch size as a number: the first such is the batch.
  if (symbolic < 0 && ts.batched() && f_.input_batch > 0 && target[0].size == f_.input_batch && infer != 0) {
    symbolic = 0;
    known /= f_.input_batch;
    target[0].factor = 1;
  }
  const int64_t per_example = ts.size();
  if (infer >= 0) {
    const int64_t f = symbolic >= 0 ? target[symbolic].factor : 1;
    if (known == 0 || per_example % (known * f) != 0) {
      return Refuse(i, absl::StrCat(text, " does not fit ", ts.ToString(), " (", per_example, " values per example)"));
    }
    if (symbolic >= 0 || !ts.batched()) {
      target[infer].size = per_example / (known * f);
    } else {
      target[infer].factor = per_example / known;  // -1 takes the batch and the rest
    }
  }
  if (ts.batched() && symbolic < 0 && infer < 0) {
    return Refuse(i, absl::StrCat(text, " leaves no room for the batch (supported: the batch size as x.size(0), 0, "
                                        "or -1 with the other sizes fixed)"));
  }
  return ReshapeTo(i, *v, target);
}

absl::Status Mapper::MapConcat(int i) {
  const NodeProto& n = node(i);
  if (n.input_size() == 0) return Refuse(i, "no inputs");
  // Images stay images when every input can be one (C x H x W with the batch first); otherwise all plain.
  std::vector<int> inputs;
  bool images = true, any_image = false;
  for (int k = 0; k < n.input_size(); ++k) {
    ASSIGN_OR_RETURN(int t, Tensor(i, k));
    ASSIGN_OR_RETURN(const Value* v, Get(i, k));
    const TensorShape& s = b_->shape(t);
    images = images && s.dims.size() == 3 && s.batch_axis == 0 && v->span.empty();
    any_image = any_image || s.is_image();
  }
  std::vector<int> span;
  for (int k = 0; k < n.input_size(); ++k) {
    ASSIGN_OR_RETURN(int t, images && any_image ? ImageTensor(i, k) : PlainTensor(i, k));
    ASSIGN_OR_RETURN(const Value* v, Get(i, k));
    if (k == 0) span = v->span;
    if (v->span != span) {
      return Refuse(i, absl::StrCat("input ", k, " merges the batch with other rows where input 0 does not, or the "
                                    "other way round"));
    }
    inputs.push_back(t);
  }
  ASSIGN_OR_RETURN(const int axis, FullAxis(i, 0, AttrInt(n, "axis", 0), "axis"));
  Node c = Make(i, Op::kConcat);
  c.axis = axis;
  return Emit(i, std::move(c), std::move(inputs), {}, "", span);
}

}  // namespace dtrain::models::onnx
