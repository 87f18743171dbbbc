// GraphNetwork: one Graph (worker/models/graph.h) instantiated for a fixed batch size on a Device: every op made
// once, every activation and gradient buffer allocated once, parameters and gradients viewed in the flat
// buffers. Nothing is allocated per step.
//
// Memory: activations are kept for the backward pass; a ReLU runs in place when nothing else reads its input
// (and the input's producer does not need its own output to go backward), a Reshape that does not move data is
// a view. Gradient buffers are planned once by liveness (a tensor's gradient lives from the backward of its
// last consumer to that of its producer) and reused; a tensor read by several nodes (a residual connection)
// gets its gradient accumulated.
//
// Thread-safety: one thread at a time (like its Device).
//
// Example:
//   ASSIGN_OR_RETURN(Graph g, GraphFromLayers("mlp", layers, {28, 28, 1}, 10));
//   ASSIGN_OR_RETURN(auto net, GraphNetwork::Create(dev, g, /*batch=*/100, /*with_backward=*/true, params, grads));
//   // copy a batch to net->input()
//   RETURN_IF_ERROR(net->Forward(/*training=*/true, seed, step));   // logits in net->output()
//   RETURN_IF_ERROR(net->Backward(dlogits));                          // every variable's gradient, overwritten
#ifndef DTRAIN_WORKER_MODELS_GRAPH_NETWORK_H_
#define DTRAIN_WORKER_MODELS_GRAPH_NETWORK_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/models/graph.h"

namespace dtrain::models {

class GraphNetwork {
 public:
  // `params` and `grads` are flat device buffers laid out as graph.variables; `grads` may be null when
  // !with_backward. Both must outlive the network, as must `device` (the graph is copied). InvalidArgument for
  // a bad batch size; Unimplemented when the device lacks an op the graph needs (naming it and the node).
  static absl::StatusOr<std::unique_ptr<GraphNetwork>> Create(kernels::Device* device, const Graph& graph,
                                                              int batch, bool with_backward, const float* params,
                                                              float* grads);
  ~GraphNetwork();
  GraphNetwork(const GraphNetwork&) = delete;
  GraphNetwork& operator=(const GraphNetwork&) = delete;

  const Graph& graph() const { return graph_; }
  int batch() const { return batch_; }
  float* input() { return input_; }                 // batch * input size floats (images NHWC)
  const float* output() const { return output_; }   // batch * output size floats (logits) after Forward
  int64_t output_size_per_example() const { return graph_.output_shape().size(); }

  int num_nodes() const { return static_cast<int>(graph_.nodes.size()); }

  // Sparse models (Graph::tables): what the embedding nodes read this step, in device memory. Set before each
  // Forward (the binding must stay valid through the Backward that follows).
  struct SparseBinding {
    std::vector<const float*> rows;       // per table: [num_rows, dim] rows the batch's ids refer to
    std::vector<int64_t> num_rows;        // per table
    std::vector<float*> row_grads;        // per table: [num_rows, dim], added to by Backward (zero them first)
    std::vector<const int32_t*> indices;  // per sparse feature: row indices into its table's rows
    std::vector<int64_t> counts;          // per sparse feature: how many (batch, or the bags' total)
    std::vector<const int32_t*> offsets;  // per sparse feature of a bag node: batch + 1 offsets (else null)
  };
  void BindSparse(const SparseBinding* binding) { sparse_ = binding; }
  // Where node i's variables lie in the flat buffer: [begin, end), empty for a node without variables.
  std::pair<int64_t, int64_t> variable_range(int node) const;

  // Called with a node's index; an error ends the pass with that error.
  using NodeHook = std::function<absl::Status(int node)>;
  // Runs every node on input(). Training: dropout on (mask keyed by seed, step and the dropout's index),
  // BatchNorm with the batch's statistics, writing the change of its running statistics into their gradient
  // slots (Device::BatchNormRunningDelta); otherwise BatchNorm uses the running statistics. `before_node` (may be
  // null) runs before each node that has variables.
  absl::Status Forward(bool training, uint64_t seed, int64_t step, const NodeHook* before_node = nullptr);
  // Forward with dropout's counter read from device memory when each dropout node runs:
  //   counter = *step * counter_stride + counter_offset   (kernels::Device::DropoutDeviceCounter)
  absl::Status ForwardDeviceCounter(bool training, uint64_t seed, const kernels::DeviceCounter& step,
                                    uint64_t counter_stride, uint64_t counter_offset,
                                    const NodeHook* before_node = nullptr);
  // Backpropagates `doutput` (batch * output floats, may be overwritten) through the last training Forward,
  // overwriting every trainable variable's slice of the gradient buffer (BatchNorm's state
  // variables keep what Forward wrote; other variables that are not trainable, constants, stay zero).
  // Needs with_backward. `grads_ready` (may be null) runs as soon as a node's variable gradients are written,
  // before its input gradients are computed, last node first.
  absl::Status Backward(float* doutput, const NodeHook* grads_ready = nullptr);

 private:
  struct Step;
  GraphNetwork(kernels::Device* device, Graph graph, int batch);
  absl::StatusOr<float*> Alloc(int64_t n);
  absl::Status Build(bool with_backward, const float* params, float* grads);
  absl::Status PlanBackward();
  absl::Status ForwardImpl(bool training, uint64_t seed, int64_t step, const kernels::DeviceCounter* device_step,
                           uint64_t counter_stride, uint64_t counter_offset, const NodeHook* before_node);
  absl::Status ForwardNode(Step& s, bool training, uint64_t seed, int64_t step,
                           const kernels::DeviceCounter* device_step, uint64_t counter_stride,
                           uint64_t counter_offset);
  absl::Status BackwardNode(Step& s, const NodeHook* grads_ready);
  // graph_network_tensor_ops.cc: the tensor ops of imported graphs (kTranspose ... kVariable).
  absl::Status BuildTensorOp(Step& s);
  absl::Status ForwardTensorOp(Step& s);
  absl::Status BackwardTensorOp(Step& s, float* dy);
  // Where input k's gradient goes when a kernel computes it (its buffer, or the scratch when it must be added to
  // what other consumers left there), and the addition afterwards.
  float* GradTarget(const Step& s, size_t k) const;
  absl::Status FinishGrad(const Step& s, size_t k);
  // The Gather of an embedding node for the bound sparse inputs.
  absl::Status EmbeddingParams(const Node& n, kernels::GatherParams* p) const;
  // Writes or adds (accumulate) `n` floats of src into dst.
  absl::Status Deliver(const float* src, float* dst, int64_t n, bool accumulate);

  kernels::Device* device_;
  Graph graph_;
  int batch_;
  bool with_backward_ = false;
  std::vector<Step> steps_;           // one per node
  std::vector<float*> act_;           // per tensor: its activations (batch * size floats)
  std::vector<int64_t> act_n_;        // per tensor: floats for the batch
  std::vector<bool> requires_grad_;   // per tensor: some trainable variable lies upstream
  std::vector<float*> owned_;         // device buffers to free
  float* input_ = nullptr;
  float* output_ = nullptr;
  float* scratch_ = nullptr;          // accumulation scratch (largest accumulated gradient)
  float* external_dy_ = nullptr;      // Backward's doutput, while it runs
  const float* params_ = nullptr;
  float* grads_ = nullptr;
  std::vector<int64_t> var_offsets_;
  const SparseBinding* sparse_ = nullptr;
};

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_GRAPH_NETWORK_H_
