#include "worker/models/onnx/onnx_export.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/onnx/onnx_external_data.h"
#include "worker/models/onnx/onnx_file.h"

namespace dtrain::models::onnx {
namespace {

// Initializers of fewer bytes stay inside the .onnx file when the rest goes to external data (onnx.save_model's
// default size_threshold).
constexpr int64_t kExternalThreshold = 1024;

// `t` cleared down to FLOAT, its name and dims: what SetWeights fills with n floats.
void ClearToFloat(::onnx::TensorProto* t) {
  t->clear_raw_data();
  t->clear_float_data();
  t->clear_double_data();
  t->clear_int32_data();
  t->clear_int64_data();
  t->clear_uint64_data();
  t->clear_string_data();
  t->clear_external_data();
  t->clear_data_location();
  t->set_data_type(::onnx::TensorProto::FLOAT);
}

absl::string_view FloatBytes(const float* values, int64_t n) {
  return absl::string_view(reinterpret_cast<const char*>(values), static_cast<size_t>(n) * sizeof(float));
}

// The exported model before its weights are placed: `model` with every initializer export writes (variables,
// tables, the file's values the import dropped) cleared to FLOAT with its name and dims, and `weights` their
// bytes (views of the params, the rows and the file's values, which outlive it), in the initializers' order.
struct Draft {
  ::onnx::ModelProto model;
  std::vector<ExternalTensor> weights;
};

// Every weight into its tensor (the export in one file).
void PlaceInside(Draft* d) {
  for (const ExternalTensor& w : d->weights) w.tensor->set_raw_data(std::string(w.bytes));
}

// The .onnx file the model was imported from (messages name it).
const std::string& SourceFile(const ModelSpec& spec) {
  return std::static_pointer_cast<const OnnxFile>(spec.source)->file;
}

// The .onnx file's size with every weight inside (a bound: each tensor's length prefixes counted in full).
int64_t InlineSize(const Draft& d) {
  int64_t size = static_cast<int64_t>(d.model.ByteSizeLong());
  for (const ExternalTensor& w : d.weights) size += static_cast<int64_t>(w.bytes.size()) + 32;
  return size;
}

// The model's bytes once its weights are in place; InvalidArgument beyond protobuf's limit.
absl::StatusOr<std::string> Serialize(const std::string& file, const ::onnx::ModelProto& model) {
  const size_t size = model.ByteSizeLong();
  if (size > static_cast<size_t>(kMaxProtobufBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": the exported model takes ", size, " bytes, over protobuf's limit of ", kMaxProtobufBytes,
        " bytes (2 GB) on one .onnx file; export it to a path, with its weights as external data"));
  }
  std::string bytes;
  if (!model.SerializeToString(&bytes)) {
    return absl::InternalError(absl::StrCat(file, ": the exported model does not serialize"));
  }
  return bytes;
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

namespace {

// The export's model with its weights not yet placed (Draft).
absl::StatusOr<std::unique_ptr<Draft>> MakeDraft(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
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
  auto d = std::make_unique<Draft>();
  d->model = *f.model;
  for (::onnx::TensorProto& t : *d->model.mutable_graph()->mutable_initializer()) {
    auto rows = tables.find(t.name());
    if (rows != tables.end()) {
      const std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
      const int64_t n = dims.size() == 2 ? dims[0] * dims[1] : -1;
      if (t.data_type() != ::onnx::TensorProto::FLOAT || n != static_cast<int64_t>(rows->second.size())) {
        return absl::InvalidArgumentError(absl::StrCat(f.file, ": ", rows->second.size(), " values for the embedding "
                                                       "table '", t.name(), "' of shape ", absl::StrJoin(dims, "x")));
      }
      ClearToFloat(&t);
      d->weights.push_back({&t, FloatBytes(rows->second.data(), n)});
      written.insert(t.name());
      continue;
    }
    auto it = by_name.find(t.name());
    if (it != by_name.end()) {
      const VariableInfo& v = *it->second.second;
      const std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
      int64_t size = 1;
      for (int64_t dim : dims) size *= dim;
      // A variable the graph reads reshaped (a [C] scale as [1, C, 1, 1]) keeps its initializer's dims.
      if (dims != v.shape && size != v.size()) {
        return absl::InvalidArgumentError(absl::StrCat(f.file, ": variable '", v.name, "' has shape ",
                                                       absl::StrJoin(v.shape, "x"), " but its initializer ",
                                                       absl::StrJoin(dims, "x")));
      }
      ClearToFloat(&t);
      d->weights.push_back({&t, FloatBytes(params + it->second.first, v.size())});
      continue;
    }
    // An initializer whose data the import dropped (it was a variable there) gets the file's values back.
    auto kept = f.initializers.find(t.name());
    if (kept != f.initializers.end() && kept->second->type == Const::Type::kFloat && !t.has_raw_data() &&
        t.float_data_size() == 0 && kept->second->size() > 0) {
      ClearToFloat(&t);
      d->weights.push_back({&t, FloatBytes(kept->second->floats->data(), kept->second->size())});
    }
  }
  for (const auto& [name, rows] : tables) {
    if (written.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(f.file, ": rows for '", name, "', which is not an initializer"));
    }
  }
  if (options.inference) RETURN_IF_ERROR(ForInference(f.file, d->model.mutable_graph()));
  return d;
}

bool WantsExternalData(const ModelSpec& spec, const Draft& d, const ExportOptions& options) {
  switch (options.weights) {
    case ExportOptions::Weights::kInside:
      return false;
    case ExportOptions::Weights::kExternal:
      return true;
    case ExportOptions::Weights::kAuto:
      break;
  }
  return std::static_pointer_cast<const OnnxFile>(spec.source)->external_data ||
         InlineSize(d) > std::min(options.max_file_bytes, kMaxProtobufBytes);
}

// `path`'s last component.
std::string BaseName(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

// Writes `bytes` (or, with `tensors`, their external data) to a new temporary file beside `path`, synced and
// closed; its name in `*tmp` (set before anything is created).
absl::Status WriteTemporary(Env* env, const std::string& path, absl::string_view bytes,
                            const std::vector<ExternalTensor>* tensors, const std::string& location, std::string* tmp) {
  *tmp = TemporaryFileName(path);
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, env->NewWritableFile(*tmp));
  absl::Status status =
      tensors != nullptr ? WriteExternalData(*tensors, location, file.get()) : file->Append(bytes);
  if (status.ok()) status = file->Sync();
  absl::Status closed = file->Close();  // even after a failure, before the removal
  return status.ok() ? closed : status;
}

// The .onnx at `path` and its weights in `path`.data (location: the data file's name), each written to a
// temporary file first; both renamed into place only once both are complete, the data file first.
absl::Status WriteWithExternalData(Draft* d, const std::string& file, const std::string& path, Env* env) {
  const std::string data_path = path + ".data";
  const std::string location = BaseName(data_path);
  std::vector<ExternalTensor> outside;
  std::set<const ::onnx::TensorProto*> weights;
  for (const ExternalTensor& w : d->weights) weights.insert(w.tensor);
  size_t next = 0;
  for (::onnx::TensorProto& t : *d->model.mutable_graph()->mutable_initializer()) {
    // In the initializers' order: the weights (in that order already) and the file's other large initializers.
    if (weights.count(&t)) {
      const ExternalTensor& w = d->weights[next++];
      if (static_cast<int64_t>(w.bytes.size()) >= kExternalThreshold) {
        outside.push_back(w);
      } else {
        t.set_raw_data(std::string(w.bytes));
      }
    } else if (t.has_raw_data() && static_cast<int64_t>(t.raw_data().size()) >= kExternalThreshold) {
      outside.push_back({&t, t.raw_data()});
    }
  }
  std::string tmp_data, tmp_model;
  absl::Status status = WriteTemporary(env, data_path, "", &outside, location, &tmp_data);
  if (status.ok()) {
    absl::StatusOr<std::string> bytes = Serialize(file, d->model);
    status = bytes.ok() ? WriteTemporary(env, path, *bytes, nullptr, "", &tmp_model) : bytes.status();
  }
  if (status.ok()) status = env->RenameFile(tmp_data, data_path);
  if (status.ok()) status = env->RenameFile(tmp_model, path);
  if (!status.ok()) {
    for (const std::string& tmp : {tmp_data, tmp_model}) {
      if (tmp.empty()) continue;
      absl::Status removed = env->RemoveFile(tmp);
      if (!removed.ok() && !absl::IsNotFound(removed)) {
        status = absl::Status(status.code(), absl::StrCat(status.message(), "; and the temporary file could not be "
                                                                            "removed: ", removed.message()));
      }
    }
    return status;
  }
  return env->SyncDir(ParentDir(path));
}

}  // namespace

absl::StatusOr<std::string> ExportOnnxBytes(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
                                            const float* params, const TableRows& tables,
                                            const ExportOptions& options) {
  if (options.weights == ExportOptions::Weights::kExternal) {
    return absl::InvalidArgumentError("external data needs a path beside which to write it: use ExportOnnx");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Draft> d, MakeDraft(spec, vars, params, tables, options));
  PlaceInside(d.get());
  return Serialize(SourceFile(spec), d->model);
}

absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const TableRows& tables, const std::string& path, const ExportOptions& options, Env* env) {
  ASSIGN_OR_RETURN(std::unique_ptr<Draft> d, MakeDraft(spec, vars, params, tables, options));
  if (WantsExternalData(spec, *d, options)) return WriteWithExternalData(d.get(), SourceFile(spec), path, env);
  PlaceInside(d.get());
  ASSIGN_OR_RETURN(std::string bytes, Serialize(SourceFile(spec), d->model));
  RETURN_IF_ERROR(WriteFileAtomically(env, path, bytes));
  // An earlier export to `path` with external data left PATH.data: nothing refers to it now (the file just
  // replaced was its only reader), so it goes rather than sit beside the new file as if it belonged to it.
  const std::string stale = path + ".data";
  if (env->FileExists(stale)) {
    absl::Status removed = env->RemoveFile(stale);
    if (!removed.ok() && !absl::IsNotFound(removed)) {
      return absl::Status(removed.code(), absl::StrCat("wrote ", path, " (its weights inside), but the stale ", stale,
                                                       " of an earlier export could not be removed: ",
                                                       removed.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const std::string& path, const ExportOptions& options, Env* env) {
  return ExportOnnx(spec, vars, params, TableRows(), path, options, env);
}

}  // namespace dtrain::models::onnx
