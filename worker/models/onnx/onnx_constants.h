// Values an ONNX file fixes at import time: initializers, Constant nodes and the shape arithmetic exporters emit
// (Shape -> Gather -> Unsqueeze -> Concat -> Reshape), folded node by node. Internal to worker/models/onnx.
//
// The batch dimension stays free: Shape of a tensor gives its dims with element 0 marked as "the batch size",
// and the mark travels through Gather, Unsqueeze, Concat, Slice, Cast and the arithmetic that leaves it
// unchanged (x * 1, x + 0), so that Reshape can tell "keep the batch" from a literal.
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
  std::vector<bool> batch;                            // kInt: which elements stand for the batch size (or empty)
  std::string initializer;  // the initializer this value is, if any (a variable when an op takes it as a weight)
  int data_type = 0;        // the ONNX element type it was read from (TensorProto::DataType)

  int64_t size() const;
  bool is_batch(int64_t i) const { return i < static_cast<int64_t>(batch.size()) && batch[i]; }
  bool any_batch() const;
  // Element i as a double (either type).
  double at(int64_t i) const;
};
using ConstRef = std::shared_ptr<const Const>;

// "FLOAT", "INT64", ...
std::string DataTypeName(int data_type);

// Decodes a tensor held in the file (raw_data or the typed fields). FLOAT and DOUBLE become kFloat (DOUBLE
// narrowed), the integer types and BOOL kInt. InvalidArgument for other types, external data, a size that
// does not match the dims; `what` names the tensor in messages ("initializer 'fc1.weight'").
absl::StatusOr<ConstRef> DecodeTensor(const ::onnx::TensorProto& t, const std::string& what);

// Folds one node whose inputs are all known (`inputs[k]` null for an omitted optional input) into its outputs.
// `opset` is the model's ai.onnx opset. Shape is not handled here (it reads a tensor's dims: MakeShapeOf).
// InvalidArgument with the reason (the caller names the node) for an op or attribute this folder does not
// evaluate, or for arithmetic on the batch size.
absl::StatusOr<std::vector<ConstRef>> FoldNode(const ::onnx::NodeProto& node, const std::vector<const Const*>& inputs,
                                               int opset);

// Shape of a tensor whose per-example dims are `dims` (the batch first, marked), with Shape's start/end
// attributes (opset 15) applied.
absl::StatusOr<ConstRef> MakeShapeOf(const ::onnx::NodeProto& node, const std::vector<int64_t>& dims);

// Whether FoldNode evaluates this op type.
bool IsFoldable(const std::string& op_type);

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_CONSTANTS_H_
