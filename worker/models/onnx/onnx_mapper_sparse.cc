// The mapper's sparse side (onnx_mapper_internal.h): the int64 ids input and the columns picked from it,
// embedding lookups (Gather of a float initializer by ids), the reductions PyTorch models put after them, and
// the one-logit head of click-through-rate models.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_attributes.h"
#include "worker/models/onnx/onnx_mapper_internal.h"

namespace dtrain::models::onnx {

namespace {

constexpr char kIdsSupported[] =
    "supported: Gather(table, ids) of a float initializer table [rows, dim], with columns picked by "
    "Gather(ids, k, axis=1), Slice along axis 1, Squeeze or Unsqueeze";

// Axes normalized against `rank` (the batch included); false when one is outside it.
bool NormalizeAxes(std::vector<int64_t>* axes, int64_t rank) {
  for (int64_t& a : *axes) {
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) return false;
  }
  std::sort(axes->begin(), axes->end());
  return true;
}

}  // namespace

absl::Status Mapper::SetIdsInput(const DataGeometry* data) {
  if (f_.ids_input.empty()) return absl::OkStatus();
  const int64_t columns = f_.ids_dims.empty() ? 1 : f_.ids_dims[0];
  if (data != nullptr && data->num_sparse != columns) {
    return absl::InvalidArgumentError(absl::StrCat(
        f_.file, ": the model's input '", f_.ids_input, "' takes ", columns, " categorical feature",
        columns == 1 ? "" : "s", " per example (int64 ids) but the data set has ", data->num_sparse,
        data->num_sparse == 0 ? " (images; train it on click-through-rate data, e.g. --data_format=criteo)"
                              : "; train it on data with that many or export it for these"));
  }
  b_->SetSparseFeatures(static_cast<int>(columns));
  Value v;
  v.ids = true;
  v.ids_rank = f_.ids_dims.empty() ? 0 : 1;
  for (int c = 0; c < columns; ++c) v.columns.push_back(c);
  values_[f_.ids_input] = v;
  return absl::OkStatus();
}

absl::Status Mapper::RefuseComputedIds(int i, int k) const {
  return Refuse(i, absl::StrCat("reads the ids '", InputName(node(i), k), "' (the int64 input, which dtrain feeds "
                                "as the rows of its embedding tables) as a tensor: computed ids are not supported (",
                                kIdsSupported, ")"));
}

absl::Status Mapper::MapGather(int i) {
  const ::onnx::NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const Value* data, Get(i, 0));
  ASSIGN_OR_RETURN(const Value* indices, Get(i, 1));
  if (indices->ids) return MapEmbedding(i, *indices);
  if (!data->ids) {
    if (indices->constant != nullptr) return MapGatherOfTensor(i);  // rows of a tensor (or a parameter)
    return Refuse(i, absl::StrCat("its indices '", InputName(n, 1), "' are computed by the graph (supported: "
                                  "constant indices, or an embedding table looked up by the int64 ids input)"));
  }
  // Columns of the ids: Gather(ids, k, axis=1), k a constant (scalar: [N]; 1-D: [N, len(k)]).
  const Value ids = *data;
  const int64_t rank = ids.ids_rank + 1;
  int64_t axis = AttrInt(n, "axis", 0);
  if (axis < 0) axis += rank;
  if (axis != 1 || ids.ids_rank != 1) {
    return Refuse(i, absl::StrCat("attribute axis=", AttrInt(n, "axis", 0), " on the ids of shape [N",
                                  ids.ids_rank == 1 ? absl::StrCat(", ", ids.columns.size()) : "",
                                  "] is not supported (supported: picking columns of [N, F] ids, axis=1)"));
  }
  ASSIGN_OR_RETURN(const Const* k, ConstIn(i, 1));
  if (k == nullptr || k->type != Const::Type::kInt || k->dims.size() > 1) {
    return Refuse(i, "its indices into the ids' columns are not a constant integer scalar or vector");
  }
  Value out;
  out.ids = true;
  out.ids_rank = static_cast<int>(k->dims.size());
  const int64_t f = static_cast<int64_t>(ids.columns.size());
  for (int64_t c : k->ints) {
    if (c < -f || c >= f) return Refuse(i, absl::StrCat("column ", c, " of ids with ", f, " columns"));
    out.columns.push_back(ids.columns[c < 0 ? c + f : c]);
  }
  values_[n.output(0)] = std::move(out);
  return absl::OkStatus();
}

