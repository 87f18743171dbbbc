#include "worker/models/onnx/onnx_mapper.h"

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

absl::Status Mapper::SetInput(const DataGeometry* data) {
  const std::vector<int64_t>& fd = f_.input_dims;
  const std::string& name = f_.data_input;
  TensorShape input;
  bool reshape = false;
  int64_t per_example = 1;
  bool known = true;
  for (int64_t d : fd) {
    per_example *= d;
    known = known && d >= 0;
  }
  const bool ctr = data != nullptr && data->num_sparse > 0;
  if (name.empty()) {
    // A model of ids alone: the batch's dense features (or images) are an input nothing reads.
    input.dims = {data != nullptr ? data->channels * data->height * data->width : 1};
  } else if (ctr) {
    // Click-through-rate data: the dense features, one flat vector per example.
    input.dims = {data->channels * data->height * data->width};
    if (fd.size() != 1 || fd[0] != input.dims[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          f_.file, ": the model's input '", name, "' takes ", known ? ShapeText(fd) : "a symbolic shape of",
          " values per example but the data set has ", input.dims[0], " dense features; train it on data with ",
          known ? ShapeText(fd) : "that many", " dense features or export it for ", input.dims[0]));
    }
  } else if (data != nullptr) {
    input.dims = {data->channels, data->height, data->width};
    const std::string images = absl::StrCat(ShapeText(input.dims), " (C x H x W)");
    if (fd.size() == 3) {
      for (int k = 0; k < 3; ++k) {
        if (fd[k] >= 0 && fd[k] != input.dims[k]) {
          std::vector<std::string> want;
          for (int64_t d : fd) want.push_back(d >= 0 ? absl::StrCat(d) : "?");
          return absl::InvalidArgumentError(absl::StrCat(
              f_.file, ": the model's input '", name, "' takes ", absl::StrJoin(want, "x"),
              " images (C x H x W) but the data set's images are ", images,
              "; train it on data of its shape or export it for these images"));
        }
      }
    } else {
      if (!known || per_example != input.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            f_.file, ": the model's input '", name, "' takes ", known ? ShapeText(fd) : "a symbolic shape of",
            " values per example but the data set's images are ", images, ", ", input.size(),
            " values; train it on data of its size or export it for these images"));
      }
      reshape = true;
    }
  } else {
    if (!known) {
      return FileRefusal(f_.file, absl::StrCat("the input '", name, "' has symbolic sizes besides the batch axis "
                                               "(supported here: fixed sizes)"));
    }
    input.dims = fd;
  }
  b_ = std::make_unique<GraphBuilder>(f_.name, input,
                                      name.empty() ? "dense (not read)" : reshape ? name + ":images" : name);
  if (!name.empty()) {
    Value v;
    v.tensor = b_->input();
    if (reshape) {
      // Images flattened in ONNX's (C, H, W) order, as x.view(N, -1) does in PyTorch.
      ASSIGN_OR_RETURN(v.tensor, b_->Add(Node::Reshape(name + "/from_images", fd, FlattenOrder::kChannelsFirst),
                                         {b_->input()}, {}, name));
    }
    values_[name] = v;
  }
  for (const std::string& other : f_.other_inputs) {
    Value u;
    u.unavailable = "a graph input dtrain does not feed (it feeds the images or dense features and the int64 ids; "
                    "another one may only be the labels of a SoftmaxCrossEntropyLoss head)";
    values_[other] = u;
  }
  return SetIdsInput(data);
}

