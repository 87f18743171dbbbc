// Export of a trained imported model as ONNX: the file it was imported from (ModelSpec::source), with every
// initializer that is a variable (weights, biases, BatchNorm's scale, bias and running statistics) replaced by
// the trained values, FLOAT with its dims and name kept and the data in raw_data; everything else (nodes and
// their order and names, opset, IR version, producer, metadata, the initializers that are not variables) as it
// was. PyTorch loads the result into the module it was exported from (load_state_dict, see README.md), and
// onnxruntime runs it.
//
//   ASSIGN_OR_RETURN(std::vector<models::VariableInfo> vars, models::ModelVariables(*spec, options));
//   RETURN_IF_ERROR(models::onnx::ExportOnnx(*spec, vars, params.data(), "trained.onnx"));
//
// Thread-safety: plain functions (the spec is only read).
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_EXPORT_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "worker/models/model.h"

namespace dtrain::models::onnx {

struct ExportOptions {
  // For inference runtimes (onnxruntime): BatchNormalization nodes get training_mode=0 (they normalize with the
  // running statistics, as dtrain's evaluation does; in the training graph a runtime uses each batch's own) and
  // Dropout nodes lose their training_mode input (off); the outputs only training gives (running statistics,
  // masks) are dropped. FailedPrecondition when a node reads one. Default: the graph exactly as imported.
  bool inference = false;
};

// The exported file's bytes. `params` holds TotalSize(vars) floats laid out as `vars` (the flat buffer of a
// model built from `spec`). FailedPrecondition when `spec` is not an ONNX import; InvalidArgument when a
// variable's shape differs from its initializer's.
absl::StatusOr<std::string> ExportOnnxBytes(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
                                            const float* params, const ExportOptions& options = {});

// ExportOnnxBytes written to `path` atomically (a temporary file beside it, renamed over it): on failure nothing
// is left and an existing file is untouched.
absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const std::string& path, const ExportOptions& options = {}, Env* env = Env::Default());

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_EXPORT_H_
