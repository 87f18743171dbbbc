// GraphNetwork's per-node state (graph_network.h): the ops made for a node, its variables' views and its backward
// plan. Internal to worker/models (graph_network.cc, graph_network_tensor_ops.cc).
//
// Thread-safety: owned by one GraphNetwork.
#ifndef DTRAIN_WORKER_MODELS_GRAPH_NETWORK_STEP_H_
#define DTRAIN_WORKER_MODELS_GRAPH_NETWORK_STEP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/models/graph.h"
#include "worker/models/graph_network.h"

namespace dtrain::models {

struct GraphNetwork::Step {
  const Node* node = nullptr;
  int index = 0;
  std::vector<const float*> w;  // the node's variables' values
  std::vector<float*> dw;       // their gradient slots (null without backward)
  int64_t var_begin = 0, var_end = 0;
  bool has_trainable = false;
  // Positions in w/dw of constant variables (not trainable, not BatchNorm state): their gradient stays zero.
  std::vector<size_t> constant_slots;
  uint64_t dropout_index = 0;
  float* mask = nullptr;                       // dropout
  float* bn_mean = nullptr, *bn_var = nullptr;  // batch statistics
  int64_t bn_count = 0;
  std::unique_ptr<kernels::Conv2D> conv;
  std::unique_ptr<kernels::Dense> dense;
  std::unique_ptr<kernels::MaxPool> maxpool;
  std::unique_ptr<kernels::AvgPool> avgpool;
  std::unique_ptr<kernels::Lrn> lrn;
  std::unique_ptr<kernels::BatchNorm> bn;
  std::unique_ptr<kernels::Binary> binary;
  bool b_is_variable = false;  // kBinary: the second operand is node.variables[0]
  // kReshape
  enum class Move { kView, kToChannelsFirst, kToChannelsLast } move = Move::kView;
  int64_t t_rows = 0, t_cols = 0;  // per example, the transpose's [rows, cols]
  // kConcat: per input its columns in a [rows, out_cols] view of the output
  int64_t concat_rows = 0, concat_out_cols = 0;
  std::vector<int64_t> concat_cols;
  // kInteraction
  kernels::InteractionParams interaction;
  // Tensor ops (graph_network_tensor_ops.cc).
  bool view = false;                    // kTranspose: y is x's storage as it is; kVariable: y is the variable
  kernels::StridedCopyParams copy;      // kTranspose, kSlice: y from x (the backward swaps the strides)
  int64_t src_offset = 0;               // kSlice, kGather by a progression: x's first element read
  std::unique_ptr<kernels::MatMul> matmul;
  std::unique_ptr<kernels::Softmax> softmax;
  std::unique_ptr<kernels::LayerNorm> layer_norm;
  float* ln_mean = nullptr, *ln_var = nullptr;  // kLayerNorm: per-row statistics
  std::unique_ptr<kernels::Reduce> reduce;
  // kGather of arbitrary rows: x viewed as [outer, rows, inner]; indices uploaded as int32.
  kernels::GatherParams gather;
  int64_t gather_outer = 0, gather_x_block = 0, gather_y_block = 0;
  const int32_t* gather_indices = nullptr;
  const float* zero = nullptr;          // kExpand: the 0 added to x (a Binary broadcasting x over y)

  // Backward plan.
  bool run_backward = false;     // a gradient reaches the output
  bool zero_var_grads = false;   // trainable variables on a dead branch: their gradients are zero
  float* dy = nullptr;           // gradient buffer of the output (null: doutput)
  struct InGrad {
    bool needed = false;
    float* dst = nullptr;
    bool accumulate = false;  // add to dst (it already holds other consumers' gradients)
    bool alias = false;       // dst is dy itself: nothing to compute (in place, or pass-through)
  };
  std::vector<InGrad> in_grad;
};


// The storage order of a tensor's full axes, outermost first (images: N, H, W, C).
std::vector<int> StorageOrder(const TensorShape& s);

// The addressing of y = a op b for a Binary (numpy broadcasting of the full axes, right-aligned; b without a
// batch axis when it is a variable), over y's storage order with contiguous dims merged. InvalidArgument when it
// needs more than kernels::kMaxBroadcastRank dims.
absl::StatusOr<kernels::BroadcastParams> BroadcastOver(const TensorShape& y, int64_t batch, const TensorShape& a,
                                                       const TensorShape& b, kernels::BinaryOp op);

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_GRAPH_NETWORK_STEP_H_
