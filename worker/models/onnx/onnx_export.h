// Export of a trained imported model as ONNX: the file it was imported from (ModelSpec::source), with every
// initializer that is a variable (weights, biases, BatchNorm's scale, bias and running statistics) or an
// embedding table replaced by the trained values, FLOAT with its dims and name kept and the data in raw_data; everything else (nodes and
// their order and names, opset, IR version, producer, metadata, the initializers that are not variables) as it
// was. PyTorch loads the result into the module it was exported from (load_state_dict, docs/models.md), and
// onnxruntime runs it.
//
// Weights as external data (ONNX's convention, onnx_external_data.h): a model imported with external data, or one
// whose .onnx would pass protobuf's 2 GB limit, is written as PATH and PATH.data beside it (every initializer of
// 1 KB or more in PATH.data at offsets aligned to 4096 bytes, its location the data file's name), which onnx.load,
// onnxruntime and dtrain read back; other models keep everything inside the one file, as before.
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
  // Where the weights go. kAuto: external data when the model was imported with external data or its .onnx would
  // pass protobuf's 2 GB limit, inside the .onnx otherwise. kInside: always inside (InvalidArgument beyond 2 GB).
  // kExternal: always external data (ExportOnnx only).
  enum class Weights { kAuto, kInside, kExternal };
  Weights weights = Weights::kAuto;
  // The .onnx size beyond which kAuto writes external data: protobuf's limit (tests lower it).
  int64_t max_file_bytes = 2147483647;
};

// The rows of a model's embedding tables (Graph::tables, named after their initializers): name -> rows * dim
// floats, row i at [i * dim, (i + 1) * dim). Trained ones come from the ps: dtrain_worker --export_onnx pulls
// every row at the end; dtrain_eval assembles them from a checkpoint (ps::ReadSparseTables,
// ps::AssembleFixedTable with the file's rows for those the checkpoint lacks).
using TableRows = std::map<std::string, std::vector<float>>;
// The file's own rows of each table of `graph` (TableInfo::initial_values): what an export of the file's
// weights writes.
TableRows FileTableRows(const Graph& graph);

// The exported file's bytes, with every weight inside (options.weights kAuto or kInside; a model imported with
// external data included). `params` holds TotalSize(vars) floats laid out as `vars` (the flat buffer of a
// model built from `spec`); `tables` the rows of every embedding table the import found (an initializer then
// gets them as it gets a variable's values). FailedPrecondition when `spec` is not an ONNX import or a table's
// rows are missing; InvalidArgument when a variable's shape differs from its initializer's, rows are given
// for something that is no table or in another number, the file would pass protobuf's 2 GB limit, or
// options.weights is kExternal.
absl::StatusOr<std::string> ExportOnnxBytes(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
                                            const float* params, const TableRows& tables,
                                            const ExportOptions& options = {});
// A model without embedding tables.
absl::StatusOr<std::string> ExportOnnxBytes(const ModelSpec& spec, const std::vector<VariableInfo>& vars,
                                            const float* params, const ExportOptions& options = {});

// The export written to `path` atomically (a temporary file beside it, renamed over it): on failure nothing is
// left and an existing file is untouched. With external data (options.weights), `path`.data too: both are
// written to temporary files first, then renamed into place, the data file first (a crash between the two renames
// leaves an older .onnx beside the new data file). Errors: those of ExportOnnxBytes (kExternal allowed) and of
// `env`.
absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const TableRows& tables, const std::string& path, const ExportOptions& options = {},
                        Env* env = Env::Default());
absl::Status ExportOnnx(const ModelSpec& spec, const std::vector<VariableInfo>& vars, const float* params,
                        const std::string& path, const ExportOptions& options = {}, Env* env = Env::Default());

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_EXPORT_H_
