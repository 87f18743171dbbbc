// The mapper's values and nodes (onnx_mapper_internal.h): a node's inputs as values, tensors, images, constants
// and variables; the graph's nodes made and named; attributes read (pairs, spatial pads).
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

namespace {

// SAME padding of one dimension (ONNX's auto_pad): {before, after}.
std::pair<int64_t, int64_t> SamePads(int64_t in, int64_t k, int64_t stride, int64_t dilation, bool upper) {
  const int64_t out = (in + stride - 1) / stride;
  const int64_t dk = (k - 1) * dilation + 1;
  const int64_t total = std::max<int64_t>(0, (out - 1) * stride + dk - in);
  const int64_t small = total / 2;
  return upper ? std::make_pair(small, total - small) : std::make_pair(total - small, small);
}

}  // namespace

absl::StatusOr<const Value*> Mapper::Get(int i, int k) const {
  const std::string name = InputName(node(i), k);
  auto it = values_.find(name);
  if (name.empty() || it == values_.end()) {
    return Refuse(i, absl::StrCat("input ", k, " ('", name, "') is not computed by any earlier node"));
  }
  return &it->second;
}

absl::StatusOr<int> Mapper::Tensor(int i, int k) {
  ASSIGN_OR_RETURN(const Value* v, Get(i, k));
  const std::string name = InputName(node(i), k);
  if (!v->unavailable.empty()) return Refuse(i, absl::StrCat("input '", name, "' is ", v->unavailable));
  if (v->head_of >= 0 && v->softmax_head) {
    return Refuse(i, absl::StrCat("reads '", name, "', the output of the softmax head (supported: Softmax, LogSoftmax "
                                               "and SoftmaxCrossEntropyLoss only as the graph's last node)"));
  }
  if (v->head_of >= 0) {
    return Refuse(i, absl::StrCat("reads '", name, "', the model's one logit squeezed or through its Sigmoid head "
                                               "(supported: Squeeze and Sigmoid of one logit only at the graph's "
                                               "output)"));
  }
  if (v->ids) return RefuseComputedIds(i, k);
  if (v->tensor < 0 && !v->parts.empty()) return Stack(name, &values_[name]);
  if (v->padded) {
    return Refuse(i, absl::StrCat("reads '", name, "', the output of a Pad (supported: Pad only before a Conv or an "
                                               "AveragePool)"));
  }
  if (v->tensor >= 0) return v->tensor;
  if (v->constant == nullptr) return Refuse(i, absl::StrCat("input '", name, "' is not a tensor"));
  // A constant read as a tensor: an initializer's variable (trainable unless it is state), or a constant.
  const Const& c = *v->constant;
  if (c.type != Const::Type::kFloat) {
    return Refuse(i, absl::StrCat("input '", name, "' is an integer constant (supported: integers only as indices, "
                                  "shapes and axes)"));
  }
  const std::string& param = c.transpose_of.empty() ? c.param() : c.transpose_of;
  auto cached = variable_tensor_.find(param.empty() ? name : param);
  int t = -1;
  if (cached != variable_tensor_.end()) {
    t = cached->second;
  } else {
    const std::string key = param.empty() ? name : param;
    VarSpec var("", {}, {});
    if (!param.empty()) {
      // The initializer itself, under its name and dims, whatever view of it this value is.
      const Const& whole = *f_.initializers.at(param);
      if (tables_.count(param)) {
        return Refuse(i, absl::StrCat("reads the embedding table '", param, "' as a tensor (supported: a table that "
                                      "only Gather reads by the ids)"));
      }
      if (var_names_.count(param)) {
        return Refuse(i, absl::StrCat("reads '", param, "', a weight of another node, as a tensor (shared weights "
                                      "are not supported)"));
      }
      if (whole.data_type != ::onnx::TensorProto::FLOAT) {
        return Refuse(i, absl::StrCat("reads '", param, "' of type ", DataTypeName(whole.data_type),
                                      " (supported: FLOAT)"));
      }
      if (param.rfind("onnx::", 0) == 0) {
        return Refuse(i, absl::StrCat("reads '", param, "', not a parameter of the PyTorch module but a value the "
                                      "exporter made (an eval-mode export; supported: parameters under their "
                                      "state_dict names)"));
      }
      Initializer init;
      init.kind = Initializer::Kind::kValues;
      init.values = whole.floats;
      var_names_.insert(param);
      var = VarSpec(param, whole.dims, std::move(init), 0.0f, /*trainable=*/true);
    } else {
      ASSIGN_OR_RETURN(var, Param(i, k, "operand"));
    }
    Node n = Make(i, Op::kVariable);
    n.name = absl::StrCat(var.name, "/tensor");
    const std::string tensor_name = var.name + "/tensor";
    ASSIGN_OR_RETURN(t, b_->Add(std::move(n), {}, {std::move(var)}, tensor_name));
    variable_tensor_[key] = t;
  }
  // The value as the node reads it: the initializer's transpose or another shape of it.
  const std::vector<int64_t>& dims = b_->shape(t).dims;
  if (!c.transpose_of.empty()) {
    auto found = image_of_.find(name + "#transposed");
    if (found != image_of_.end()) return found->second;
    Node tr = Make(i, Op::kTranspose);
    tr.name = absl::StrCat(c.transpose_of, "/transposed");
    tr.perm = {1, 0};
    ASSIGN_OR_RETURN(int out, b_->Add(std::move(tr), {t}, {}, name + "#transposed"));
    image_of_[name + "#transposed"] = out;
    return out;
  }
  if (dims != c.dims) {
    Node r = Node::Reshape(absl::StrCat(param.empty() ? name : param, "/as_", ShapeText(c.dims)), c.dims,
                           FlattenOrder::kChannelsFirst);
    r.plain = true;
    return b_->Add(std::move(r), {t}, {}, name + "#reshaped");
  }
  return t;
}

