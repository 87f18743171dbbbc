#include "worker/models/onnx/onnx_import.h"

#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "worker/models/graph.h"
#include "worker/models/onnx/onnx_external_data.h"
#include "worker/models/onnx/onnx_file.h"
#include "worker/models/onnx/onnx_mapper.h"

namespace dtrain::models::onnx {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL, kFnvPrime = 0x100000001b3ULL;

uint64_t Fnv(absl::string_view s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * kFnvPrime;
  return (h ^ 0xff) * kFnvPrime;  // a separator, so that ("ab", "c") and ("a", "bc") differ
}

// A hash of what the graph computes beyond its variables: opset, input, nodes (op, wiring, attributes), outputs.
std::string StructureHash(const OnnxFile& f) {
  uint64_t h = Fnv(absl::StrCat("opset", f.opset), kFnvOffset);
  h = Fnv(f.data_input, h);
  for (int64_t d : f.input_dims) h = Fnv(absl::StrCat(d), h);
  if (!f.ids_input.empty()) {
    h = Fnv(absl::StrCat("ids:", f.ids_input), h);
    for (int64_t d : f.ids_dims) h = Fnv(absl::StrCat(d), h);
  }
  for (const ::onnx::NodeProto& n : f.model->graph().node()) {
    h = Fnv(n.op_type(), h);
    h = Fnv(n.domain(), h);
    for (const std::string& in : n.input()) h = Fnv(in, h);
    h = Fnv("->", h);
    for (const std::string& out : n.output()) h = Fnv(out, h);
    for (const ::onnx::AttributeProto& a : n.attribute()) h = Fnv(a.SerializeAsString(), h);
  }
  for (const std::string& out : f.outputs) h = Fnv(out, h);
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// The geometry of the images the file is made for (synthetic data for benchmarks); 28x28x1 when unknown. A
// model with ids reads click-through-rate data: its dense features as C x 1 x 1.
void SetDataGeometry(const OnnxFile& f, ModelDefaults* d) {
  const std::vector<int64_t>& dims = f.input_dims;
  if (!f.ids_input.empty()) {
    d->data_height = d->data_width = 1;
    d->data_channels = dims.size() == 1 && dims[0] > 0 ? static_cast<int>(dims[0]) : 1;
    return;
  }
  bool known = true;
  int64_t size = 1;
  for (int64_t x : dims) {
    known = known && x > 0;
    size *= x;
  }
  if (!known) return;
  if (dims.size() == 3) {
    d->data_channels = static_cast<int>(dims[0]);
    d->data_height = static_cast<int>(dims[1]);
    d->data_width = static_cast<int>(dims[2]);
  } else if (size == 3 * 32 * 32) {
    d->data_channels = 3, d->data_height = 32, d->data_width = 32;
  } else if (size != 28 * 28) {
    d->data_channels = static_cast<int>(size), d->data_height = 1, d->data_width = 1;
  }
}

}  // namespace

absl::StatusOr<ModelRef> ImportModel(const std::string& path, const ImportOptions& options) {
  // A file protobuf cannot parse is refused before it is read into memory.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > kMaxProtobufBytes) {
    return ModelFileTooLarge(path, st.st_size);
  }
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  return ImportModelFromBytes(*std::move(bytes), path, options);
}

absl::StatusOr<ModelRef> ImportModelFromBytes(std::string bytes, const std::string& file,
                                              const ImportOptions& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<OnnxFile> f, ReadOnnxFile(std::move(bytes), file));

  auto spec = std::make_shared<ModelSpec>();
  spec->name = f->name;
  spec->path = file;
  spec->structure = StructureHash(*f);
  ModelDefaults& d = spec->defaults;
  d.optimizer = "pytorch_adam";  // the exporter's framework's Adam
  d.learning_rate = 0.001f;
  d.batch_size = 100;
  SetDataGeometry(*f, &d);
  if (!f->ids_input.empty()) {
    // Embedding lookups: click-through-rate data; the rows on the ps move with lazy Adam (torch.optim.SparseAdam's
    // kind: only the rows a step touches) at the dense learning rate unless the flags say otherwise.
    d.ctr_data = true;
    d.sparse_optimizer = "adam";
  }

  // With the file's own input fixed, map it now: what it refuses is refused at import. Then the data of the
  // initializers that became variables or embedding tables is dropped from the kept file: `initializers` holds
  // their values, and export writes the trained ones in their place.
  bool fixed = true;
  for (int64_t x : f->input_dims) fixed = fixed && x > 0;
  if (fixed) {
    ASSIGN_OR_RETURN(Graph graph, MapGraph(*f, options, nullptr));
    std::set<std::string> variables;
    for (const VariableInfo& v : graph.variables) variables.insert(v.name);
    for (const TableInfo& t : graph.tables) f->tables.insert(t.name);
    for (::onnx::TensorProto& t : *f->model->mutable_graph()->mutable_initializer()) {
      if (variables.count(t.name()) == 0 && f->tables.count(t.name()) == 0) continue;
      t.clear_raw_data();
      t.clear_float_data();
    }
  }

  std::shared_ptr<const OnnxFile> source = f;
  spec->source = source;
  spec->build_graph = [source, options](const ModelOptions& o) -> absl::StatusOr<Graph> {
    const DataGeometry data{o.channels, o.height, o.width, o.num_sparse};
    ASSIGN_OR_RETURN(Graph graph, MapGraph(*source, options, &data));
    if (!options.forward_only && graph.loss == Loss::kSigmoidCrossEntropy && o.num_classes != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          source->file, ": the model's output '", graph.tensor_names[graph.output], "' is one logit (sigmoid "
          "cross-entropy against 0/1 labels) but the data set has ", o.num_classes, " classes"));
    }
    if (!options.forward_only && graph.loss != Loss::kSigmoidCrossEntropy &&
        graph.output_shape().size() != o.num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(
          source->file, ": the model's output '", graph.tensor_names[graph.output], "' gives ",
          graph.output_shape().size(), " class logits but the data set has ", o.num_classes,
          " classes; export the model for ", o.num_classes, " classes"));
    }
    return graph;
  };
  return ModelRef(std::move(spec));
}

}  // namespace dtrain::models::onnx