absl::Status Mapper::MapSliceOfIds(int i, const Value& ids) {
  const ::onnx::NodeProto& n = node(i);
  if (f_.opset < 10 || n.input_size() < 3) return Refuse(i, "Slice of ids without starts/ends inputs");
  ASSIGN_OR_RETURN(const Const* starts, ConstIn(i, 1));
  ASSIGN_OR_RETURN(const Const* ends, ConstIn(i, 2));
  ASSIGN_OR_RETURN(const Const* axes_in, ConstIn(i, 3));
  ASSIGN_OR_RETURN(const Const* steps, ConstIn(i, 4));
  const int64_t rank = ids.ids_rank + 1;
  if (starts == nullptr || ends == nullptr || starts->size() != ends->size()) {
    return Refuse(i, "its starts and ends are not constants of one length");
  }
  std::vector<int64_t> axes;
  for (int64_t a = 0; a < starts->size(); ++a) axes.push_back(axes_in != nullptr ? axes_in->ints[a] : a);
  Value out = ids;
  for (size_t j = 0; j < axes.size(); ++j) {
    int64_t axis = axes[j] < 0 ? axes[j] + rank : axes[j];
    const int64_t step = steps != nullptr ? steps->ints[j] : 1;
    const int64_t s = starts->ints[j], e = ends->ints[j];
    if (axis == 0) {
      // The whole batch (x[:, ...] exports a Slice over axis 0 from 0 to the end only when written out).
      if (s == 0 && step == 1 && (e >= std::numeric_limits<int32_t>::max() || ends->is_batch(j))) continue;
      return Refuse(i, "a Slice of the ids along the batch axis is not supported (supported: columns, axis 1)");
    }
    if (axis != 1 || ids.ids_rank != 1 || step < 1) {
      return Refuse(i, absl::StrCat("a Slice of the ids along axis ", axes[j], " with step ", step,
                                    " is not supported (supported: columns of [N, F] ids, axis 1, positive steps)"));
    }
    const int64_t f = static_cast<int64_t>(ids.columns.size());
    const int64_t from = std::clamp<int64_t>(s < 0 ? s + f : s, 0, f), to = std::clamp<int64_t>(e < 0 ? e + f : e, 0, f);
    out.columns.clear();
    for (int64_t c = from; c < to; c += step) out.columns.push_back(ids.columns[c]);
    if (out.columns.empty()) return Refuse(i, "a Slice of the ids that keeps no column");
  }
  values_[n.output(0)] = std::move(out);
  return absl::OkStatus();
}

absl::Status Mapper::MapCastOfIds(int i, const Value& ids) {
  const int64_t to = AttrInt(node(i), "to", 0);
  if (to != ::onnx::TensorProto::INT64) {
    return Refuse(i, absl::StrCat("Cast of the ids to ", DataTypeName(static_cast<int>(to)),
                                  " is not supported (supported: INT64 ids, as nn.Embedding takes them)"));
  }
  values_[node(i).output(0)] = ids;
  return absl::OkStatus();
}

absl::Status Mapper::MapSqueeze(int i) {
  const ::onnx::NodeProto& n = node(i);
  const bool squeeze = n.op_type() == "Squeeze";
  ASSIGN_OR_RETURN(const Value* in, Get(i, 0));
  // Axes: an input from opset 13 on, an attribute before.
  std::vector<int64_t> axes = AttrInts(n, "axes");
  if (f_.opset >= 13 && n.input_size() > 1) {
    ASSIGN_OR_RETURN(const Const* a, ConstIn(i, 1));
    if (a != nullptr) axes = a->ints;
  }
  if (in->head_of >= 0 && !in->softmax_head && squeeze && IsFinalOutput(n.output(0))) {
    Value out;  // the Sigmoid head's output squeezed: still the head
    out.head_of = in->head_of;
    values_[n.output(0)] = out;
    return absl::OkStatus();
  }
  if (in->ids) {
    Value out = *in;
    std::vector<int64_t> norm = axes;
    const bool one = NormalizeAxes(&norm, squeeze ? in->ids_rank + 1 : in->ids_rank + 2) &&
                     norm == std::vector<int64_t>{1};
    if (squeeze && in->ids_rank == 1 && in->columns.size() == 1 && (axes.empty() || one)) {
      out.ids_rank = 0;
    } else if (!squeeze && in->ids_rank == 0 && one) {
      out.ids_rank = 1;
    } else {
      return Refuse(i, absl::StrCat(n.op_type(), " of the ids over axes [", absl::StrJoin(axes, ","),
                                    "] is not supported (supported: between one column [N] and [N, 1])"));
    }
    values_[n.output(0)] = std::move(out);
    return absl::OkStatus();
  }
  return MapSqueezeOfTensor(i);
}

