#include "worker/models/graph.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace dtrain::models {

int64_t TensorShape::size() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::vector<int64_t> TensorShape::FullDims(int64_t batch) const {
  std::vector<int64_t> full = dims;
  if (batched()) full.insert(full.begin() + batch_axis, batch);
  return full;
}

std::vector<int64_t> TensorShape::Strides(int64_t batch) const {
  const std::vector<int64_t> full = FullDims(batch);
  std::vector<int64_t> strides(full.size(), 1);
  if (is_image()) {  // (N, C, H, W) stored (N, H, W, C)
    const int64_t c = dims[0], h = dims[1], w = dims[2];
    return {h * w * c, 1, w * c, c};
  }
  for (int k = static_cast<int>(full.size()) - 2; k >= 0; --k) strides[k] = strides[k + 1] * full[k + 1];
  return strides;
}

std::string TensorShape::ToString() const {
  if (batch_axis <= 0) return absl::StrJoin(dims, "x");
  std::vector<std::string> parts;
  for (int64_t d : SymbolicDims()) parts.push_back(d == kBatchDim ? "N" : absl::StrCat(d));
  return absl::StrJoin(parts, "x");
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kConv: return "Conv";
    case Op::kMaxPool: return "MaxPool";
    case Op::kAvgPool: return "AveragePool";
    case Op::kDense: return "Gemm";
    case Op::kBinary: return "Binary";
    case Op::kRelu: return "Relu";
    case Op::kActivation: return "Activation";
    case Op::kBatchNorm: return "BatchNormalization";
    case Op::kDropout: return "Dropout";
    case Op::kLrn: return "LRN";
    case Op::kReshape: return "Reshape";
    case Op::kConcat: return "Concat";
    case Op::kIdentity: return "Identity";
    case Op::kEmbedding: return "Embedding";
    case Op::kInteraction: return "Interaction";
    case Op::kTranspose: return "Transpose";
    case Op::kMatMul: return "MatMul";
    case Op::kSoftmax: return "Softmax";
    case Op::kLayerNorm: return "LayerNormalization";
    case Op::kReduce: return "Reduce";
    case Op::kSlice: return "Slice";
    case Op::kGather: return "Gather";
    case Op::kExpand: return "Expand";
    case Op::kVariable: return "Variable";
  }
  return "?";
}

Node Node::Conv(std::string name, int k_h, int k_w, int out_c, kernels::Padding padding, int stride) {
  Node n;
  n.op = Op::kConv;
  n.name = std::move(name);
  n.conv.k_h = k_h;
  n.conv.k_w = k_w;
  n.conv.out_c = out_c;
  n.conv.padding = padding;
  n.conv.stride_h = n.conv.stride_w = stride;
  return n;
}

Node Node::MaxPool(std::string name, int window, int stride, kernels::Padding padding) {
  Node n;
  n.op = Op::kMaxPool;
  n.name = std::move(name);
  n.pool.window = window;
  n.pool.stride = stride;
  n.pool.padding = padding;
  return n;
}

Node Node::Dense(std::string name, int out) {
  Node n;
  n.op = Op::kDense;
  n.name = std::move(name);
  n.dense.out = out;
  return n;
}

Node Node::Relu(std::string name) {
  Node n;
  n.op = Op::kRelu;
  n.name = std::move(name);
  return n;
}

Node Node::Dropout(std::string name, float keep_prob) {
  Node n;
  n.op = Op::kDropout;
  n.name = std::move(name);
  n.keep_prob = keep_prob;
  return n;
}

Node Node::Lrn(std::string name, int depth_radius, float bias, float alpha, float beta) {
  Node n;
  n.op = Op::kLrn;
  n.name = std::move(name);
  n.lrn.depth_radius = depth_radius;
  n.lrn.bias = bias;
  n.lrn.alpha = alpha;
  n.lrn.beta = beta;
  return n;
}

Node Node::Reshape(std::string name, std::vector<int64_t> shape, FlattenOrder order) {
  Node n;
  n.op = Op::kReshape;
  n.name = std::move(name);
  n.shape = std::move(shape);
  n.flatten_order = order;
  return n;
}

std::vector<int64_t> Graph::variable_offsets() const { return Offsets(variables); }