absl::StatusOr<Graph> Mapper::Run(const DataGeometry* data) {
  for (const auto& [name, c] : f_.initializers) {
    Value v;
    v.constant = c;
    values_[name] = v;
  }
  RETURN_IF_ERROR(SetInput(data));
  for (int i = 0; i < g_.node_size(); ++i) {
    if (fused_.count(i)) continue;
    RETURN_IF_ERROR(MapNode(i));
  }
  if (f_.outputs.empty()) return FileRefusal(f_.file, "the graph has no output");
  const std::string& out = f_.outputs[0];
  auto it = values_.find(out);
  const Value* v = it == values_.end() ? nullptr : &it->second;
  int logits = v == nullptr ? -1 : (o_.forward_only ? v->tensor : (v->head_of >= 0 ? v->head_of : v->tensor));
  if (v != nullptr && logits < 0 && !v->parts.empty()) {
    ASSIGN_OR_RETURN(logits, Stack(out, &values_[out]));
  }
  if (logits == b_->input()) {  // an op that changes nothing (a Transpose by the identity) over the input
    Node id;
    id.op = Op::kIdentity;
    id.name = out + "/identity";
    ASSIGN_OR_RETURN(logits, b_->Add(std::move(id), {logits}, {}, out));
  }
  if (logits < 0 || v->padded) {
    return FileRefusal(f_.file, absl::StrCat("the graph's output '", out, "' is not computed from its input ",
                                             "(supported: logits, or a softmax head over them, as the first output)"));
  }
  // One logit (N, 1) trains with sigmoid cross-entropy against 0/1 labels (click-through-rate data).
  const bool one_logit = b_->shape(logits).dims == std::vector<int64_t>{1} && !v->softmax_head;
  return b_->Finish(logits, o_.forward_only ? Loss::kNone
                            : one_logit     ? Loss::kSigmoidCrossEntropy
                                            : Loss::kSoftmaxCrossEntropy);
}

absl::Status Mapper::MapNode(int i) {
  const NodeProto& n = node(i);
  const std::string& op = n.op_type();
  // Identity of an initializer: how an eval-mode export aliases equal initializers (before folding takes it).
  if (op == "Identity") {
    ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
    if (v->constant != nullptr && !v->constant->initializer.empty()) {
      return Refuse(i, absl::StrCat("an alias of initializer '", v->constant->initializer,
                                    "' (an eval-mode export merges equal initializers into Identity aliases; "
                                    "supported: Identity of a tensor)"));
    }
  }
  // Values known at import: all inputs constant (and Shape, which reads only a tensor's dims). An op on a
  // parameter is folded only when it keeps the parameter's floats (a reshape, a 2-D transpose): Param and Tensor
  // then take the parameter's variable; anything else computes on it in the graph, so that it trains.
  bool all_constant = true, reads_param = false;
  int param_rank = 0;
  for (int k = 0; k < n.input_size(); ++k) {
    if (n.input(k).empty()) continue;
    ASSIGN_OR_RETURN(const Value* v, Get(i, k));
    all_constant = all_constant && v->constant != nullptr;
    if (v->constant != nullptr && v->constant->type == Const::Type::kFloat &&
        (!v->constant->param().empty() || !v->constant->transpose_of.empty())) {
      reads_param = true;
      param_rank = static_cast<int>(v->constant->dims.size());
    }
  }
  const bool keeps_param = op == "Reshape" || op == "Unsqueeze" || op == "Squeeze" || op == "Flatten" ||
                           op == "Identity" || (op == "Transpose" && param_rank == 2);
  if (op == "Shape" || op == "Constant" || (all_constant && n.input_size() > 0 && (!reads_param || keeps_param))) {
    return Fold(i);
  }

  // The ids input and embedding lookups (onnx_mapper_sparse.cc).
  if (op == "Gather") return MapGather(i);
  if (op == "Squeeze" || op == "Unsqueeze") return MapSqueeze(i);
  if (op == "ReduceSum" || op == "ReduceMean" || op == "ReduceMax") {
    ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
    if (!v->parts.empty()) return MapReduce(i);
    if (op == "ReduceMean") {
      ASSIGN_OR_RETURN(const bool fused, TryLayerNormPattern(i));
      if (fused) return absl::OkStatus();
    }
    return MapReduceOfTensor(i);
  }
  if (op == "Slice" || op == "Cast") {
    ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
    if (v->ids) return op == "Slice" ? MapSliceOfIds(i, *v) : MapCastOfIds(i, *v);
  }
  if (op == "Sigmoid") {
    ASSIGN_OR_RETURN(const bool head, MapSigmoidHead(i));
    if (head) return absl::OkStatus();
    ASSIGN_OR_RETURN(const bool fused, TrySiluPattern(i));
    if (fused) return absl::OkStatus();
  }
  if (op == "Div") {
    ASSIGN_OR_RETURN(const bool fused, TryGeluPattern(i));
    if (fused) return absl::OkStatus();
  }

  if (op == "Conv") return MapConv(i);
  if (op == "MaxPool" || op == "AveragePool") return MapPool(i);
  if (op == "GlobalAveragePool" || op == "GlobalMaxPool") return MapGlobalPool(i);
  if (op == "Gemm") return MapGemm(i);
  if (op == "MatMul") {
    ASSIGN_OR_RETURN(const Value* b, Get(i, 1));
    return b->constant != nullptr ? MapMatMul(i) : MapMatMulOfTensors(i);
  }
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div") return MapBinary(i);
  if (op == "Relu" || op == "LeakyRelu" || op == "Clip" || op == "Sigmoid" || op == "Tanh" || op == "HardSigmoid" ||
      op == "HardSwish" || op == "Erf" || op == "Sqrt" || op == "Pow") {
    return MapActivation(i);
  }
  if (op == "BatchNormalization") return MapBatchNorm(i);
  if (op == "Dropout") return MapDropout(i);
  if (op == "LRN") return MapLrn(i);
  if (op == "Flatten") return MapFlatten(i);
  if (op == "Reshape") return MapReshape(i);
  if (op == "Concat") return MapConcat(i);
  if (op == "Pad") return MapPad(i);
  if (op == "Transpose") return MapTranspose(i);
  if (op == "Einsum") return MapEinsum(i);
  if (op == "Slice") return MapSlice(i);
  if (op == "Split") return MapSplit(i);
  if (op == "Expand") return MapExpand(i);
  if (op == "Tile") return MapTile(i);
  if (op == "LayerNormalization") return MapLayerNorm(i);
  if (op == "SoftmaxCrossEntropyLoss") return MapHead(i);
  if (op == "Softmax" || op == "LogSoftmax") return IsSoftmaxHead(i) ? MapHead(i) : MapSoftmax(i);
  if (op == "Identity") {
    ASSIGN_OR_RETURN(int x, Tensor(i, 0));
    ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
    return Emit(i, Make(i, Op::kIdentity), {x}, {}, "", v->span);
  }
  if (op == "Cast" && AttrInt(n, "to", 0) == ::onnx::TensorProto::FLOAT) {  // float to float: nothing to do
    ASSIGN_OR_RETURN(int x, Tensor(i, 0));
    ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
    return Alias(i, x, v->span);
  }
  // Cast, ConstantOfShape, comparisons on data.
  return Refuse(i, absl::StrCat(op, " of a tensor computed from the input is not supported (supported: ", op,
                                " of constants, i.e. shape arithmetic)"));
}