absl::StatusOr<int> Mapper::ImageTensor(int i, int k) {
  ASSIGN_OR_RETURN(const int t, Tensor(i, k));
  const TensorShape& s = b_->shape(t);
  if (s.is_image()) return t;
  ASSIGN_OR_RETURN(const Value* v, Get(i, k));
  const std::string name = InputName(node(i), k);
  if (s.dims.size() != 3 || s.batch_axis != 0 || !v->span.empty()) {
    return Refuse(i, absl::StrCat("its input '", name, "' has shape ", s.ToString(),
                                  " per example (supported: C x H x W images)"));
  }
  auto found = image_of_.find(name);
  if (found != image_of_.end()) return found->second;
  Node r = Node::Reshape(name + "/as_image", s.dims, FlattenOrder::kChannelsFirst);
  r.plain = false;
  ASSIGN_OR_RETURN(const int out, b_->Add(std::move(r), {t}, {}, name + "#image"));
  image_of_[name] = out;
  return out;
}

absl::StatusOr<int> Mapper::PlainTensor(int i, int k) {
  ASSIGN_OR_RETURN(const int t, Tensor(i, k));
  const TensorShape& s = b_->shape(t);
  if (!s.is_image()) return t;
  const std::string name = InputName(node(i), k);
  auto found = plain_of_.find(name);
  if (found != plain_of_.end()) return found->second;
  Node r = Node::Reshape(name + "/as_plain", s.dims, FlattenOrder::kChannelsFirst);
  r.plain = true;
  ASSIGN_OR_RETURN(const int out, b_->Add(std::move(r), {t}, {}, name + "#plain"));
  plain_of_[name] = out;
  return out;
}

absl::StatusOr<Mapper::ImageInput> Mapper::ImageInputOf(int i) {
  ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
  ImageInput in;
  if (v->padded) {  // MapPad: the Pad's input tensor and its pads
    in.tensor = v->tensor;
    in.padded = true;
    in.pad_top = v->pad_top;
    in.pad_left = v->pad_left;
    in.pad_bottom = v->pad_bottom;
    in.pad_right = v->pad_right;
    return in;
  }
  ASSIGN_OR_RETURN(in.tensor, ImageTensor(i, 0));
  return in;
}

