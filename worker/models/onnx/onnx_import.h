// Import of ONNX models (ai.onnx domain, opsets 11-17, IR version <= 8): the file becomes a Graph
// (worker/models/graph.h) whose variables are its float initializers, under their ONNX names and starting from
// the file's values. See README.md ("Bring your own model") for what is supported and how to export from
// PyTorch.
//
// Thread-safety: plain functions.
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_IMPORT_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_IMPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/models/model.h"

namespace dtrain::models::onnx {

struct ImportOptions {
  // BatchNormalization's running_var update: unbiased batch variance (PyTorch) or biased (ONNX's reference).
  bool bn_unbiased_running_var = true;
};

// Reads and checks `path`, folds the constant shape arithmetic exporters emit, and maps every node onto the
// graph's ops. The spec's build_graph checks the data set's geometry and classes against the model's input and
// output; its `source` holds the parsed file for export (worker/models/onnx/onnx_export.h).
// Errors: NotFound (no such file), DataLoss (not an ONNX protobuf), InvalidArgument with one line naming the
// node, its op and the attribute that is not supported, what is, and how to export instead.
absl::StatusOr<ModelRef> ImportModel(const std::string& path, const ImportOptions& options = {});

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_IMPORT_H_