GraphBuilder::GraphBuilder(std::string model_name, TensorShape input, std::string input_name) {
  graph_.name = std::move(model_name);
  graph_.tensors.push_back(std::move(input));
  graph_.tensor_names.push_back(std::move(input_name));
}

absl::Status GraphBuilder::Error(const Node& node, const std::string& what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(graph_.name, ": node '", node.name, "' (", OpName(node.op), "): ", what));
}

std::vector<int> Graph::table_of_feature() const {
  std::vector<int> table(num_sparse_features, -1);
  for (const Node& n : nodes) {
    if (n.op == Op::kEmbedding) table[n.embedding.feature] = n.embedding.table;
  }
  return table;
}

std::string ShapeText(const std::vector<int64_t>& dims) {
  return dims.empty() ? std::string("a scalar") : absl::StrJoin(dims, "x");
}


absl::StatusOr<int> GraphBuilder::Add(Node node, std::vector<int> inputs, std::vector<VarSpec> new_variables,
                                      std::string output_name) {
  const int num_tensors = static_cast<int>(graph_.tensors.size());
  for (int t : inputs) {
    if (t < 0 || t >= num_tensors) return Error(node, absl::StrCat("input tensor ", t, " does not exist"));
  }
  node.inputs = inputs;
  // Variables: declared here, in flat-buffer order.
  std::set<std::string> names;
  for (const VariableInfo& v : graph_.variables) names.insert(v.name);
  std::vector<VariableInfo> declared;
  for (VarSpec& spec : new_variables) {
    if (spec.name.empty()) return Error(node, "a variable without a name");
    if (!names.insert(spec.name).second) {
      return Error(node, absl::StrCat("variable '", spec.name,
                                      "' is already used by another node; shared weights are not supported"));
    }
    VariableInfo v;
    v.name = std::move(spec.name);
    v.shape = std::move(spec.shape);
    v.init = std::move(spec.init);
    v.weight_decay = spec.weight_decay;
    v.trainable = spec.trainable;
    for (int64_t d : v.shape) {
      if (d < 1) return Error(node, absl::StrCat("variable '", v.name, "' has shape ", ShapeText(v.shape)));
    }
    if (v.init.kind == Initializer::Kind::kValues &&
        (v.init.values == nullptr || static_cast<int64_t>(v.init.values->size()) != v.size())) {
      return Error(node, absl::StrCat("variable '", v.name, "' of shape ", ShapeText(v.shape), " has ",
                                      v.init.values == nullptr ? 0 : v.init.values->size(), " initial values"));
    }
    declared.push_back(std::move(v));
  }
  const int first_new = static_cast<int>(graph_.variables.size());
  for (size_t i = 0; i < declared.size(); ++i) node.variables.push_back(first_new + static_cast<int>(i));
  auto var = [&](size_t k) -> const VariableInfo& { return declared[k]; };
  auto expect_var = [&](size_t k, const std::vector<int64_t>& shape, const char* role) -> absl::Status {
    if (k >= declared.size()) return Error(node, absl::StrCat("missing its ", role));
    if (declared[k].shape != shape) {
      return Error(node, absl::StrCat("its ", role, " '", declared[k].name, "' has shape ",
                                      ShapeText(declared[k].shape), ", expected ", ShapeText(shape)));
    }
    return absl::OkStatus();
  };
  auto expect_inputs = [&](size_t n) -> absl::Status {
    if (inputs.size() != n) {
      return Error(node, absl::StrCat("takes ", n, " input tensor(s), got ", inputs.size()));
    }
    return absl::OkStatus();
  };
  auto expect_vars = [&](size_t lo, size_t hi) -> absl::Status {
    if (declared.size() < lo || declared.size() > hi) {
      return Error(node, absl::StrCat("takes ", lo == hi ? absl::StrCat(lo) : absl::StrCat(lo, "-", hi),
                                      " variables, got ", declared.size()));
    }
    return absl::OkStatus();
  };
  auto image_input = [&](int t) -> absl::Status {
    if (!graph_.tensors[t].is_image()) {
      return Error(node, absl::StrCat("needs an image input (C x H x W per example), got ",
                                      ShapeText(graph_.tensors[t].dims), " ('", graph_.tensor_names[t], "')"));
    }
    return absl::OkStatus();
  };

  TensorShape out;
  switch (node.op) {
    case Op::kConv: {
      RETURN_IF_ERROR(expect_inputs(1));
      RETURN_IF_ERROR(image_input(inputs[0]));
      RETURN_IF_ERROR(expect_vars(1, 2));
      const TensorShape& x = graph_.tensors[inputs[0]];
      kernels::Conv2DParams& p = node.conv;
      p.in_c = static_cast<int>(x.dims[0]);
      p.in_h = static_cast<int>(x.dims[1]);
      p.in_w = static_cast<int>(x.dims[2]);
      p.has_bias = declared.size() == 2;
      if (p.k_h < 1 || p.k_w < 1 || p.out_c < 1 || p.stride_h < 1 || p.stride_w < 1 || p.dilation_h < 1 ||
          p.dilation_w < 1 || p.groups < 1 || p.pad_top < 0 || p.pad_bottom < 0 || p.pad_left < 0 ||
          p.pad_right < 0) {
        return Error(node, "kernel, output channels, strides, dilations and groups must be positive, pads >= 0");
      }
      if (p.in_c % p.groups != 0 || p.out_c % p.groups != 0) {
        return Error(node, absl::StrCat("group count ", p.groups, " does not divide the input channels (", p.in_c,
                                        ") and output channels (", p.out_c, ")"));
      }
      const int64_t ci = p.in_c / p.groups;
      if (p.weight_layout == kernels::WeightLayout::kHWIO) {
        RETURN_IF_ERROR(expect_var(0, {p.k_h, p.k_w, ci, p.out_c}, "weight"));
      } else {
        RETURN_IF_ERROR(expect_var(0, {p.out_c, ci, p.k_h, p.k_w}, "weight"));
      }
      if (p.has_bias) RETURN_IF_ERROR(expect_var(1, {p.out_c}, "bias"));
      if (p.out_h() < 1 || p.out_w() < 1) {
        return Error(node, absl::StrCat("input ", x.ToString(), " is too small: the output would be ", p.out_h(),
                                        "x", p.out_w()));
      }
      out.dims = {p.out_c, p.out_h(), p.out_w()};
      break;
    }
    case Op::kMaxPool:
    case Op::kAvgPool: {
      RETURN_IF_ERROR(expect_inputs(1));
      RETURN_IF_ERROR(image_input(inputs[0]));
      RETURN_IF_ERROR(expect_vars(0, 0));
      const TensorShape& x = graph_.tensors[inputs[0]];
      kernels::PoolParams& p = node.pool;
      p.channels = static_cast<int>(x.dims[0]);
      p.in_h = static_cast<int>(x.dims[1]);
      p.in_w = static_cast<int>(x.dims[2]);
      if (p.kh() < 1 || p.kw() < 1 || p.sh() < 1 || p.sw() < 1 || p.pad_top < 0 || p.pad_bottom < 0 ||
          p.pad_left < 0 || p.pad_right < 0) {
        return Error(node, "windows and strides must be positive, pads >= 0");
      }
      if (p.explicit_padding && (p.pads_h().before >= p.kh() || p.pads_h().after >= p.kh() ||
                                 p.pads_w().before >= p.kw() || p.pads_w().after >= p.kw())) {
        return Error(node, "a pad must be smaller than the window");
      }
      if (p.out_h() < 1 || p.out_w() < 1) {
        return Error(node, absl::StrCat("input ", x.ToString(), " is too small: the output would be ", p.out_h(),
                                        "x", p.out_w()));
      }
      out.dims = {p.channels, p.out_h(), p.out_w()};
      break;
    }
    case Op::kDense: {
      RETURN_IF_ERROR(expect_inputs(1));
      RETURN_IF_ERROR(expect_vars(1, 2));
      const TensorShape& x = graph_.tensors[inputs[0]];
      // Over the last full axis of a row-major tensor (features per example, or tokens x features).
      if (x.dims.empty() || x.is_image() || x.batch_axis == static_cast<int>(x.dims.size())) {
        return Error(node, absl::StrCat("needs features along the last axis of a non-image tensor, got ",
                                        x.is_image() ? "an image " : "", x.ToString(), "; flatten it first"));
      }
      kernels::DenseParams& p = node.dense;
      p.in = static_cast<int>(x.dims.back());
      p.has_bias = declared.size() == 2;
      if (p.out < 1) return Error(node, "the output width must be positive");
      if (p.weights_transposed) {
        RETURN_IF_ERROR(expect_var(0, {p.out, p.in}, "weight"));
      } else {
        RETURN_IF_ERROR(expect_var(0, {p.in, p.out}, "weight"));
      }
      // The bias may also be [1, out] (an ONNX Gemm's C broadcast over the batch): the same floats.
      if (p.has_bias && declared[1].shape != std::vector<int64_t>{1, p.out}) {
        RETURN_IF_ERROR(expect_var(1, {p.out}, "bias"));
      }
      out = x;
      out.dims.back() = p.out;
      break;
    }
    case Op::kBinary: {
      if (!((inputs.size() == 2 && declared.empty()) || (inputs.size() == 1 && declared.size() == 1))) {
        return Error(node, "takes two tensors, or one tensor and one variable");
      }
      // numpy broadcasting of the full dims (right-aligned); a variable is an operand without a batch axis.
      const TensorShape& ta = graph_.tensors[inputs[0]];
      TensorShape tb;
      if (inputs.size() == 2) {
        tb = graph_.tensors[inputs[1]];
      } else {
        tb.dims = var(0).shape;
        tb.batch_axis = TensorShape::kNoBatch;
      }
      const std::vector<int64_t> a = ta.SymbolicDims(), b = tb.SymbolicDims();
      const size_t rank = std::max(a.size(), b.size());
      std::vector<int64_t> full(rank, 1);
      for (size_t k = 0; k < rank; ++k) {
        const int64_t da = k < rank - a.size() ? 1 : a[k - (rank - a.size())];
        const int64_t db = k < rank - b.size() ? 1 : b[k - (rank - b.size())];
        const bool fits = da == db || da == 1 || db == 1;
        if (!fits) {
          return Error(node, absl::StrCat(
                                 "shapes ", ta.ToString(), " and ",
                                 inputs.size() == 2 ? tb.ToString() : absl::StrCat(ShapeText(tb.dims), " ('", var(0).name, "')"),
                                 da == TensorShape::kBatchDim || db == TensorShape::kBatchDim
                                     ? " do not broadcast (one would be broadcast over the batch dimension)"
                                     : " do not broadcast"));
        }
        full[k] = da == 1 ? db : da;
      }
      const TensorShape* same = full == a ? &ta : (inputs.size() == 2 && full == b) ? &tb : nullptr;
      if (same == nullptr) {
        return Error(node, absl::StrCat("the result is larger than both inputs (", ta.ToString(), ", ", tb.ToString(),
                                        "); only one-sided broadcasting is supported"));
      }
      out = *same;  // its dims, batch axis and layout
      break;
    }
    case Op::kRelu:
    case Op::kActivation:
    case Op::kIdentity:
    case Op::kDropout:
      RETURN_IF_ERROR(expect_inputs(1));
      RETURN_IF_ERROR(expect_vars(0, 0));
      if (node.op == Op::kDropout && !(node.keep_prob > 0.0f && node.keep_prob <= 1.0f)) {
        return Error(node, absl::StrCat("keep probability ", node.keep_prob, " is not in (0, 1]"));
      }
      out = graph_.tensors[inputs[0]];
      break;
    case Op::kBatchNorm: {
      RETURN_IF_ERROR(expect_inputs(1));
      RETURN_IF_ERROR(expect_vars(4, 4));
      const TensorShape& x = graph_.tensors[inputs[0]];
      if (!(x.is_image() || (x.dims.size() == 1 && x.batch_axis == 0))) {
        return Error(node, absl::StrCat("needs an image or a flat input, got ", x.ToString()));
      }
      const int64_t c = x.dims[0];
      RETURN_IF_ERROR(expect_var(0, {c}, "scale"));
      RETURN_IF_ERROR(expect_var(1, {c}, "bias"));
      RETURN_IF_ERROR(expect_var(2, {c}, "running mean"));
      RETURN_IF_ERROR(expect_var(3, {c}, "running variance"));
      if (!declared[0].trainable || !declared[1].trainable || declared[2].trainable || declared[3].trainable) {
        return Error(node, "scale and bias are trainable, the running statistics are state");
      }
      if (!(node.epsilon > 0.0f) || !(node.momentum >= 0.0f && node.momentum <= 1.0f)) {
        return Error(node, absl::StrCat("epsilon ", node.epsilon, " must be > 0 and momentum ", node.momentum,
                                        " in [0, 1]"));
      }
      out = x;
      break;
    }
    case Op::kLrn: {
      RETURN_IF_ERROR(expect_inputs(1));
      RETURN_IF_ERROR(image_input(inputs[0]));
      RETURN_IF_ERROR(expect_vars(0, 0));
      const TensorShape& x = graph_.tensors[inputs[0]];
      node.lrn.channels = static_cast<int>(x.dims[0]);
      node.lrn.h = static_cast<int>(x.dims[1]);
      node.lrn.w = static_cast<int>(x.dims[2]);
      if (node.lrn.depth_radius < 0 || !(node.lrn.beta > 0.0f)) {
        return Error(node, "depth_radius must be >= 0 and beta > 0");
      }
      out = x;
      break;
    }
    case Op::kReshape: {
      RETURN_IF_ERROR(expect_inputs(1));
      RETURN_IF_ERROR(expect_vars(0, 0));
      const TensorShape& x = graph_.tensors[inputs[0]];
      out.dims = node.shape;
      out.batch_axis = x.batched() ? node.batch_axis : TensorShape::kNoBatch;
      out.plain = node.plain;
      for (int64_t d : out.dims) {
        if (d < 1) return Error(node, absl::StrCat("output shape ", ShapeText(out.dims), " has a non-positive size"));
      }
      if (out.batched() && (out.batch_axis < 0 || out.batch_axis > static_cast<int>(out.dims.size()))) {
        return Error(node, absl::StrCat("batch axis ", out.batch_axis, " is outside the output's rank"));
      }
      if (out.size() != x.size()) {
        return Error(node, absl::StrCat("cannot reshape ", x.ToString(), " (", x.size(), " values per example) into ",
                                        out.ToString(), " (", out.size(), ")"));
      }
      // The batch stays where it is in the row-major order: as many values before it on both sides.
      if (x.batched()) {
        int64_t before_in = 1, before_out = 1;
        for (int k = 0; k < x.batch_axis; ++k) before_in *= x.dims[k];
        for (int k = 0; k < out.batch_axis; ++k) before_out *= out.dims[k];
        if (before_in != before_out) {
          return Error(node, absl::StrCat("reshaping ", x.ToString(), " into ", out.ToString(),
                                          " would move values across the batch axis"));
        }
      }
      if (x.is_image() && out.is_image() && x.dims != out.dims) {
        return Error(node, absl::StrCat("reshaping one image shape (", ShapeText(x.dims), ") into another (",
                                        ShapeText(out.dims), ") is not supported"));
      }
      break;
    }
    case Op::kConcat: {
      if (inputs.empty()) return Error(node, "needs at least one input");
      RETURN_IF_ERROR(expect_vars(0, 0));
      const TensorShape& first = graph_.tensors[inputs[0]];
      out = first;
      const int rank = first.full_rank();
      if (node.axis < 0 || node.axis >= rank || node.axis == first.batch_axis) {
        return Error(node, absl::StrCat("axis ", node.axis, node.axis == first.batch_axis ? " is the batch axis" :
                                        " is outside the rank", " of ", first.ToString(),
                                        " (concatenation over the batch is not supported)"));
      }
      // The per-example axis the concatenation runs along.
      const int axis = first.batched() && node.axis > first.batch_axis ? node.axis - 1 : node.axis;
      out.dims[axis] = 0;
      for (int t : inputs) {
        const TensorShape& in = graph_.tensors[t];
        bool fits = in.dims.size() == first.dims.size() && in.batch_axis == first.batch_axis &&
                    in.is_image() == first.is_image();
        for (size_t i = 0; fits && i < in.dims.size(); ++i) fits = static_cast<int>(i) == axis || in.dims[i] == first.dims[i];
        if (!fits) {
          return Error(node, absl::StrCat("input '", graph_.tensor_names[t], "' of shape ", in.ToString(),
                                          in.is_image() ? " (an image)" : "", " does not fit the others (",
                                          first.ToString(), first.is_image() ? ", an image" : "", ") outside axis ",
                                          node.axis));
        }
        out.dims[axis] += in.dims[axis];
      }
      break;
    }
    case Op::kInteraction: {
      RETURN_IF_ERROR(expect_inputs(1));
      RETURN_IF_ERROR(expect_vars(0, 0));
      const TensorShape& x = graph_.tensors[inputs[0]];
      if (x.dims.size() != 2 || x.dims[0] < 2 || x.batch_axis != 0) {
        return Error(node, absl::StrCat("needs (features >= 2) x dim per example, got ", x.ToString()));
      }
      out.dims = {x.dims[0] * (x.dims[0] - 1) / 2};
      break;
    }
    case Op::kEmbedding: {
      RETURN_IF_ERROR(expect_inputs(0));
      RETURN_IF_ERROR(expect_vars(0, 0));
      const Node::Embedding& e = node.embedding;
      if (e.table < 0 || e.table >= static_cast<int>(graph_.tables.size())) {
        return Error(node, absl::StrCat("table ", e.table, " is not declared (", graph_.tables.size(), " tables)"));
      }
      if (e.feature < 0 || e.feature >= graph_.num_sparse_features) {
        return Error(node, absl::StrCat("sparse feature ", e.feature, " is outside the batch's ",
                                        graph_.num_sparse_features, " features"));
      }
      for (const Node& other : graph_.nodes) {  // a feature's ids index one table, one way
        if (other.op == Op::kEmbedding && other.embedding.feature == e.feature &&
            (other.embedding.table != e.table || other.embedding.bag != e.bag)) {
          return Error(node, absl::StrCat("sparse feature ", e.feature, " is read by node '", other.name,
                                          "' too, from another table or as bags the other way (supported: each "
                                          "feature looked up in one table, as bags or not)"));
        }
      }
      out.dims = {graph_.tables[e.table].dim};
      break;
    }
    case Op::kTranspose:
    case Op::kMatMul:
    case Op::kSoftmax:
    case Op::kLayerNorm:
    case Op::kReduce:
    case Op::kSlice:
    case Op::kGather:
    case Op::kExpand:
    case Op::kVariable:
      RETURN_IF_ERROR(InferTensorOp(node, declared, &out));
      break;
  }
  const int id = num_tensors;
  node.output = id;
  graph_.tensors.push_back(std::move(out));
  graph_.tensor_names.push_back(output_name.empty() ? absl::StrCat(node.name, ":0") : std::move(output_name));
  for (VariableInfo& v : declared) graph_.variables.push_back(std::move(v));
  graph_.nodes.push_back(std::move(node));
  return id;
}

