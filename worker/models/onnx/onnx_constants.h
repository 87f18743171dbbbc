// Values an ONNX file fixes at import time: initializers, Constant nodes and the shape arithmetic exporters emit
// (Shape -> Gather -> Unsqueeze -> Concat -> Reshape), folded node by node. Internal to worker/models/onnx.
//
// The batch dimension stays free: Shape of a tensor gives its dims with the batch's element marked as "the
// batch size" (or "k times the batch size" for an axis that merges the batch with k rows, as attention's
// [L, N * heads, d] does), and the mark travels through Gather, Unsqueeze, Concat, Slice, Cast, Where, the
// arithmetic that scales it (x * k, x / k when k divides the factor) or leaves it unchanged (x + 0), so that
// Reshape can tell where the batch goes from a literal. The marked element's value is the factor times the
// export's batch size (1 when the batch axis is dynamic).
//
// Thread-safety: plain values and functions.
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_CONSTANTS_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_CONSTANTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "onnx/onnx_pb.h"

namespace dtrain::models::onnx {

struct Const {
  enum class Type { kFloat, kInt };
  Type type = Type::kFloat;
  std::vector<int64_t> dims;                          // ONNX's shape (empty: a scalar)
  std::shared_ptr<const std::vector<float>> floats;   // kFloat: size() values, row-major
  std::vector<int64_t> ints;                          // kInt
  // kInt: per element, k > 0 when it stands for k times the batch size, 0 for a plain number (or empty).
  std::vector<int64_t> batch;
  std::string initializer;  // the initializer this value is, if any (a variable when an op takes it as a weight)
  // Float values computed from an initializer without changing it: the same floats in the same order under
  // other dims (Reshape, Unsqueeze, Squeeze, Flatten, Identity), or its 2-D transpose (a Linear's weight as
  // MatMul reads it). An op taking such a value as a weight takes the initializer's variable.
  std::string view_of, transpose_of;
  int data_type = 0;        // the ONNX element type it was read from (TensorProto::DataType)

  int64_t size() const;
  int64_t batch_factor(int64_t i) const { return i < static_cast<int64_t>(batch.size()) ? batch[i] : 0; }
  bool is_batch(int64_t i) const { return batch_factor(i) == 1; }
  bool any_batch() const;
  // The initializer this value is or views (empty for none).
  const std::string& param() const { return initializer.empty() ? view_of : initializer; }
  // Element i as a double (either type).
  double at(int64_t i) const;
};
using ConstRef = std::shared_ptr<const Const>;

// "FLOAT", "INT64", ...
std::string DataTypeName(int data_type);

// Decodes a tensor held in the file (raw_data or the typed fields). FLOAT and DOUBLE become kFloat (DOUBLE
// narrowed), the integer types and BOOL kInt. InvalidArgument for other types, external data (the importer reads
// it in first: onnx_external_data.h), a size that does not match the dims; `what` names the tensor in messages
// ("initializer 'fc1.weight'").
absl::StatusOr<ConstRef> DecodeTensor(const ::onnx::TensorProto& t, const std::string& what);

// Folds one node whose inputs are all known (`inputs[k]` null for an omitted optional input) into its outputs.
// `opset` is the model's ai.onnx opset. Shape is not handled here (it reads a tensor's dims: MakeShapeOf).
// InvalidArgument with the reason (the caller names the node) for an op or attribute this folder does not
// evaluate, or for arithmetic on the batch size.
absl::StatusOr<std::vector<ConstRef>> FoldNode(const ::onnx::NodeProto& node, const std::vector<const Const*>& inputs,
                                               int opset);

// Shape of a tensor of `dims`, element k standing for batch_factors[k] times the batch size when nonzero (its
// value then that times the export's batch size), with Shape's start/end attributes (opset 15) applied.
absl::StatusOr<ConstRef> MakeShapeOf(const ::onnx::NodeProto& node, const std::vector<int64_t>& dims,
                                     const std::vector<int64_t>& batch_factors);

// Whether FoldNode evaluates this op type.
bool IsFoldable(const std::string& op_type);

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_CONSTANTS_H_
