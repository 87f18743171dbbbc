// The model as a graph: a DAG of ops over per-example tensors, with its variables (initializers) in one flat
// buffer. Every model is one: the built-in ones (mlp, cnn, convnet, cifar10, dlrm) are made by GraphBuilder
// from their layer lists, imported ONNX files by worker/models/onnx. worker/models/graph_network.h runs a Graph
// on a Device for a fixed batch size.
//
// Tensors. A tensor's shape is per example (the batch dimension is implicit and free), in ONNX's logical order;
// its *full* axes are those dims with the batch inserted at TensorShape::batch_axis (0 for most tensors; the
// transposes of attention move it), or the dims alone for a tensor without a batch axis (computed from
// variables only, e.g. a relative-position bias; it broadcasts over the batch where it meets a batched one).
// Storage follows the device convention (kernels/device.h): an *image* tensor, logical (C, H, W) with the batch
// first, is stored (H, W, C) per example, i.e. NHWC; every other tensor is stored row-major in its full logical
// order. Attributes that name axes (Transpose's perm, Concat's, Softmax's, Reduce's axes...) count full axes.
// Tensor 0 is the graph's input (images or dense features); a graph with sparse features also has an id input
// (see kEmbedding).
//
// Variables. Graph::variables lists every variable in flat-buffer order, which is the order of first use by
// the nodes (so a node's variables are contiguous and key order on the ps is forward order). A variable is
// trainable (updated by the optimizer from its gradient) or state (BatchNormalization's running mean and
// variance: its "gradient" is the change the ps subtracts, see kernels::Device::BatchNormRunningDelta).
//
// Usage (a two-layer MLP on 28x28x1 images):
//   GraphBuilder b("mlp", TensorShape{{1, 28, 28}});
//   Node flat = Node::Reshape("flatten", {784}, FlattenOrder::kChannelsLast);
//   ASSIGN_OR_RETURN(int x, b.Add(flat, {b.input()}));
//   Node fc = Node::Dense("fc1", 500);
//   ASSIGN_OR_RETURN(x, b.Add(fc, {x}, {VarSpec("fc1/weights", {784, 500}, w), VarSpec("fc1/biases", {500}, c)}));
//   ...
//   ASSIGN_OR_RETURN(Graph g, b.Finish(logits, Loss::kSoftmaxCrossEntropy));
//
// Thread-safety: Graph is a value; GraphBuilder is used by one thread.
#ifndef DTRAIN_WORKER_MODELS_GRAPH_H_
#define DTRAIN_WORKER_MODELS_GRAPH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/models/layers.h"
#include "worker/models/model.h"

namespace dtrain::models {

struct TensorShape {
  static constexpr int kNoBatch = -1;
  std::vector<int64_t> dims;  // per example, logical order; images are (C, H, W)
  // Where the batch sits among the full axes, in [0, dims.size()]; kNoBatch: the tensor has no batch axis.
  int batch_axis = 0;
  // A rank-3 tensor with the batch first is an image (stored NHWC) unless plain: stored row-major like the rest.
  bool plain = false;