absl::StatusOr<int> GraphBuilder::AddTable(TableInfo table) {
  if (table.name.empty() || table.dim < 1 || table.rows < 0 || table.max_rows < 0 || table.admit_after < 0 ||
      !(table.init_scale >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(graph_.name, ": table '", table.name, "' has a bad spec (dim ",
                                                   table.dim, ", rows ", table.rows, ", max_rows ", table.max_rows,
                                                   ")"));
  }
  if (table.initial_values != nullptr &&
      (table.rows == 0 || table.max_rows > 0 || table.admit_after > 1 ||
       static_cast<int64_t>(table.initial_values->size()) != table.rows * table.dim)) {
    return absl::InvalidArgumentError(absl::StrCat(graph_.name, ": table '", table.name, "' has ",
                                                   table.initial_values->size(), " initial values; they need a ",
                                                   "fixed-size table without max_rows or admission, rows x dim of them"));
  }
  for (const TableInfo& t : graph_.tables) {
    if (t.name == table.name) {
      return absl::InvalidArgumentError(absl::StrCat(graph_.name, ": table '", table.name, "' declared twice"));
    }
  }
  graph_.tables.push_back(std::move(table));
  return static_cast<int>(graph_.tables.size()) - 1;
}

absl::StatusOr<Graph> GraphBuilder::Finish(int logits, Loss loss) {
  if (logits < 1 || logits >= static_cast<int>(graph_.tensors.size())) {
    return absl::InvalidArgumentError(absl::StrCat(graph_.name, ": the output is not computed by any node"));
  }
  const TensorShape& out = graph_.tensors[logits];
  if (out.batch_axis != 0) {
    return absl::InvalidArgumentError(absl::StrCat(graph_.name, ": the output '", graph_.tensor_names[logits],
                                                   "' has shape ", out.ToString(),
                                                   "; expected the batch as its first axis"));
  }
  if ((loss != Loss::kNone && out.dims.size() != 1) || (loss == Loss::kSigmoidCrossEntropy && out.dims[0] != 1) ||
      (loss == Loss::kSoftmaxCrossEntropy && out.dims[0] < 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        graph_.name, ": the output '", graph_.tensor_names[logits], "' has shape ", ShapeText(out.dims),
        loss == Loss::kSoftmaxCrossEntropy ? " per example; expected class logits (a flat vector of at least 2)"
                                           : " per example; expected one logit"));
  }
  graph_.output = logits;
  graph_.loss = loss;
  return graph_;
}

