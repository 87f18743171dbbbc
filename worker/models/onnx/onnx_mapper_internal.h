// The mapper's state while it walks an ONNX graph (onnx_mapper.h): what each ONNX value name stands for and
// the per-op mappings. Split over onnx_mapper.cc (images and dense layers, constants, the softmax head) and
// onnx_mapper_sparse.cc (the int64 ids input, embedding lookups and their reductions, the one-logit head).
// Internal to worker/models/onnx.
//
// Thread-safety: a Mapper maps one graph on one thread.
#ifndef DTRAIN_WORKER_MODELS_ONNX_ONNX_MAPPER_INTERNAL_H_
#define DTRAIN_WORKER_MODELS_ONNX_ONNX_MAPPER_INTERNAL_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "worker/models/graph.h"
#include "worker/models/onnx/onnx_file.h"
#include "worker/models/onnx/onnx_import.h"
#include "worker/models/onnx/onnx_mapper.h"

namespace dtrain::models::onnx {

// What an ONNX value name stands for while the graph is mapped.
struct Value {
  int tensor = -1;    // a tensor of the graph (per example)
  ConstRef constant;  // or a value known at import
  // A Pad waiting for the Conv or AveragePool that reads it (tensor: its input): the spatial pads.
  bool padded = false;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  std::string unavailable;  // non-empty: a value dtrain does not compute, and why
  // The output of a stripped head: the logits tensor. softmax_head: Softmax / LogSoftmax /
  // SoftmaxCrossEntropyLoss; else a Sigmoid over one logit, or a Squeeze of one logit (before such a Sigmoid).
  int head_of = -1;
  bool softmax_head = false;

  // The int64 ids input, or columns picked from it: the batch's sparse features they are (columns of the input,
  // HostBatch::ids) and their rank per example (0: one column, [N]; 1: [N, columns.size()]).
  bool ids = false;
  std::vector<int> columns;
  int ids_rank = 0;
  // An embedding lookup of [N, k] ids ([N, k, dim]): one kEmbedding tensor (dim) per column. `tensor` is the
  // stack (k, dim), made (Concat + a view Reshape) only when something reads the value whole; ReduceSum and
  // ReduceMean over the columns read the parts.
  std::vector<int> parts;
  std::string lookup_node;  // the Gather's name, for the stack's nodes
};

class Mapper {
 public:
  Mapper(const OnnxFile& f, const ImportOptions& o) : f_(f), o_(o), g_(f.model->graph()) {}
  absl::StatusOr<Graph> Run(const DataGeometry* data);

 private:
  const ::onnx::NodeProto& node(int i) const { return g_.node(i); }
  absl::Status Refuse(int i, absl::string_view what) const { return NodeRefusal(f_, i, what); }
  absl::Status SetInput(const DataGeometry* data);
  absl::Status SetIdsInput(const DataGeometry* data);
  absl::Status MapNode(int i);

  // Input k of node i: its value (an error names a value nothing computes); as a tensor of the graph (an
  // embedding lookup's stack is made here); as a constant (null when omitted); as a variable (an initializer:
  // trainable unless `state`; a Constant's value: a constant variable).
  absl::StatusOr<const Value*> Get(int i, int k) const;
  absl::StatusOr<int> Tensor(int i, int k);
  absl::StatusOr<const Const*> ConstIn(int i, int k) const;
  absl::StatusOr<VarSpec> Param(int i, int k, const char* role, bool state = false);
  // Adds `n` to the graph as node i's output `out` (default: its first output name).
  absl::Status Emit(int i, Node n, std::vector<int> inputs, std::vector<VarSpec> vars, std::string out = "");
  // Marks node i's outputs from `first` on as values dtrain does not compute.
  void Unavailable(int i, int first, const std::string& why);
  Node Make(int i, Op op) const;
  // Whether value `name` is the graph's output, read by no node.
  bool IsFinalOutput(const std::string& name) const;
  // Input 0 of node i read as an image by a Conv or pool: its tensor, and the pads of a Pad merged into it (all
  // zero and padded false without one). The node's refusal when the input is no tensor.
  struct ImageInput {
    int tensor = -1;
    bool padded = false;
    int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
  };
  absl::StatusOr<ImageInput> ImageInputOf(int i);
  // The index of the one node that reads `value`, or -1 when none or several do.
  int SoleReader(const std::string& value) const;
  // Whether `value` is one of the graph's outputs.
  bool IsGraphOutput(const std::string& value) const;

  absl::Status Fold(int i);
  absl::Status MapConv(int i);
  absl::Status MapPool(int i);
  absl::Status MapGlobalPool(int i);
  absl::Status MapGemm(int i);
  absl::Status MapMatMul(int i);
  absl::Status MapBinary(int i);
  absl::Status MapActivation(int i);
  absl::Status MapBatchNorm(int i);
  absl::Status MapDropout(int i);
  absl::Status MapLrn(int i);
  absl::Status MapFlatten(int i);
  absl::Status MapReshape(int i);
  absl::Status MapConcat(int i);
  absl::Status MapPad(int i);
  absl::Status MapHead(int i);
  // The spatial pads of node i (pads / auto_pad attributes) for an input of in_h x in_w (Pad's included).
  absl::Status SpatialPads(int i, int64_t in_h, int64_t in_w, const std::vector<int64_t>& kernel,
                           const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations, int64_t* top,
                           int64_t* left, int64_t* bottom, int64_t* right);
  // The 2-element attribute `name` (default `fallback` for both), refused otherwise.
  absl::StatusOr<std::vector<int64_t>> Pair(int i, const char* name, int64_t fallback) const;

  // onnx_mapper_sparse.cc.
  absl::Status MapGather(int i);
  absl::Status MapEmbedding(int i, const Value& ids);
  absl::Status MapSliceOfIds(int i, const Value& ids);
  absl::Status MapSqueeze(int i);
  absl::Status MapCastOfIds(int i, const Value& ids);
  absl::Status MapReduce(int i);
  // A Sigmoid over one logit as the graph's output: the head (true), stripped; false: an ordinary Sigmoid.
  absl::StatusOr<bool> MapSigmoidHead(int i);
  // Refusals of what reads the ids input (Tensor) and of a Gather of a float initializer at constant indices.
  absl::Status RefuseComputedIds(int i, int k) const;
  absl::Status CheckConstantGather(int i) const;
  // The table an embedding initializer is (declared at its first lookup).
  absl::StatusOr<int> TableOf(int i, const Const& c);
  // Makes the stack (k, dim) of an embedding lookup value.
  absl::StatusOr<int> Stack(const std::string& name, Value* v);

  const OnnxFile& f_;
  ImportOptions o_;
  const ::onnx::GraphProto& g_;
  std::unique_ptr<GraphBuilder> b_;
  std::unordered_map<std::string, Value> values_;
  std::set<int> fused_;             // nodes mapped together with an earlier one (the Add of MatMul + Add)
  std::set<std::string> var_names_;  // variables declared so far
  bool check_inferred_ = true;       // compare shapes with ONNX's inference (see Emit)
  std::map<std::string, int> tables_;   // embedding initializer -> Graph::tables index
  std::map<int, int> table_of_feature_;  // sparse feature -> the table its lookups read
};

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_MAPPER_INTERNAL_H_