  bool batched() const { return batch_axis != kNoBatch; }
  bool is_image() const { return dims.size() == 3 && batch_axis == 0 && !plain; }
  int full_rank() const { return static_cast<int>(dims.size()) + (batched() ? 1 : 0); }
  // The full dims with `batch` at the batch axis (the dims alone without one).
  std::vector<int64_t> FullDims(int64_t batch) const;
  // Full dims with kBatchDim standing for the batch (for shape checks that hold at any batch size).
  static constexpr int64_t kBatchDim = -1;
  std::vector<int64_t> SymbolicDims() const { return FullDims(kBatchDim); }
  // The storage stride of each full axis (images: NHWC) for `batch` examples.
  std::vector<int64_t> Strides(int64_t batch) const;
  int64_t size() const;  // per example (the whole tensor without a batch axis)
  // Floats stored for `batch` examples.
  int64_t Floats(int64_t batch) const { return batched() ? batch * size() : size(); }
  std::string ToString() const;  // "1x28x28"; "" for a scalar; "Nx50x768"-style when the batch is not first
  bool operator==(const TensorShape& o) const {
    return dims == o.dims && batch_axis == o.batch_axis && is_image() == o.is_image();
  }
};

// Dims for messages: "1x28x28", or "a scalar" for none.
std::string ShapeText(const std::vector<int64_t>& dims);

enum class Op {
  kConv,           // inputs {x: image}; vars {w, b?}; attrs conv
  kMaxPool,        // inputs {x: image}; attrs pool
  kAvgPool,        // inputs {x: image}; attrs pool (GlobalAveragePool: the whole image as the window)
  kDense,          // inputs {x: rank 1 (features)}; vars {w, b?}; attrs dense (Gemm, MatMul [+ Add])
  kBinary,         // inputs {a, b} or {a} with vars {b}: numpy broadcasting; attrs binary (Add/Sub/Mul/Div)
  kRelu,           // inputs {x}
  kActivation,     // inputs {x}; attrs activation (LeakyRelu, Clip, Sigmoid, Tanh)
  kBatchNorm,      // inputs {x: image or rank 1}; vars {scale, bias, running_mean (state), running_var (state)}
  kDropout,        // inputs {x}; attrs keep_prob (inverted dropout in training, identity in evaluation)
  kLrn,            // inputs {x: image}; attrs lrn (TensorFlow's depth_radius / alpha convention)
  kReshape,        // inputs {x}; attrs shape, flatten_order (Flatten, Reshape: a view or a transposed copy)
  kConcat,         // inputs {x0, x1, ...}; attrs axis (logical, per example: 0 = channels of an image)
  kIdentity,       // inputs {x}
  kEmbedding,      // inputs {}: reads the batch's ids of one sparse feature; attrs embedding (table, feature, bag)
  kInteraction,    // inputs {x: (F, d)}; DLRM's pairwise dot products -> (F (F - 1) / 2)
  // Tensor ops of imported graphs (any layout unless noted; axes are full axes):
  kTranspose,      // inputs {x}; attrs perm: y's full axis k is x's perm[k] (the batch may move)
  kMatMul,         // inputs {a, b}: products of the matrices in their last two full axes (each transposed when
                   // trans_a / trans_b); the leading axes equal
  kSoftmax,        // inputs {x: not an image}; attrs axis, log_softmax
  kLayerNorm,      // inputs {x: not an image}; vars {scale, bias?} of the normalized dims; attrs axis (the first
                   // normalized full axis; all after it are normalized), epsilon
  kReduce,         // inputs {x}; attrs axes, reduce: the reduced axes become 1 (ONNX's keepdims; a Reshape drops them)
  kSlice,          // inputs {x}; attrs starts, steps, shape: y[i] = x[start + i * step] along each full axis (the
                   // batch's start 0, step 1), y's per-example dims `shape`
  kGather,         // inputs {x}; attrs axis (not the batch's), indices: y's axis holds x's rows indices[j]
  kExpand,         // inputs {x}; attrs shape, batch_axis (y's): x broadcast to y (numpy, full axes right-aligned)
  kVariable,       // inputs {}; vars {v}: v as a tensor without a batch axis (a class token, a bias table)
};
const char* OpName(Op op);

// How a Reshape from an image to features orders the elements: ONNX's (C, H, W) (a transposed copy of the NHWC
// storage), or TensorFlow's (H, W, C) (the storage as is: the built-in models' flatten).
enum class FlattenOrder { kChannelsFirst, kChannelsLast };

enum class Loss {
  kSoftmaxCrossEntropy,  // logits (num_classes) against class indices; metric: accuracy
  kSigmoidCrossEntropy,  // one logit against a 0/1 label; metrics: log loss, AUC
  kNone,                 // no loss head: a forward-only graph of any output shape (GraphNetwork; e.g. the
                         // ONNX operator tests); a Model refuses it
};

struct Node {
  Op op = Op::kIdentity;
  std::string name;         // the ONNX node's name (or its op and index) / the built-in layer's, for messages
  std::vector<int> inputs;  // tensor ids
  int output = -1;          // tensor id (set by GraphBuilder::Add)
  std::vector<int> variables;  // variable ids, in the op's order (set by GraphBuilder::Add)

