// Maps an ONNX file's nodes onto GraphBuilder (worker/models/graph.h), node by node in the file's order:
// constants and shape arithmetic are folded, Pad is merged into the Conv or AveragePool that reads it, MatMul +
// Add of a bias into one Dense, a Softmax / LogSoftmax / SoftmaxCrossEntropyLoss head is stripped to the logits.
// Internal to worker/models/onnx; what it supports and refuses is listed in docs/models.md.
//
// Variables: an initializer an op takes as a weight is a trainable variable under its ONNX name, in ONNX's layout
// (Conv OIHW, Gemm [out, in] with transB = 1), starting from the file's values; BatchNormalization's running mean
// and variance are state variables; a Constant node's value an op takes as an operand (x * 0.5) is a constant
// variable (not trainable; named after the Constant's output).
//
// Thread-safety: plain functions.
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_MAPPER_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_MAPPER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/models/graph.h"
#include "worker/models/onnx/onnx_file.h"
#include "worker/models/onnx/onnx_import.h"

namespace dtrain::models::onnx {

// The images the data set gives, logical (C, H, W); for click-through-rate data (num_sparse > 0) the dense
// features as C x 1 x 1 and the categorical features per example.
struct DataGeometry {
  int64_t channels = 0, height = 0, width = 0;
  int64_t num_sparse = 0;
};

// The graph of `f` for `data` (null: the file's own input shape, which must then be fully known). With images,
// the file's input must be (C, H, W) with those sizes, or a flat [N, C*H*W] input (a Reshape in channels-first
// order is put in front); with click-through-rate data its float input (if any) must be [N, C] (the dense
// features) and its int64 ids input [N] or [N, num_sparse]. Refusals as NodeRefusal / FileRefusal (onnx_file.h);
// a geometry that does not fit names both shapes.
//
// Embedding lookups: Gather(table, ids) of a float initializer table [rows, dim] by the ids input (or columns
// of it: Gather(ids, k, axis=1), Slice, Squeeze, Unsqueeze) becomes a fixed-size table (TableInfo, named after
// the initializer, starting from its values) and one kEmbedding node per column (an [N, k] lookup: k nodes on
// the table, stacked (k, dim) when read whole); ReduceSum / ReduceMean over the columns become Adds (and a
// Mul by 1/k). A Sigmoid over one logit at the graph's output is the head (stripped, as a Squeeze of that
// logit); one logit trains with sigmoid cross-entropy.
absl::StatusOr<Graph> MapGraph(const OnnxFile& f, const ImportOptions& options, const DataGeometry* data);

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_MAPPER_H_