absl::StatusOr<const Const*> Mapper::ConstIn(int i, int k) const {
  if (InputName(node(i), k).empty()) return nullptr;
  ASSIGN_OR_RETURN(const Value* v, Get(i, k));
  if (v->constant == nullptr) {
    return Refuse(i, absl::StrCat("input ", k, " ('", InputName(node(i), k),
                                  "') is computed from the data (supported: a constant or an initializer)"));
  }
  return v->constant.get();
}

absl::StatusOr<VarSpec> Mapper::Param(int i, int k, const char* role, bool state) {
  const std::string name = InputName(node(i), k);
  ASSIGN_OR_RETURN(const Value* v, Get(i, k));
  if (v->constant == nullptr) {
    return Refuse(i, absl::StrCat("its ", role, " '", name, "' is computed by the graph (supported: an initializer)"));
  }
  const Const& c = *v->constant;
  if (tables_.count(c.param())) {
    return Refuse(i, absl::StrCat("its ", role, " '", name, "' is an embedding table (a Gather reads it), whose rows "
                                  "live on the ps (supported: a table that only Gather reads)"));
  }
  if (!c.transpose_of.empty()) {
    return Refuse(i, absl::StrCat("its ", role, " '", name, "' is the transpose of the initializer '", c.transpose_of,
                                  "' (supported: a transposed weight as the B of MatMul)"));
  }
  if (c.type != Const::Type::kFloat || c.data_type != ::onnx::TensorProto::FLOAT) {
    return Refuse(i, absl::StrCat("its ", role, " '", name, "' has type ", DataTypeName(c.data_type),
                                  " (supported: FLOAT)"));
  }
  Initializer init;
  init.kind = Initializer::Kind::kValues;
  init.values = c.floats;
  if (!c.param().empty()) {
    // The initializer (or a reshaped view of it: its variable, in this shape; export writes its own dims).
    const std::string& param = c.param();
    if (param.rfind("onnx::", 0) == 0) {
      return Refuse(i, absl::StrCat("its ", role, " '", param,
                                    "' is not a parameter of the PyTorch module but a value the exporter made (an "
                                    "eval-mode export that folded BatchNorm into Conv; supported: parameters under "
                                    "their state_dict names)"));
    }
    var_names_.insert(param);
    return VarSpec(param, c.dims, std::move(init), 0.0f, /*trainable=*/!state);
  }
  // A Constant's value (or folded arithmetic): a constant variable, named after the value (a second reader
  // gets its own copy).
  std::string var = name;
  for (int n = 2; var_names_.count(var); ++n) var = absl::StrCat(name, "#", n);
  var_names_.insert(var);
  return VarSpec(var, c.dims, std::move(init), 0.0f, /*trainable=*/false);
}

Node Mapper::Make(int i, Op op) const {
  Node n;
  n.op = op;
  n.name = NodeName(node(i), i);
  return n;
}

absl::Status Mapper::Emit(int i, Node n, std::vector<int> inputs, std::vector<VarSpec> vars, std::string out,
                          std::vector<int> span) {
  if (out.empty()) out = node(i).output(0);
  ASSIGN_OR_RETURN(int t, b_->Add(std::move(n), std::move(inputs), std::move(vars), out));
  return Alias(i, t, std::move(span), out);
}