bool Mapper::IsSoftmaxHead(int i) const {
  const NodeProto& n = node(i);
  if (o_.forward_only || !IsFinalOutput(n.output(0))) return false;
  auto v = values_.find(InputName(n, 0));
  if (v == values_.end() || v->second.tensor < 0 || !v->second.span.empty()) return false;
  const TensorShape& s = b_->shape(v->second.tensor);
  return s.dims.size() == 1 && s.batch_axis == 0;
}

absl::Status Mapper::Fold(int i) {
  const NodeProto& n = node(i);
  std::vector<ConstRef> out;
  if (n.op_type() == "Shape") {
    const Value* v = nullptr;
    ASSIGN_OR_RETURN(v, Get(i, 0));
    // The batch's element: its factor times the export's batch size (1 when dynamic).
    const int64_t batch = f_.input_batch > 0 ? f_.input_batch : 1;
    std::vector<int64_t> dims, factors;
    if (v->constant != nullptr) {
      dims = v->constant->dims;
    } else if (v->ids) {
      dims = {batch};
      factors = {1};
      if (v->ids_rank == 1) dims.push_back(static_cast<int64_t>(v->columns.size()));
    } else if (v->tensor < 0 && !v->parts.empty()) {  // a lookup not stacked yet: [N, k, dim]
      dims = {batch, static_cast<int64_t>(v->parts.size()), b_->shape(v->parts[0]).dims[0]};
      factors = {1};
    } else {
      ASSIGN_OR_RETURN(int t, Tensor(i, 0));  // a lookup's stack, a constant's tensor: made here
      (void)t;
      ASSIGN_OR_RETURN(v, Get(i, 0));
      for (const Dim& d : OnnxDims(*v)) {
        dims.push_back(d.batch() ? d.factor * batch : d.size);
        factors.push_back(d.factor);
      }
    }
    absl::StatusOr<ConstRef> shape = MakeShapeOf(n, dims, factors);
    if (!shape.ok()) return Refuse(i, shape.status().message());
    auto c = std::const_pointer_cast<Const>(*shape);
    if (v->constant != nullptr) c->batch.clear();  // a constant's dims are plain numbers
    out.push_back(c);
  } else {
    if (!IsFoldable(n.op_type())) {
      return Refuse(i, absl::StrCat(n.op_type(), " of constants is not supported (supported: shape arithmetic: "
                                                 "Constant, Shape, Gather, Unsqueeze, Squeeze, Concat, Slice, Cast, "
                                                 "Add, Sub, Mul, Div, Reshape, Flatten, Identity, ConstantOfShape)"));
    }
    std::vector<const Const*> in;
    for (int k = 0; k < n.input_size(); ++k) {
      ASSIGN_OR_RETURN(const Const* c, ConstIn(i, k));
      in.push_back(c);
    }
    absl::StatusOr<std::vector<ConstRef>> folded = FoldNode(n, in, f_.opset);
    if (!folded.ok()) return Refuse(i, folded.status().message());
    out = *std::move(folded);
  }
  for (size_t k = 0; k < out.size() && static_cast<int>(k) < n.output_size(); ++k) {
    Value v;
    v.constant = out[k];
    values_[n.output(k)] = v;
  }
  return absl::OkStatus();
}

