#include "worker/models/onnx/onnx_file.h"

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "onnx/checker.h"
#include "onnx/shape_inference/implementation.h"
#include "worker/models/onnx/onnx_attributes.h"
#include "worker/models/onnx/onnx_external_data.h"

namespace dtrain::models::onnx {

const char kExportHint[] =
    "export from PyTorch with model.train() and torch.onnx.export(..., training=torch.onnx.TrainingMode.TRAINING, "
    "do_constant_folding=False, opset_version=11..17, dynamic_axes={'x': {0: 'N'}})";

namespace {

// The ops the mapper computes, the head it strips and the constant arithmetic it folds.
const std::set<std::string>& ComputedOps() {
  static const std::set<std::string> ops = {
      // Computed on tensors.
      "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Gemm", "MatMul", "Add", "Sub",
      "Mul", "Div", "Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Erf", "Sqrt", "Pow",
      "BatchNormalization", "LayerNormalization", "Dropout", "LRN", "Flatten", "Reshape", "Concat", "Identity",
      "Pad", "Transpose", "Einsum", "Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss", "ReduceSum", "ReduceMean",
      "ReduceMax", "Gather", "Slice", "Split", "Expand", "Tile", "Squeeze", "Unsqueeze", "Cast",
      // Shape arithmetic and constants (folded at import).
      "Constant", "Shape", "ConstantOfShape", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And",
      "Or", "Not", "Neg", "Abs", "Reciprocal", "Exp", "Log", "Floor", "Ceil", "Where", "Range", "Mod",
      "ScatterND"};
  return ops;
}

// One line without the newlines ONNX's messages carry.
std::string OneLine(absl::string_view text) {
  std::string s = absl::StrReplaceAll(text, {{"\r", " "}, {"\n", " "}});
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::vector<int64_t> DimsOf(const ::onnx::TypeProto& type) {
  std::vector<int64_t> dims;
  if (!type.has_tensor_type() || !type.tensor_type().has_shape()) return dims;
  for (const auto& d : type.tensor_type().shape().dim()) dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
  return dims;
}

bool IsInteger(int elem_type) {
  switch (elem_type) {
    case ::onnx::TensorProto::INT8: case ::onnx::TensorProto::INT16: case ::onnx::TensorProto::INT32:
    case ::onnx::TensorProto::INT64: case ::onnx::TensorProto::UINT8: case ::onnx::TensorProto::UINT16:
    case ::onnx::TensorProto::UINT32: case ::onnx::TensorProto::UINT64:
      return true;
    default:
      return false;
  }
}

// Whether a Loop's body looks up rows (a Gather of an outer value and a reduction): nn.EmbeddingBag's export.
bool IsEmbeddingBagLoop(const ::onnx::NodeProto& n) {
  bool gather = false, reduce = false;
  for (const ::onnx::AttributeProto& a : n.attribute()) {
    if (!a.has_g()) continue;
    for (const ::onnx::NodeProto& b : a.g().node()) {
      gather = gather || b.op_type() == "Gather";
      reduce = reduce || b.op_type() == "ReduceSum" || b.op_type() == "ReduceMean" || b.op_type() == "ReduceMax";
    }
  }
  return gather && reduce;
}

constexpr char kEmbeddingBagHint[] =
    "nn.EmbeddingBag exports as a Loop (or, with ATen fallback, an ATen op) dtrain cannot train; supported: "
    "nn.Embedding on int64 ids [N] or [N, F], then .sum(1) or .mean(1) for a bag of F ids";

}  // namespace

const std::string& SupportedOpsText() {
  static const std::string text =
      "supported: Conv, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool, Gemm, MatMul (by a weight or of two "
      "tensors), Einsum of batched matrix products, Add, Sub, Mul, Div, Relu, LeakyRelu, Clip, Sigmoid, Tanh, "
      "HardSigmoid, HardSwish, Erf, Sqrt, Pow by a constant, BatchNormalization, LayerNormalization, Dropout, LRN, "
      "Flatten, Reshape, Transpose, Concat, Split, Slice, Gather and Expand/Tile of tensors, "
      "ReduceMean/ReduceMax/ReduceSum, Softmax/LogSoftmax, Identity, Pad before Conv/AveragePool, "
      "SoftmaxCrossEntropyLoss as the head, Gather of an embedding initializer by the int64 ids input (columns "
      "picked with Gather/Slice/Squeeze/Unsqueeze), Squeeze/Unsqueeze, and shape arithmetic on constants (Constant, "
      "Shape, Gather, Unsqueeze, Squeeze, Slice, Cast, ConstantOfShape, Range, Where, ScatterND, comparisons and "
      "arithmetic)";
  return text;
}

std::string NodeName(const ::onnx::NodeProto& n, int index) {
  return n.name().empty() ? absl::StrCat(n.op_type(), "_", index) : n.name();
}

absl::Status NodeRefusal(const OnnxFile& f, int node, absl::string_view what) {
  const ::onnx::NodeProto& n = f.model->graph().node(node);
  return absl::InvalidArgumentError(
      absl::StrCat(f.file, ": node '", NodeName(n, node), "' (", n.op_type(), "): ", what, "; ", kExportHint));
}

absl::Status FileRefusal(const std::string& file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what, "; ", kExportHint));
}