absl::Status Mapper::Alias(int i, int t, std::vector<int> span, std::string out) {
  if (out.empty()) out = node(i).output(0);
  Value v;
  v.tensor = t;
  v.span = std::move(span);
  values_[out] = v;
  // ONNX's shape inference, where it knows the shape, must agree (the batch aside). Except after a ceil_mode
  // pooling whose last window would start in the padding: dtrain drops it, as PyTorch does, ONNX 1.12's
  // inference does not, and every shape after it differs.
  auto it = f_.inferred.find(out);
  if (!check_inferred_ || it == f_.inferred.end() || it->second.empty()) return absl::OkStatus();
  const std::vector<Dim> dims = OnnxDims(v);
  bool differs = dims.size() != it->second.size();
  for (size_t k = 0; !differs && k < dims.size(); ++k) {
    const int64_t want = it->second[k];
    if (want < 0) continue;
    if (dims[k].batch()) {
      differs = f_.input_batch > 0 && want != dims[k].factor * f_.input_batch;
    } else {
      differs = want != dims[k].size;
    }
  }
  if (!differs) return absl::OkStatus();
  const bool ceil_pool = (node(i).op_type() == "MaxPool" || node(i).op_type() == "AveragePool") &&
                         AttrInt(node(i), "ceil_mode", 0) != 0;
  if (ceil_pool) {
    check_inferred_ = false;
    return absl::OkStatus();
  }
  std::vector<std::string> ours, theirs;
  for (const Dim& d : dims) ours.push_back(d.batch() ? (d.factor == 1 ? "N" : absl::StrCat(d.factor, "N")) : absl::StrCat(d.size));
  for (int64_t d : it->second) theirs.push_back(d < 0 ? "?" : absl::StrCat(d));
  return absl::InternalError(absl::StrCat(f_.file, ": node '", NodeName(node(i), i), "' (", node(i).op_type(),
                                          "): dtrain computes shape [", absl::StrJoin(ours, ","),
                                          "] where ONNX's shape inference gives [", absl::StrJoin(theirs, ","), "]"));
}

void Mapper::Unavailable(int i, int first, const std::string& why) {
  for (int k = first; k < node(i).output_size(); ++k) {
    if (node(i).output(k).empty()) continue;
    Value v;
    v.unavailable = why;
    values_[node(i).output(k)] = v;
  }
}

absl::StatusOr<std::vector<int64_t>> Mapper::Pair(int i, const char* name, int64_t fallback) const {
  std::vector<int64_t> v = AttrInts(node(i), name);
  if (v.empty()) return std::vector<int64_t>{fallback, fallback};
  if (v.size() != 2) {
    return Refuse(i, absl::StrCat("attribute ", name, "=[", absl::StrJoin(v, ","), "] is not supported (supported: ",
                                  "two values, 2-D images)"));
  }
  return v;
}

absl::Status Mapper::SpatialPads(int i, int64_t in_h, int64_t in_w, const std::vector<int64_t>& kernel,
                                 const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                                 int64_t* top, int64_t* left, int64_t* bottom, int64_t* right) {
  const std::string auto_pad = AttrString(node(i), "auto_pad", "NOTSET");
  if (auto_pad == "NOTSET") {
    std::vector<int64_t> pads = AttrInts(node(i), "pads");
    if (pads.empty()) pads = {0, 0, 0, 0};
    if (pads.size() != 4) {
      return Refuse(i, absl::StrCat("attribute pads=[", absl::StrJoin(pads, ","),
                                    "] is not supported (supported: four values, 2-D images)"));
    }
    for (int64_t p : pads) {
      if (p < 0) return Refuse(i, absl::StrCat("attribute pads=[", absl::StrJoin(pads, ","), "] has a negative pad"));
    }
    *top = pads[0], *left = pads[1], *bottom = pads[2], *right = pads[3];
  } else if (auto_pad == "VALID") {
    *top = *left = *bottom = *right = 0;
  } else if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
    const bool upper = auto_pad == "SAME_UPPER";
    std::tie(*top, *bottom) = SamePads(in_h, kernel[0], strides[0], dilations[0], upper);
    std::tie(*left, *right) = SamePads(in_w, kernel[1], strides[1], dilations[1], upper);
  } else {
    return Refuse(i, absl::StrCat("attribute auto_pad=", auto_pad,
                                  " is not supported (supported: NOTSET, VALID, SAME_UPPER, SAME_LOWER)"));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::models::onnx
