// The mapper's walk over an ONNX graph (onnx_mapper_internal.h): the data input, each node to its mapping,
// constants folded, the stripped head; MapGraph. The per-op mappings are in onnx_mapper_image.cc,
// onnx_mapper_dense.cc, onnx_mapper_tensor.cc and onnx_mapper_sparse.cc; values and nodes in onnx_mapper_values.cc.
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