absl::Status Mapper::MapConv(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const ImageInput x, ImageInputOf(i));
  ASSIGN_OR_RETURN(VarSpec w, Param(i, 1, "weight"));
  if (w.shape.size() != 4) {
    return Refuse(i, absl::StrCat("its weight '", w.name, "' has shape ", ShapeText(w.shape),
                                  " (supported: 2-D convolutions, a 4-D weight [out, in / group, kH, kW])"));
  }
  const std::vector<int64_t> kernel = {w.shape[2], w.shape[3]};
  const std::vector<int64_t> ks = AttrInts(n, "kernel_shape");
  if (!ks.empty() && ks != kernel) {
    return Refuse(i, absl::StrCat("attribute kernel_shape=[", absl::StrJoin(ks, ","), "] does not match its weight ",
                                  ShapeText(w.shape)));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> strides, Pair(i, "strides", 1));
  ASSIGN_OR_RETURN(std::vector<int64_t> dilations, Pair(i, "dilations", 1));
  const TensorShape& in = b_->shape(x.tensor);
  if (!in.is_image()) {
    return Refuse(i, absl::StrCat("its input has shape ", ShapeText(in.dims), " per example (supported: C x H x W images)"));
  }
  Node c = Make(i, Op::kConv);
  kernels::Conv2DParams& p = c.conv;
  p.k_h = static_cast<int>(kernel[0]);
  p.k_w = static_cast<int>(kernel[1]);
  p.out_c = static_cast<int>(w.shape[0]);
  p.stride_h = static_cast<int>(strides[0]);
  p.stride_w = static_cast<int>(strides[1]);
  p.dilation_h = static_cast<int>(dilations[0]);
  p.dilation_w = static_cast<int>(dilations[1]);
  p.groups = static_cast<int>(AttrInt(n, "group", 1));
  p.weight_layout = kernels::WeightLayout::kOIHW;
  p.explicit_padding = true;
  int64_t top, left, bottom, right;
  RETURN_IF_ERROR(SpatialPads(i, in.dims[1] + x.pad_top + x.pad_bottom, in.dims[2] + x.pad_left + x.pad_right, kernel,
                              strides, dilations, &top, &left, &bottom, &right));
  p.pad_top = static_cast<int>(top + x.pad_top);
  p.pad_left = static_cast<int>(left + x.pad_left);
  p.pad_bottom = static_cast<int>(bottom + x.pad_bottom);
  p.pad_right = static_cast<int>(right + x.pad_right);
  std::vector<VarSpec> vars = {std::move(w)};
  if (!InputName(n, 2).empty()) {
    ASSIGN_OR_RETURN(VarSpec bias, Param(i, 2, "bias"));
    vars.push_back(std::move(bias));
  }
  return Emit(i, std::move(c), {x.tensor}, std::move(vars));
}