  // Attributes; only those of the node's op are meaningful. Batch and input sizes in conv / pool / dense / lrn
  // are filled in from the tensors when the node is added (and the batch by the executor).
  kernels::Conv2DParams conv;          // k_h, k_w, out_c, strides, padding, dilations, groups, layout, has_bias
  kernels::PoolParams pool;            // windows, strides, padding, ceil_mode, count_include_pad
  kernels::DenseParams dense;          // out, weights_transposed, has_bias, alpha, beta
  kernels::LrnParams lrn;              // depth_radius, bias, alpha, beta
  kernels::ActivationParams activation;
  kernels::BinaryOp binary = kernels::BinaryOp::kAdd;
  float keep_prob = 1.0f;              // kDropout
  float epsilon = 1e-5f;               // kBatchNorm, kLayerNorm
  float momentum = 0.1f;               // kBatchNorm: weight of the batch statistics (PyTorch's convention)
  bool unbiased_running_var = true;    // kBatchNorm: PyTorch updates running_var with the unbiased variance
  std::vector<int64_t> shape;          // kReshape, kExpand, kSlice: the output shape per example
  int batch_axis = 0;                  // kReshape, kExpand: the output's (TensorShape::batch_axis)
  bool plain = false;                  // kReshape: a rank-3 output is plain, not an image (TensorShape::plain)
  FlattenOrder flatten_order = FlattenOrder::kChannelsFirst;  // kReshape between an image and features
  int axis = 0;                        // kConcat, kSoftmax, kLayerNorm, kGather (a full axis)
  std::vector<int> perm;               // kTranspose
  bool log_softmax = false;            // kSoftmax
  bool trans_a = false, trans_b = false;  // kMatMul: a's (b's) last two axes are [k, m] ([n, k])
  kernels::ReduceKind reduce = kernels::ReduceKind::kSum;  // kReduce
  std::vector<int> axes;               // kReduce
  std::vector<int64_t> starts, steps;  // kSlice, per full axis
  std::vector<int64_t> indices;        // kGather
  struct Embedding {
    int table = 0;       // Graph::tables index
    int feature = 0;     // which sparse feature of the batch (HostBatch::ids)
    bool bag = false;    // any number of ids per example, combined (EmbeddingBag); false: exactly one id
    bool mean = false;   // bag: average instead of sum
  } embedding;

  // Convenience constructors for the common ops (attributes not listed keep their defaults).
  static Node Conv(std::string name, int k_h, int k_w, int out_c, kernels::Padding padding, int stride = 1);
  static Node MaxPool(std::string name, int window, int stride, kernels::Padding padding);
  static Node Dense(std::string name, int out);
  static Node Relu(std::string name);
  static Node Dropout(std::string name, float keep_prob);
  static Node Lrn(std::string name, int depth_radius, float bias, float alpha, float beta);
  static Node Reshape(std::string name, std::vector<int64_t> shape, FlattenOrder order);
};

// A sparse embedding table (kEmbedding nodes read it). Its rows live on the ps tasks, keyed by int64 id
// (ps/api/ps_types.h, SparseTableSpec), not in the flat buffer: a step binds the rows its batch's ids touch
// (Model::SetSparseInputs) and produces their gradients.
struct TableInfo {
  std::string name;
  int dim = 0;
  // > 0: a [rows, dim] table; an id is taken modulo rows (the hashing trick). 0: keyed by the id itself, rows
  // created on first touch.
  int64_t rows = 0;
  float init_scale = 0.01f;  // rows start uniform in [-init_scale, init_scale] (ps::SparseInitialRow)
  int64_t max_rows = 0;      // per ps task: evict the least recently touched beyond this (0: no bound)
  int admit_after = 0;       // create a row once its id was looked up this many times (0: at once)
  // Non-null: the table's initial rows (rows * dim floats, row i at [i * dim, (i + 1) * dim); an ONNX file's
  // embedding initializer), which the chief uploads to the ps tasks instead of init_scale's random rows
  // (ps::SparseTableSpec::initial_values). Only for a fixed-size table without max_rows or admission.
  std::shared_ptr<const std::vector<float>> initial_values;
  // The table's row for an id as the batch gives it.
  int64_t RowId(int64_t id) const { return rows > 0 ? ((id % rows) + rows) % rows : id; }
};

// A variable as a node declares it.
struct VarSpec {
  std::string name;
  std::vector<int64_t> shape;
  Initializer init;
  float weight_decay = 0.0f;
  // false: not trained. BatchNorm's running statistics (state: their gradient slot holds the change the ps
  // applies), or a constant operand of another op (e.g. an ONNX Constant node's value read by Mul): its gradient
  // slot stays zero, so the ps never changes it.
  bool trainable = true;
  VarSpec(std::string n, std::vector<int64_t> s, Initializer i, float wd = 0.0f, bool t = true)
      : name(std::move(n)), shape(std::move(s)), init(std::move(i)), weight_decay(wd), trainable(t) {}
};

struct Graph {
  std::string name;                     // the model's name ("cnn", or the ONNX graph's / file's)
  std::vector<TensorShape> tensors;     // [0] = the input
  std::vector<std::string> tensor_names;  // ONNX value names (or generated), for messages
  std::vector<Node> nodes;              // topological order
  int output = -1;                      // the logits
  Loss loss = Loss::kSoftmaxCrossEntropy;
  std::vector<VariableInfo> variables;  // flat-buffer order (first use by the nodes)
  // Sparse features (kEmbedding nodes): features per example in the batch's ids (0 without sparse inputs), and
  // the tables they are looked up in.
  int num_sparse_features = 0;
  std::vector<TableInfo> tables;