absl::StatusOr<std::shared_ptr<OnnxFile>> ReadOnnxFile(std::string bytes, const std::string& file) {
  auto f = std::make_shared<OnnxFile>();
  f->file = file;
  std::string base = file.substr(file.find_last_of('/') + 1);
  const size_t dot = base.rfind('.');
  f->name = dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
  if (bytes.size() > static_cast<size_t>(kMaxProtobufBytes)) return ModelFileTooLarge(file, bytes.size());
  auto model = std::make_shared<::onnx::ModelProto>();
  if (!model->ParseFromString(bytes) || !model->has_graph() || model->graph().node_size() == 0) {
    return absl::DataLossError(absl::StrCat(file, ": not an ONNX model (", bytes.size(),
                                            " bytes that do not parse as an ONNX ModelProto with a graph)"));
  }
  std::string().swap(bytes);
  const ::onnx::GraphProto& g = model->graph();

  // Versions and domains, before ONNX's checker (which would refuse a newer IR with a less helpful message).
  if (model->ir_version() < kMinIrVersion || model->ir_version() > kMaxIrVersion) {
    return FileRefusal(file, absl::StrCat("IR version ", model->ir_version(), " is not supported (supported: ",
                                          kMinIrVersion, "-", kMaxIrVersion, ", what ONNX 1.12 reads)"));
  }
  for (const ::onnx::OperatorSetIdProto& o : model->opset_import()) {
    if (o.domain().empty() || o.domain() == "ai.onnx") f->opset = static_cast<int>(o.version());
  }
  if (f->opset < kMinOpset || f->opset > kMaxOpset) {
    return FileRefusal(file, f->opset == 0 ? std::string("no ai.onnx opset is imported")
                                           : absl::StrCat("opset ", f->opset, " of ai.onnx is not supported (supported: ",
                                                          kMinOpset, "-", kMaxOpset, ")"));
  }
  f->model = model;  // for NodeRefusal
  // nn.EmbeddingBag first: its export begins with ops of its own (ReduceProd, Range) that would be named instead.
  for (int i = 0; i < g.node_size(); ++i) {
    const ::onnx::NodeProto& n = g.node(i);
    if (n.op_type() == "Loop" && IsEmbeddingBagLoop(n)) {
      return NodeRefusal(*f, i, absl::StrCat("a Loop that gathers and reduces rows: ", kEmbeddingBagHint));
    }
    if (n.op_type() == "ATen") {
      std::string what;
      for (const ::onnx::AttributeProto& a : n.attribute()) {
        if (a.name() == "operator") what = a.s();
      }
      return NodeRefusal(*f, i, absl::StrCat("PyTorch's ATen operator '", what, "' is not supported",
                                             what == "embedding_bag" ? absl::StrCat(": ", kEmbeddingBagHint)
                                                                     : " (export without ATen fallback)"));
    }
  }
  for (int i = 0; i < g.node_size(); ++i) {
    const ::onnx::NodeProto& n = g.node(i);
    if (!n.domain().empty() && n.domain() != "ai.onnx") {
      return NodeRefusal(*f, i, absl::StrCat("domain '", n.domain(), "' is not supported (supported: ai.onnx)"));
    }
    if (n.op_type() == "If" || n.op_type() == "Loop" || n.op_type() == "Scan") {
      return NodeRefusal(*f, i, absl::StrCat("control flow (", n.op_type(),
                                             ") is not supported (supported: a fixed graph; trace the model "
                                             "instead of scripting its data-dependent branches and loops)"));
    }
    if (ComputedOps().count(n.op_type()) == 0) {
      return NodeRefusal(*f, i, absl::StrCat("operator ", n.op_type(), " is not supported (", SupportedOpsText(), ")"));
    }
  }
  if (g.sparse_initializer_size() > 0) {
    return FileRefusal(file, absl::StrCat("sparse initializer '", g.sparse_initializer(0).values().name(),
                                          "' is not supported (supported: dense initializers)"));
  }
  // External data into the tensors, so that everything from here on reads the model as if saved in one file.
  RETURN_IF_ERROR(LoadExternalData(file, model.get(), &f->external_data));

  // ONNX's own checks: the checker, then shape inference (strict) on a copy, so that the model stays as read.
  try {
    ::onnx::checker::check_model(*model);
  } catch (const std::exception& e) {
    return FileRefusal(file, absl::StrCat("ONNX's checker refuses it: ", OneLine(e.what())));
  }
  {
    // The copy without the data of large float initializers (a model's weights: gigabytes for today's largest),
    // which no shape computation reads: moved aside while copying, then back.
    constexpr size_t kLarge = 1 << 20;
    std::vector<std::pair<::onnx::TensorProto*, std::string>> aside;
    for (::onnx::TensorProto& t : *model->mutable_graph()->mutable_initializer()) {
      if (t.data_type() == ::onnx::TensorProto::FLOAT && t.raw_data().size() >= kLarge) {
        aside.emplace_back(&t, std::string());
        t.mutable_raw_data()->swap(aside.back().second);
      }
    }
    ::onnx::ModelProto copy = *model;
    for (auto& [t, data] : aside) t->mutable_raw_data()->swap(data);
    try {
      ::onnx::shape_inference::InferShapes(copy, ::onnx::OpSchemaRegistry::Instance(),
                                           ::onnx::ShapeInferenceOptions(/*check_type=*/true, /*strict_mode=*/1,
                                                                         /*data_prop=*/true));
    } catch (const std::exception& e) {
      return FileRefusal(file, absl::StrCat("ONNX's shape inference fails: ", OneLine(e.what())));
    }
    for (const ::onnx::ValueInfoProto& v : copy.graph().value_info()) f->inferred[v.name()] = DimsOf(v.type());
    for (const ::onnx::ValueInfoProto& v : copy.graph().output()) f->inferred[v.name()] = DimsOf(v.type());
  }

  for (const ::onnx::TensorProto& t : g.initializer()) {
    absl::StatusOr<ConstRef> c = DecodeTensor(t, absl::StrCat("initializer '", t.name(), "'"));
    if (!c.ok()) return FileRefusal(file, c.status().message());
    auto named = std::make_shared<Const>(**c);  // a shallow copy: the values are shared
    named->initializer = t.name();
    f->initializers[t.name()] = std::move(named);
  }
  for (int i = 0; i < g.node_size(); ++i) {
    for (const std::string& in : g.node(i).input()) {
      if (!in.empty()) f->readers[in].push_back(i);
    }
  }
  // The inputs that are not initializers: the first float one is the data (images or dense features), an int64
  // one the ids of embedding lookups; the others (a loss head's labels) are checked by the mapper.
  for (const ::onnx::ValueInfoProto& in : g.input()) {
    if (f->initializers.count(in.name())) continue;
    const int type = in.type().has_tensor_type() ? in.type().tensor_type().elem_type() : 0;
    std::vector<int64_t> dims = DimsOf(in.type());
    bool labels = false;  // read only as the labels of a SoftmaxCrossEntropyLoss
    auto readers = f->readers.find(in.name());
    if (readers != f->readers.end()) {
      labels = true;
      for (int j : readers->second) {
        labels = labels && g.node(j).op_type() == "SoftmaxCrossEntropyLoss" && InputName(g.node(j), 1) == in.name();
      }
    }
    if (labels || (type == ::onnx::TensorProto::FLOAT && !f->data_input.empty())) {
      f->other_inputs.insert(in.name());
      continue;
    }
    if (IsInteger(type)) {
      if (type != ::onnx::TensorProto::INT64) {
        return FileRefusal(file, absl::StrCat("input '", in.name(), "' has type ", DataTypeName(type),
                                              " (supported: INT64 ids, as nn.Embedding takes them; export with "
                                              "torch.long ids)"));
      }
      if (!f->ids_input.empty()) {
        return FileRefusal(file, absl::StrCat("input '", in.name(), "' is a second int64 input (supported: one input "
                                              "of ids, [N] or [N, F]: '", f->ids_input, "')"));
      }
      if (dims.empty() || dims.size() > 2 || (dims.size() == 2 && dims[1] < 1)) {
        return FileRefusal(file, absl::StrCat("input '", in.name(), "' of ids has shape [",
                                              absl::StrJoin(dims, ","), "] (supported: [N] or [N, F] with F fixed: "
                                              "F categorical features per example)"));
      }
      f->ids_input = in.name();
      f->ids_dims.assign(dims.begin() + 1, dims.end());
      if (f->input_batch < 0) f->input_batch = dims[0];
      continue;
    }
    if (type != ::onnx::TensorProto::FLOAT) {
      return FileRefusal(file, absl::StrCat("input '", in.name(), "' has type ", DataTypeName(type),
                                            " (supported: FLOAT images or features, INT64 ids)"));
    }
    f->data_input = in.name();
    if (dims.empty()) {
      return FileRefusal(file, absl::StrCat("input '", in.name(), "' is a scalar (supported: a batch axis first, then features or C x H x W)"));
    }
    f->input_batch = dims[0];
    f->input_dims.assign(dims.begin() + 1, dims.end());
  }
  if (f->data_input.empty() && f->ids_input.empty()) {
    return FileRefusal(file, "the graph has no input besides its initializers");
  }
  for (const ::onnx::ValueInfoProto& out : g.output()) f->outputs.push_back(out.name());
  return f;
}

}  // namespace dtrain::models::onnx