absl::StatusOr<int> Mapper::TableOf(int i, const Const& c) {
  auto it = tables_.find(c.initializer);
  if (it != tables_.end()) return it->second;
  if (var_names_.count(c.initializer)) {
    return Refuse(i, absl::StrCat("its table '", c.initializer, "' is also a weight of another node (tied weights; "
                                  "supported: a table that only Gather reads)"));
  }
  TableInfo t;
  t.name = c.initializer;
  t.rows = c.dims[0];
  t.dim = static_cast<int>(c.dims[1]);
  t.init_scale = 0.0f;  // unused: the rows start from the file's values
  t.initial_values = c.floats;
  ASSIGN_OR_RETURN(const int table, b_->AddTable(std::move(t)));
  tables_[c.initializer] = table;
  return table;
}

absl::Status Mapper::MapEmbedding(int i, const Value& ids) {
  const ::onnx::NodeProto& n = node(i);
  ASSIGN_OR_RETURN(const Value* data, Get(i, 0));
  const std::string table_name = InputName(n, 0);
  if (data->constant == nullptr || data->constant->initializer.empty()) {
    return Refuse(i, absl::StrCat("its table '", table_name, "' is ", data->constant == nullptr ? "computed by the "
                                  "graph" : "a Constant, not an initializer", " (", kIdsSupported, ")"));
  }
  const Const& c = *data->constant;
  if (c.type != Const::Type::kFloat || c.data_type != ::onnx::TensorProto::FLOAT || c.dims.size() != 2 ||
      c.dims[0] < 1 || c.dims[1] < 1) {
    return Refuse(i, absl::StrCat("its table '", table_name, "' is a ", DataTypeName(c.data_type), " initializer of "
                                  "shape ", ShapeText(c.dims), " (supported: a FLOAT table [rows, dim])"));
  }
  int64_t axis = AttrInt(n, "axis", 0);
  if (axis < 0) axis += 2;
  if (axis != 0) {
    return Refuse(i, absl::StrCat("attribute axis=", AttrInt(n, "axis", 0), " gathers columns of the table '",
                                  table_name, "' (supported: axis=0, its rows, as nn.Embedding exports)"));
  }
  ASSIGN_OR_RETURN(const int table, TableOf(i, c));
  std::vector<int> parts;
  for (int column : ids.columns) {
    auto [it, inserted] = table_of_feature_.emplace(column, table);
    if (it->second != table) {
      return Refuse(i, absl::StrCat("column ", column, " of the ids is looked up in tables '",
                                    b_->graph().tables[it->second].name, "' and '", table_name,
                                    "' (supported: each column in one table)"));
    }
    Node e = Make(i, Op::kEmbedding);
    if (ids.ids_rank == 1) e.name = absl::StrCat(e.name, ":", column);
    e.embedding.table = table;
    e.embedding.feature = column;
    if (ids.ids_rank == 0) return Emit(i, std::move(e), {}, {});
    ASSIGN_OR_RETURN(const int part, b_->Add(std::move(e), {}, {}, absl::StrCat(n.output(0), ":", column)));
    parts.push_back(part);
  }
  Value v;
  v.parts = std::move(parts);
  v.lookup_node = NodeName(n, i);
  values_[n.output(0)] = std::move(v);
  return absl::OkStatus();
}

absl::StatusOr<int> Mapper::Stack(const std::string& name, Value* v) {
  int flat = v->parts[0];
  if (v->parts.size() > 1) {
    Node cat;
    cat.op = Op::kConcat;
    cat.name = v->lookup_node + "/stack";
    cat.axis = 1;  // full axes: after the batch
    ASSIGN_OR_RETURN(flat, b_->Add(std::move(cat), v->parts, {}, name + ":stacked"));
  }
  const std::vector<int64_t> rows = {static_cast<int64_t>(v->parts.size()), b_->shape(v->parts[0]).dims[0]};
  ASSIGN_OR_RETURN(v->tensor, b_->Add(Node::Reshape(v->lookup_node + "/rows", rows, FlattenOrder::kChannelsFirst),
                                      {flat}, {}, name));
  return v->tensor;
}