absl::StatusOr<Graph> GraphFromLayers(const std::string& model, const std::vector<LayerSpec>& layers,
                                      Geometry input, int num_classes) {
  if (input.h < 1 || input.w < 1 || input.c < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, ": input geometry ", input.h, "x", input.w, "x", input.c, " must be positive"));
  }
  // The layer list's own checks first (its messages name the layer and the geometry).
  RETURN_IF_ERROR(InferShapes(model, layers, input).status());
  GraphBuilder b(model, TensorShape{{input.c, input.h, input.w}});
  int x = b.input();
  int index = 0;
  for (const LayerSpec& s : layers) {
    const std::string name = s.name.empty() ? absl::StrCat("layer", index) : s.name;
    ++index;
    switch (s.kind) {
      case LayerSpec::Kind::kConv: {
        Node n = Node::Conv(name, s.kernel, s.kernel, s.out, s.padding, s.stride);
        const int64_t in_c = b.shape(x).dims[0];
        ASSIGN_OR_RETURN(x, b.Add(n, {x},
                                  {VarSpec(s.name + "/weights", {s.kernel, s.kernel, in_c, s.out}, s.weights_init,
                                           s.weight_decay),
                                   VarSpec(s.name + "/biases", {s.out}, s.biases_init)}));
        break;
      }
      case LayerSpec::Kind::kDense: {
        if (b.shape(x).dims.size() != 1) {
          ASSIGN_OR_RETURN(x, b.Add(Node::Reshape(name + "/flatten", {b.shape(x).size()},
                                                  FlattenOrder::kChannelsLast),
                                    {x}));
        }
        const int64_t in = b.shape(x).dims[0];
        ASSIGN_OR_RETURN(x, b.Add(Node::Dense(name, s.out), {x},
                                  {VarSpec(s.name + "/weights", {in, s.out}, s.weights_init, s.weight_decay),
                                   VarSpec(s.name + "/biases", {s.out}, s.biases_init)}));
        break;
      }
      case LayerSpec::Kind::kRelu: {
        ASSIGN_OR_RETURN(x, b.Add(Node::Relu(name), {x}));
        break;
      }
      case LayerSpec::Kind::kMaxPool: {
        ASSIGN_OR_RETURN(x, b.Add(Node::MaxPool(name, s.kernel, s.stride, s.padding), {x}));
        break;
      }
      case LayerSpec::Kind::kLrn: {
        ASSIGN_OR_RETURN(x, b.Add(Node::Lrn(name, s.lrn.depth_radius, s.lrn.bias, s.lrn.alpha, s.lrn.beta), {x}));
        break;
      }
      case LayerSpec::Kind::kDropout: {
        ASSIGN_OR_RETURN(x, b.Add(Node::Dropout(name, s.keep_prob), {x}));
        break;
      }
    }
  }
  if (b.shape(x).dims != std::vector<int64_t>{num_classes}) {
    return absl::InvalidArgumentError(absl::StrCat(model, ": the last layer has ", b.shape(x).size(),
                                                   " outputs but num_classes is ", num_classes));
  }
  return b.Finish(x, Loss::kSoftmaxCrossEntropy);
}

}  // namespace dtrain::models