absl::Status Mapper::MapPool(int i) {
  const NodeProto& n = node(i);
  const bool max = n.op_type() == "MaxPool";
  ASSIGN_OR_RETURN(const ImageInput x, ImageInputOf(i));
  const std::vector<int64_t> kernel = AttrInts(n, "kernel_shape");
  if (kernel.size() != 2) {
    return Refuse(i, absl::StrCat("attribute kernel_shape=[", absl::StrJoin(kernel, ","),
                                  "] is not supported (supported: 2-D pooling, two values)"));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> strides, Pair(i, "strides", 1));
  ASSIGN_OR_RETURN(std::vector<int64_t> dilations, Pair(i, "dilations", 1));
  if (dilations[0] != 1 || dilations[1] != 1) {
    return Refuse(i, absl::StrCat("attribute dilations=[", absl::StrJoin(dilations, ","),
                                  "] is not supported (supported: 1, 1)"));
  }
  const TensorShape& in = b_->shape(x.tensor);
  if (!in.is_image()) {
    return Refuse(i, absl::StrCat("its input has shape ", ShapeText(in.dims), " per example (supported: C x H x W images)"));
  }
  Node p = Make(i, max ? Op::kMaxPool : Op::kAvgPool);
  kernels::PoolParams& pp = p.pool;
  pp.window = pp.window_h = static_cast<int>(kernel[0]);
  pp.window_w = static_cast<int>(kernel[1]);
  pp.stride = pp.stride_h = static_cast<int>(strides[0]);
  pp.stride_w = static_cast<int>(strides[1]);
  pp.explicit_padding = true;
  pp.ceil_mode = AttrInt(n, "ceil_mode", 0) != 0;
  pp.count_include_pad = !max && AttrInt(n, "count_include_pad", 0) != 0;
  int64_t top, left, bottom, right;
  RETURN_IF_ERROR(SpatialPads(i, in.dims[1] + x.pad_top + x.pad_bottom, in.dims[2] + x.pad_left + x.pad_right, kernel,
                              strides, {1, 1}, &top, &left, &bottom, &right));
  if (x.padded) {
    // The Pad's zeros are part of the input: they count in every window's divisor.
    if (!pp.count_include_pad && (top || left || bottom || right)) {
      return Refuse(i, "a Pad before an AveragePool with its own pads and count_include_pad=0 is not supported "
                       "(supported: a Pad before an AveragePool without pads, or with count_include_pad=1)");
    }
    pp.count_include_pad = true;
  }
  pp.pad_top = static_cast<int>(top + x.pad_top);
  pp.pad_left = static_cast<int>(left + x.pad_left);
  pp.pad_bottom = static_cast<int>(bottom + x.pad_bottom);
  pp.pad_right = static_cast<int>(right + x.pad_right);
  if (max) Unavailable(i, 1, "MaxPool's Indices, which dtrain does not compute");
  return Emit(i, std::move(p), {x.tensor}, {});
}

absl::Status Mapper::MapGlobalPool(int i) {
  const bool max = node(i).op_type() == "GlobalMaxPool";
  ASSIGN_OR_RETURN(int x, ImageTensor(i, 0));
  const TensorShape& in = b_->shape(x);
  if (!in.is_image()) {
    return Refuse(i, absl::StrCat("its input has shape ", ShapeText(in.dims), " per example (supported: C x H x W images)"));
  }
  Node p = Make(i, max ? Op::kMaxPool : Op::kAvgPool);
  p.pool.window = p.pool.window_h = static_cast<int>(in.dims[1]);
  p.pool.window_w = static_cast<int>(in.dims[2]);
  p.pool.stride = p.pool.stride_h = p.pool.stride_w = 1;
  p.pool.explicit_padding = true;
  return Emit(i, std::move(p), {x}, {});
}

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