  const TensorShape& input_shape() const { return tensors[0]; }
  const TensorShape& output_shape() const { return tensors[output]; }
  // Variables' flat offsets (Offsets(variables)).
  std::vector<int64_t> variable_offsets() const;
  // For each sparse feature, the table its embedding nodes look it up in (one per feature: GraphBuilder checks),
  // or -1 when no node reads it.
  std::vector<int> table_of_feature() const;
};

// Builds a Graph node by node, inferring and checking shapes as it goes. Errors are InvalidArgument naming the
// model, the node (name and op) and what does not fit, e.g.
//   "resnet20: node 'Conv_12' (Conv): input has 16 channels, the weight 'layer2.0.conv1.weight' expects 32".
class GraphBuilder {
 public:
  GraphBuilder(std::string model_name, TensorShape input, std::string input_name = "input");

  int input() const { return 0; }
  const TensorShape& shape(int tensor) const { return graph_.tensors[tensor]; }
  const Graph& graph() const { return graph_; }

  // Adds `node` reading `inputs` (tensor ids) and declaring `new_variables` (appended to the flat buffer in
  // this order; their ids go to node.variables after `existing_variables`, ids of variables already declared,
  // which is allowed only for ops that read them without training them — today none: sharing is refused).
  // Fills the node's size attributes from the input shapes, checks every shape, and returns the output tensor.
  absl::StatusOr<int> Add(Node node, std::vector<int> inputs, std::vector<VarSpec> new_variables = {},
                          std::string output_name = "");
  // Declares that the batch has `n` sparse features (kEmbedding nodes read feature < n).
  void SetSparseFeatures(int n) { graph_.num_sparse_features = n; }
  // Declares a sparse table; returns its index (Node::embedding.table). InvalidArgument for a bad spec or a
  // repeated name.
  absl::StatusOr<int> AddTable(TableInfo table);

  // The finished graph with `logits` as its output. kSoftmaxCrossEntropy needs logits of rank 1 (the classes);
  // kSigmoidCrossEntropy one logit (shape (1)); kNone takes any tensor.
  absl::StatusOr<Graph> Finish(int logits, Loss loss);

 private:
  absl::Status Error(const Node& node, const std::string& what) const;
  // The output shape of a tensor op (kTranspose ... kVariable; graph_tensor_ops.cc), checking its inputs and
  // attributes; `vars` are the variables it declares.
  absl::Status InferTensorOp(Node& node, const std::vector<VariableInfo>& vars, TensorShape* out) const;
  Graph graph_;
};

// The graph of a built-in layer list (worker/models/layers.h) for an input geometry: the variables, their names,
// shapes and initializers are those VariablesOf gives (so checkpoints and signatures are unchanged), Dense layers
// read their input flattened in TensorFlow's (H, W, C) order.
absl::StatusOr<Graph> GraphFromLayers(const std::string& model, const std::vector<LayerSpec>& layers,
                                      Geometry input, int num_classes);

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_GRAPH_H_
