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
  return names;
}

absl::StatusOr<ModelRef> ResolveModel(const std::string& model, const ResolveOptions& options) {
  for (const ModelDef* def : Builtins()) {
    if (model == def->name) return BuiltinSpec(def);
  }
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
