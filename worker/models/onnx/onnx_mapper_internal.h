// The mapper's state while it walks an ONNX graph (onnx_mapper.h): what each ONNX value name stands for and
// the per-op mappings. Split over onnx_mapper.cc (the walk: data input, each node, constants folded, the softmax
// head), onnx_mapper_values.cc (a node's inputs as values, tensors, constants, variables; nodes made),
// onnx_mapper_image.cc (convolutions, pooling, normalization), onnx_mapper_dense.cc (dense layers, element-wise
// ops, reshapes), onnx_mapper_axes.cc, onnx_mapper_tensor.cc (transformers' tensor ops) and
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

// An ONNX dim as the mapper knows it: a number, or `factor` times the batch size.
struct Dim {
  int64_t size = 1;    // factor == 0
  int64_t factor = 0;  // > 0: factor x N
  bool batch() const { return factor > 0; }
};

// What an ONNX value name stands for while the graph is mapped.
struct Value {
  int tensor = -1;    // a tensor of the graph (per example)
  // How the tensor's full axes (graph.h) make up the ONNX value's axes: ONNX axis k is span[k] adjacent full
  // axes (empty: one each). Only an axis that merges the batch with k rows spans two ([L, N * heads, d] is the
  // full [L, N, heads, d]).
  std::vector<int> span;
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
  // Input k as a tensor; an initializer (or a view or transpose of one) becomes its variable's tensor (kVariable,
  // one per initializer), another constant a constant tensor.
  absl::StatusOr<int> Tensor(int i, int k);
  // Input k as an image (a plain (C, H, W) tensor converted, once per value), or stored in its logical order (an
  // image converted, once per value).
  absl::StatusOr<int> ImageTensor(int i, int k);
  absl::StatusOr<int> PlainTensor(int i, int k);
  absl::StatusOr<const Const*> ConstIn(int i, int k) const;
  absl::StatusOr<VarSpec> Param(int i, int k, const char* role, bool state = false);
  // Adds `n` to the graph as node i's output `out` (default: its first output name), its ONNX axes made of the
  // tensor's full axes as `span` says (empty: one each).
  absl::Status Emit(int i, Node n, std::vector<int> inputs, std::vector<VarSpec> vars, std::string out = "",
                    std::vector<int> span = {});
  // Names value `out` as tensor t (with `span`), without a node (an op that changes nothing).
  absl::Status Alias(int i, int t, std::vector<int> span = {}, std::string out = "");
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

  // onnx_mapper_axes.cc: a value's ONNX axes against its tensor's full axes.
  // The span of each ONNX axis (one each when the value has none).
  std::vector<int> SpanOf(const Value& v) const;
  // The ONNX dims of a tensor value (a batch axis merged with k rows: k x N).
  std::vector<Dim> OnnxDims(const Value& v) const;
  // The full axis ONNX axis `axis` (negative counts from the end) of input k of node i is, refused when it is
  // outside the rank, merged with the batch, or the batch's (unless batch_ok: then kBatchAxis).
  static constexpr int kBatchAxis = -2;
  absl::StatusOr<int> FullAxis(int i, int k, int64_t axis, const char* what, bool batch_ok = false) const;
  // Reshapes tensor value v (input k of node i) into ONNX dims `target` (0 and -1 resolved by the caller, at most
  // one of them holding the batch) as node i's output `out` (empty: its first).
  absl::Status ReshapeTo(int i, const Value& v, const std::vector<Dim>& target, const std::string& out = "");

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
  // Whether a Softmax / LogSoftmax is the model's head (the graph's output over the class logits).
  bool IsSoftmaxHead(int i) const;

  // onnx_mapper_tensor.cc: the tensor ops of transformers and today's convolutional nets.
  absl::Status MapTranspose(int i);
  absl::Status MapMatMulOfTensors(int i);
  absl::Status MapEinsum(int i);
  absl::Status MapSoftmax(int i);
  absl::Status MapLayerNorm(int i);
  absl::Status MapReduceOfTensor(int i);
  absl::Status MapGatherOfTensor(int i);
  absl::Status MapSlice(int i);
  absl::Status MapSplit(int i);
  absl::Status MapExpand(int i);
  absl::Status MapTile(int i);
  absl::Status MapSqueezeOfTensor(int i);
  // Fusions of the patterns exporters emit for one op (false: no match, map node i alone): LayerNorm from
  // ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div [, Mul, Add]; GELU from Div, Erf, Add, Mul, Mul; SiLU from
  // Sigmoid, Mul.
  absl::StatusOr<bool> TryLayerNormPattern(int i);
  absl::StatusOr<bool> TryGeluPattern(int i);
  absl::StatusOr<bool> TrySiluPattern(int i);
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
  // The refusal of what reads the ids input as a tensor.
  absl::Status RefuseComputedIds(int i, int k) const;
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
  std::map<std::string, int> variable_tensor_;  // initializer -> its kVariable tensor
  std::map<std::string, int> image_of_, plain_of_;  // value -> its tensor converted (ImageTensor, PlainTensor)
};

}  // namespace dtrain::models::onnx

#endif  // DTRAIN_WORKER_MODELS_ONNX_ONNX_MAPPER_INTERNAL_H_
