// Export of a trained imported model as ONNX: the file it was imported from (ModelSpec::source), with every
// initializer that is a variable (weights, biases, BatchNorm's scale, bias and running statistics) or an
// embedding table replaced by the trained values, FLOAT with its dims and name kept and the data in raw_data; everything else (nodes and
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

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "worker/models/graph.h"
#include "worker/models/model.h"

namespace dtrain::models::onnx {

struct ExportOptions {
  // For inference runtimes (onnxruntime): BatchNormalization nodes get training_mode=0 (they normalize with the
  // running statistics, as dtrain's evaluation does; in the training graph a runtime uses each batch's own) and
  // Dropout nodes lose their training_mode input (off); the outputs only training gives (running statistics,
  // masks) are dropped. FailedPrecondition when a node reads one. Default: the graph exactly as imported.
  bool inference = false;
};

// The rows of a model's embedding tables (Graph::tables, named after their initializers): name -> rows * dim
// floats, row i at [i * dim, (i + 1) * dim). Trained ones come from the ps: dtrain_worker --export_onnx pulls
// every row at the end; dtrain_eval assembles them from a checkpoint (ps::ReadSparseTables,
// ps::AssembleFixedTable with the file's rows for those the checkpoint lacks).
using TableRows = std::map<std::string, std::vector<float>>;
// The file's own rows of each table of `graph` (TableInfo::initial_values): what an export of the file's
// weights writes.
TableRows FileTableRows(const Graph& graph);

// The exported file's bytes. `params` holds TotalSize(vars) floats laid out as `vars` (the flat buffer of a
// model built from `spec`); `tables` the rows of every embedding table the import found (an initializer then
// gets them as it gets a variable's values). FailedPrecondition when `spec` is not an ONNX import or a table's
// rows are missing; InvalidArgument when a variable's shape differs from its initializer's, or rows are given
// for something that is no table or in another number.
absl::StatusOr<std::string> ExportOnnxBytes(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
                                            const float* params, const TableRows& tables,
                                            const ExportOptions& options = {});
// A model without embedding tables.
absl::StatusOr<std::string> ExportOnnxBytes(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
                                            const float* params, const ExportOptions& options = {});

// ExportOnnxBytes written to `path` atomically (a temporary file beside it, renamed over it): on failure nothing
// is left and an existing file is untouched.
absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const TableRows& tables, const std::string& path, const ExportOptions& options = {},
                        Env* env = Env::Default());
absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const std::string& path, const ExportOptions& options = {}, Env* env = Env::Default());

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_EXPORT_H_