absl::Status Mapper::MapBatchNorm(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  if (b_->shape(x).dims.size() == 3) {
    ASSIGN_OR_RETURN(x, ImageTensor(i, 0));
  }
  std::vector<VarSpec> vars;
  const char* roles[] = {"scale", "bias", "running mean", "running variance"};
  for (int k = 1; k <= 4; ++k) {
    ASSIGN_OR_RETURN(VarSpec v, Param(i, k, roles[k - 1], /*state=*/k >= 3));
    vars.push_back(std::move(v));
  }
  Node bn = Make(i, Op::kBatchNorm);
  bn.epsilon = AttrFloat(n, "epsilon", 1e-5f);
  // ONNX's momentum weighs the running statistics, PyTorch's (ours) the batch's.
  bn.momentum = static_cast<float>(1.0 - static_cast<double>(AttrFloat(n, "momentum", 0.9f)));
  bn.unbiased_running_var = o_.bn_unbiased_running_var;
  Unavailable(i, 1, "one of BatchNormalization's running statistics, which are variables of the model in dtrain, "
                    "not tensors");
  return Emit(i, std::move(bn), {x}, std::move(vars));
}

absl::Status Mapper::MapDropout(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  float ratio = 0.5f;
  if (f_.opset >= 12) {
    ASSIGN_OR_RETURN(const Const* r, ConstIn(i, 1));
    if (r != nullptr) {
      if (r->size() != 1) return Refuse(i, "its ratio must be one value");
      ratio = static_cast<float>(r->at(0));
    }
    ASSIGN_OR_RETURN(const Const* training, ConstIn(i, 2));  // constant or omitted; dtrain trains with dropout
    (void)training;
  } else {
    ratio = AttrFloat(n, "ratio", 0.5f);
  }
  if (!(ratio >= 0.0f && ratio < 1.0f)) {
    return Refuse(i, absl::StrCat("ratio ", ratio, " is not supported (supported: 0 <= ratio < 1)"));
  }
  Unavailable(i, 1, "Dropout's mask, which dtrain does not expose");
  ASSIGN_OR_RETURN(const Value* xv, Get(i, 0));
  return Emit(i, Node::Dropout(NodeName(n, i), 1.0f - ratio), {x}, {}, "", xv->span);
}

