#include "worker/models/registry.h"

#include <sys/stat.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/models/graph.h"
#include "worker/models/model_defs.h"
#include "worker/models/onnx/onnx_import.h"

namespace dtrain::models {
namespace {

const std::vector<const ModelDef*>& Builtins() {
  static const std::vector<const ModelDef*> defs = {&MlpDef(), &CnnDef(), &ConvnetDef(), &Cifar10Def()};
  return defs;
}

ModelRef BuiltinSpec(const ModelDef* def) {
  auto spec = std::make_shared<ModelSpec>();
  spec->name = def->name;
  spec->defaults = def->defaults;
  spec->build_graph = [def](const ModelOptions& o) {
    return GraphFromLayers(def->name, def->layers(o), {o.height, o.width, o.channels}, o.num_classes);
  };
  return spec;
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

std::vector<std::string> BuiltinModelNames() {
  std::vector<std::string> names;
  for (const ModelDef* def : Builtins()) names.push_back(def->name);
  names.push_back("dlrm");
  return names;
}

// DLRM on click-through-rate data: dense Adam, sparse Adagrad (TensorFlow's recommendation setups), batch 512.
ModelRef DlrmSpec(const DlrmConfig& config) {
  auto spec = std::make_shared<ModelSpec>();
  spec->name = "dlrm";
  spec->defaults.optimizer = "adam";
  spec->defaults.learning_rate = 1e-3f;
  spec->defaults.batch_size = 512;
  spec->defaults.sparse_optimizer = "adagrad";
  spec->defaults.sparse_learning_rate = 0.05f;
  spec->defaults.ctr_data = true;
  spec->defaults.data_height = spec->defaults.data_width = 1;
  spec->defaults.data_channels = 13;
  spec->build_graph = [config](const ModelOptions& o) {
    return DlrmGraph(config, o.height * o.width * o.channels, o.num_sparse);
  };
  // The widths and tables are not all visible in the variables: fold them into the signature.
  spec->structure = absl::StrCat("dim", config.embedding_dim, "-bottom", absl::StrJoin(config.bottom, "x"), "-top",
                                 absl::StrJoin(config.top, "x"), "-rows", config.table_rows, "-max", config.max_rows,
                                 "-admit", config.admit_after);
  return spec;
}

absl::StatusOr<ModelRef> ResolveModel(const std::string& model, const ResolveOptions& options) {
  for (const ModelDef* def : Builtins()) {
    if (model == def->name) return BuiltinSpec(def);
  }
  if (model == "dlrm") return DlrmSpec(options.dlrm);
  if (absl::EndsWithIgnoreCase(model, ".onnx") || IsFile(model)) {
    onnx::ImportOptions io;
    io.bn_unbiased_running_var = options.bn_unbiased_running_var;
    return onnx::ImportModel(model, io);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model \"", model, "\"; known models: ",
                                                 absl::StrJoin(BuiltinModelNames(), ", "),
                                                 ", or the path of an ONNX file (PATH.onnx)"));
}

}  // namespace dtrain::models