absl::Status Mapper::MapReduce(int i) {
  const ::onnx::NodeProto& n = node(i);
  const bool mean = n.op_type() == "ReduceMean";
  ASSIGN_OR_RETURN(const Value* in, Get(i, 0));
  // Axes: ReduceSum's input from opset 13 on, an attribute otherwise.
  std::vector<int64_t> axes = AttrInts(n, "axes");
  if (!mean && f_.opset >= 13 && n.input_size() > 1) {
    ASSIGN_OR_RETURN(const Const* a, ConstIn(i, 1));
    if (a != nullptr) axes = a->ints;
  }
  const std::vector<int64_t> given = axes;
  const bool over_columns = NormalizeAxes(&axes, 3) && axes == std::vector<int64_t>{1};
  if (in->parts.empty() || !over_columns) {
    return Refuse(i, absl::StrCat(n.op_type(), " over axes [", absl::StrJoin(given, ","), "] of '", InputName(n, 0),
                                  "' is not supported (supported: over axis 1, the columns, of an embedding lookup "
                                  "of [N, F] ids: [N, F, dim] -> [N, dim], as .sum(1) / .mean(1))"));
  }
  const std::vector<int> parts = in->parts;
  const std::string& out = n.output(0);
  const bool keepdims = AttrInt(n, "keepdims", 1) != 0;
  int acc = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) {
    Node add = Make(i, Op::kBinary);
    add.name = absl::StrCat(add.name, "/add", k);
    add.binary = kernels::BinaryOp::kAdd;
    ASSIGN_OR_RETURN(acc, b_->Add(std::move(add), {acc, parts[k]}, {}, absl::StrCat(out, ":sum", k)));
  }
  if (mean && parts.size() > 1) {
    Node scale = Make(i, Op::kBinary);
    scale.name = absl::StrCat(scale.name, "/mean");
    scale.binary = kernels::BinaryOp::kMul;
    Initializer init;
    init.kind = Initializer::Kind::kValues;
    init.values = std::make_shared<const std::vector<float>>(1, 1.0f / static_cast<float>(parts.size()));
    std::string var = absl::StrCat(out, "/1/", parts.size());
    var_names_.insert(var);
    ASSIGN_OR_RETURN(acc, b_->Add(std::move(scale), {acc}, {VarSpec(var, {1}, std::move(init), 0.0f, false)},
                                  absl::StrCat(out, ":mean")));
  }
  if (keepdims) {
    return Emit(i, Node::Reshape(NodeName(n, i), {1, b_->shape(acc).dims[0]}, FlattenOrder::kChannelsFirst), {acc},
                {});
  }
  if (acc == parts[0]) return Emit(i, Make(i, Op::kIdentity), {acc}, {});
  Value v;
  v.tensor = acc;
  values_[out] = v;
  return absl::OkStatus();
}

int Mapper::SoleReader(const std::string& value) const {
  auto readers = f_.readers.find(value);
  return readers != f_.readers.end() && readers->second.size() == 1 ? readers->second[0] : -1;
}

bool Mapper::IsGraphOutput(const std::string& value) const {
  return std::find(f_.outputs.begin(), f_.outputs.end(), value) != f_.outputs.end();
}

bool Mapper::IsFinalOutput(const std::string& name) const {
  if (f_.outputs.empty() || f_.outputs[0] != name) return false;
  auto readers = f_.readers.find(name);
  return readers == f_.readers.end() || readers->second.empty();
}

absl::StatusOr<bool> Mapper::MapSigmoidHead(int i) {
  const ::onnx::NodeProto& n = node(i);
  if (o_.forward_only) return false;
  // The graph's output, or read only by a Squeeze that is (torch.sigmoid(logit).squeeze(1)).
  const int reader = SoleReader(n.output(0));
  const bool squeezed =
      reader >= 0 && node(reader).op_type() == "Squeeze" && IsFinalOutput(node(reader).output(0));
  if (!IsFinalOutput(n.output(0)) && !squeezed) return false;
  ASSIGN_OR_RETURN(const Value* in, Get(i, 0));
  int logit = -1;
  if (in->head_of >= 0 && !in->softmax_head) {
    logit = in->head_of;  // Sigmoid(x.squeeze(1))
  } else if (in->tensor >= 0 && in->head_of < 0 && b_->shape(in->tensor).dims == std::vector<int64_t>{1}) {
    logit = in->tensor;
  }
  if (logit < 0) return false;
  Value v;
  v.head_of = logit;
  values_[n.output(0)] = v;
  return true;
}

}  // namespace dtrain::models::onnx