absl::Status Mapper::MapLrn(int i) {
  const NodeProto& n = node(i);
  ASSIGN_OR_RETURN(int x, ImageTensor(i, 0));
  const int64_t size = AttrInt(n, "size", 0);
  if (size < 1 || size % 2 == 0) {
    return Refuse(i, absl::StrCat("attribute size=", size, " is not supported (supported: odd sizes, a window "
                                                           "centred on each channel)"));
  }
  // ONNX divides alpha by the window's size; TensorFlow's LRN (ours) does not.
  const float alpha = AttrFloat(n, "alpha", 1e-4f) / static_cast<float>(size);
  return Emit(i, Node::Lrn(NodeName(n, i), static_cast<int>((size - 1) / 2), AttrFloat(n, "bias", 1.0f), alpha,
                           AttrFloat(n, "beta", 0.75f)),
              {x}, {});
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

absl::Status Mapper::MapPad(int i) {
  const NodeProto& n = node(i);
  {
    // Pads of zero (any mode, any tensor) change nothing: Swin's F.pad to a multiple of its window when the
    // image already is one.
    ASSIGN_OR_RETURN(const Const* pads, ConstIn(i, 1));
    bool none = pads != nullptr && pads->size() > 0;
    for (int64_t k = 0; none && k < pads->size(); ++k) none = pads->at(k) == 0.0;
    if (none) {
      ASSIGN_OR_RETURN(int t, Tensor(i, 0));
      ASSIGN_OR_RETURN(const Value* v, Get(i, 0));
      return Alias(i, t, v->span);
    }
  }
  ASSIGN_OR_RETURN(int x, ImageTensor(i, 0));
  const std::string mode = AttrString(n, "mode", "constant");
  if (mode != "constant") {
    return Refuse(i, absl::StrCat("attribute mode=", mode, " is not supported (supported: constant zeros)"));
  }
  ASSIGN_OR_RETURN(const Const* pads, ConstIn(i, 1));
  ASSIGN_OR_RETURN(const Const* value, ConstIn(i, 2));
  if (value != nullptr && (value->size() != 1 || value->at(0) != 0.0)) {
    return Refuse(i, "its constant_value is not 0 (supported: zero padding)");
  }
  const TensorShape& in = b_->shape(x);
  if (pads == nullptr || !in.is_image() || pads->size() != 8) {
    return Refuse(i, "its pads are not 8 constants of a C x H x W image (supported: zero padding of H and W)");
  }
  const std::vector<int64_t> p = {static_cast<int64_t>(pads->at(0)), static_cast<int64_t>(pads->at(1)),
                                  static_cast<int64_t>(pads->at(2)), static_cast<int64_t>(pads->at(3)),
                                  static_cast<int64_t>(pads->at(4)), static_cast<int64_t>(pads->at(5)),
                                  static_cast<int64_t>(pads->at(6)), static_cast<int64_t>(pads->at(7))};
  if (p[0] || p[1] || p[4] || p[5] || p[2] < 0 || p[3] < 0 || p[6] < 0 || p[7] < 0) {
    return Refuse(i, absl::StrCat("pads [", absl::StrJoin(p, ","),
                                  "] are not supported (supported: non-negative pads of H and W only)"));
  }
  const std::string& out = n.output(0);
  const int reader = IsGraphOutput(out) ? -1 : SoleReader(out);
  const bool fits = reader >= 0 && (node(reader).op_type() == "Conv" || node(reader).op_type() == "AveragePool") &&
                    node(reader).input(0) == out;
  if (!fits) {
    return Refuse(i, "its output is not read by exactly one Conv or AveragePool (supported: a Pad merged into the "
                     "Conv or AveragePool after it, as PyTorch exports AvgPool2d(padding=p))");
  }
  Value v;
  v.tensor = x;
  v.padded = true;
  v.pad_top = p[2];
  v.pad_left = p[3];
  v.pad_bottom = p[6];
  v.pad_right = p[7];
  values_[out] = v;
  return absl::OkStatus();
}

absl::Status Mapper::MapHead(int i) {
  const NodeProto& n = node(i);
  const std::string& op = n.op_type();
  if (o_.forward_only) {
    return Refuse(i, absl::StrCat(op, " is not computed (supported only as the model's head, which training strips)"));
  }
  ASSIGN_OR_RETURN(int x, Tensor(i, 0));
  const std::vector<int64_t>& dims = b_->shape(x).dims;
  if (dims.size() != 1) {
    return Refuse(i, absl::StrCat("its input has shape ", ShapeText(dims), " per example (supported: class logits, a "
                                                                        "flat vector per example)"));
  }
  if (op == "SoftmaxCrossEntropyLoss") {
    if (FindAttr(n, "ignore_index") != nullptr || !InputName(n, 2).empty()) {
      return Refuse(i, "ignore_index and class weights are not supported (supported: the plain mean loss)");
    }
    const std::string reduction = AttrString(n, "reduction", "mean");
    if (reduction != "mean") {
      return Refuse(i, absl::StrCat("attribute reduction=", reduction, " is not supported (supported: mean)"));
    }
    if (f_.other_inputs.count(InputName(n, 1)) == 0) {
      return Refuse(i, "its labels are not a graph input (supported: the labels as the graph's second input)");
    }
  } else {
    int64_t axis = AttrInt(n, "axis", f_.opset >= 13 ? -1 : 1);
    if (axis < 0) axis += 2;
    if (axis != 1) {
      return Refuse(i, absl::StrCat("attribute axis=", AttrInt(n, "axis", 0),
                                    " is not supported (supported: the class axis, 1 or -1)"));
    }
  }
  // Nothing may read the head's outputs; the graph's output is then the logits.
  for (int k = 0; k < n.output_size(); ++k) {
    auto readers = f_.readers.find(n.output(k));
    if (readers != f_.readers.end() && !readers->second.empty()) {
      const int j = readers->second[0];
      return Refuse(i, absl::StrCat("its output '", n.output(k), "' is read by node '", NodeName(node(j), j),
                                    "' (supported: ", op, " only as the model's head, the graph's last node)"));
    }
    Value v;
    v.head_of = x;
    v.softmax_head = true;
    values_[n.output(k)] = v;
  }
  return absl::OkStatus();
}

absl::StatusOr<Graph> MapGraph(const OnnxFile& f, const ImportOptions& options, const DataGeometry* data) {
  Mapper m(f, options);
  return m.Run(data);
}

}  // namespace dtrain::models::onnx
