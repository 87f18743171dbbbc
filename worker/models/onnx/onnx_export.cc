#include "worker/models/onnx/onnx_export.h"

#include <cstring>
#include <set>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_file.h"

namespace dtrain::models::onnx {
namespace {

// `t`'s data replaced by n floats (FLOAT, raw_data), its name and dims kept.
void SetFloats(::onnx::TensorProto* t, const float* values, int64_t n) {
  t->clear_float_data();
  t->clear_double_data();
  t->clear_int32_data();
  t->clear_int64_data();
  t->clear_uint64_data();
  t->clear_string_data();
  t->clear_external_data();
  t->clear_data_location();
  t->set_data_type(::onnx::TensorProto::FLOAT);
  t->set_raw_data(std::string(reinterpret_cast<const char*>(values), static_cast<size_t>(n) * sizeof(float)));
}

// ExportOptions::inference on `g`: BatchNormalization with training_mode=0, Dropout without training_mode, and
// their training-only outputs dropped.
absl::Status ForInference(const std::string& file, ::onnx::GraphProto* g) {
  std::set<std::string> read;
  for (const ::onnx::NodeProto& n : g->node()) read.insert(n.input().begin(), n.input().end());
  for (const ::onnx::ValueInfoProto& o : g->output()) read.insert(o.name());
  for (::onnx::NodeProto& n : *g->mutable_node()) {
    if (n.op_type() != "BatchNormalization" && n.op_type() != "Dropout") continue;
    for (int k = 1; k < n.output_size(); ++k) {
      if (!n.output(k).empty() && read.count(n.output(k))) {
        return absl::FailedPreconditionError(absl::StrCat(file, ": node '", n.name(), "' (", n.op_type(),
                                                          "): its training output '", n.output(k),
                                                          "' is read, so the graph has no inference form"));
      }
    }
    while (n.output_size() > 1) n.mutable_output()->RemoveLast();
    if (n.op_type() == "Dropout") {
      while (n.input_size() > 2) n.mutable_input()->RemoveLast();
      continue;
    }
    bool found = false;
    for (::onnx::AttributeProto& a : *n.mutable_attribute()) {
      if (a.name() == "training_mode") {
        a.set_i(0);
        found = true;
      }
    }
    (void)found;  // absent: inference already (opset < 14 decides by the outputs, now one)
  }
  return absl::OkStatus();
}

}  // namespace

TableRows FileTableRows(const Graph& graph) {
  TableRows out;
  for (const TableInfo& t : graph.tables) {
    if (t.initial_values != nullptr) out[t.name] = *t.initial_values;
  }
  return out;
}

absl::StatusOr<std::string> ExportOnnxBytes(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
                                            const float* params, const ExportOptions& options) {
  return ExportOnnxBytes(spec, vars, params, TableRows(), options);
}

absl::StatusOr<std::string> ExportOnnxBytes(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
                                            const float* params, const TableRows& tables,
                                            const ExportOptions& options) {
  if (!spec.imported() || spec.source == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", spec.name, "' is not an ONNX import: only a model trained from --model=PATH.onnx exports as ONNX"));
  }
  const OnnxFile& f = *std::static_pointer_cast<const OnnxFile>(spec.source);
  std::unordered_map<std::string, std::pair<int64_t, const VariableInfo*>> by_name;
  int64_t offset = 0;
  for (const VariableInfo& v : vars) {
    by_name[v.name] = {offset, &v};
    offset += v.size();
  }
  for (const std::string& table : f.tables) {
    if (tables.count(table) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          f.file, ": no rows for the embedding table '", table, "' (its rows live on the ps: export with "
          "dtrain_worker --export_onnx, or dtrain_eval --checkpoint=DIR --export=FILE.onnx)"));
    }
  }
  std::set<std::string> written;
  ::onnx::ModelProto out = *f.model;
  for (::onnx::TensorProto& t : *out.mutable_graph()->mutable_initializer()) {
    auto rows = tables.find(t.name());
    if (rows != tables.end()) {
      const std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
      const int64_t n = dims.size() == 2 ? dims[0] * dims[1] : -1;
      if (t.data_type() != ::onnx::TensorProto::FLOAT || n != static_cast<int64_t>(rows->second.size())) {
        return absl::InvalidArgumentError(absl::StrCat(f.file, ": ", rows->second.size(), " values for the embedding "
                                                       "table '", t.name(), "' of shape ", absl::StrJoin(dims, "x")));
      }
      SetFloats(&t, rows->second.data(), n);
      written.insert(t.name());
      continue;
    }
    auto it = by_name.find(t.name());
    if (it != by_name.end()) {
      const VariableInfo& v = *it->second.second;
      const std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
      int64_t size = 1;
      for (int64_t d : dims) size *= d;
      // A variable the graph reads reshaped (a [C] scale as [1, C, 1, 1]) keeps its initializer's dims.
      if (dims != v.shape && size != v.size()) {
        return absl::InvalidArgumentError(absl::StrCat(f.file, ": variable '", v.name, "' has shape ",
                                                       absl::StrJoin(v.shape, "x"), " but its initializer ",
                                                       absl::StrJoin(dims, "x")));
      }
      SetFloats(&t, params + it->second.first, v.size());
      continue;
    }
    // An initializer whose data the import dropped (it was a variable there) gets the file's values back.
    auto kept = f.initializers.find(t.name());
    if (kept != f.initializers.end() && kept->second->type == Const::Type::kFloat && !t.has_raw_data() &&
        t.float_data_size() == 0 && kept->second->size() > 0) {
      SetFloats(&t, kept->second->floats->data(), kept->second->size());
    }
  }
  for (const auto& [name, rows] : tables) {
    if (written.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(f.file, ": rows for '", name, "', which is not an initializer"));
    }
  }
  if (options.inference) RETURN_IF_ERROR(ForInference(f.file, out.mutable_graph()));
  std::string bytes;
  if (!out.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat(f.file, ": the exported model does not serialize (over 2 GB?)"));
  }
  return bytes;
}

absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const TableRows& tables, const std::string& path, const ExportOptions& options, Env* env) {
  ASSIGN_OR_RETURN(std::string bytes, ExportOnnxBytes(spec, vars, params, tables, options));
  return WriteFileAtomically(env, path, bytes);
}

absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const std::string& path, const ExportOptions& options, Env* env) {
  return ExportOnnx(spec, vars, params, TableRows(), path, options, env);
}

}  // namespace dtrain::models::onnx
