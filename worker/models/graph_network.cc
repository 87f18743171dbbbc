#include "worker/models/graph_network.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/models/graph_network_step.h"

namespace dtrain::models {

namespace {

// Ops whose backward reads their own output (a later in-place op must not overwrite it). Pools are listed
// because a backend may keep pointers to their forward output (cuDNN's pooling backward reads y).
// A variable's tensor is listed too: it is the parameters' own memory, which no op may overwrite.
bool BackwardReadsOutput(Op op) {
  return op == Op::kRelu || op == Op::kActivation || op == Op::kLrn || op == Op::kMaxPool || op == Op::kAvgPool ||
         op == Op::kSoftmax || op == Op::kVariable;
}

// Whether two tensors are stored alike (a gradient of one is a gradient of the other as it is).
bool SameStorage(const TensorShape& a, const TensorShape& b) {
  return a.dims == b.dims && a.batch_axis == b.batch_axis && a.is_image() == b.is_image();
}

}  // namespace

GraphNetwork::GraphNetwork(kernels::Device* device, Graph graph, int batch)
    : device_(device), graph_(std::move(graph)), batch_(batch) {}

GraphNetwork::~GraphNetwork() {
  steps_.clear();  // ops first
  for (float* p : owned_) device_->Free(p);
}

absl::StatusOr<float*> GraphNetwork::Alloc(int64_t n) {
  ASSIGN_OR_RETURN(float* p, device_->Alloc(std::max<int64_t>(n, 1)));
  owned_.push_back(p);
  return p;
}

std::pair<int64_t, int64_t> GraphNetwork::variable_range(int node) const {
  return {steps_[node].var_begin, steps_[node].var_end};
}

absl::StatusOr<std::unique_ptr<GraphNetwork>> GraphNetwork::Create(kernels::Device* device, const Graph& graph,
                                                                   int batch, bool with_backward,
                                                                   const float* params, float* grads) {
  if (device == nullptr) return absl::InvalidArgumentError(absl::StrCat(graph.name, ": no device"));
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch size must be positive, got ", batch));
  if (graph.nodes.empty() || graph.output < 1) {
    return absl::InvalidArgumentError(absl::StrCat(graph.name, ": an empty graph"));
  }
  if (with_backward && grads == nullptr) return absl::InvalidArgumentError("with_backward needs a gradient buffer");
  std::unique_ptr<GraphNetwork> net(new GraphNetwork(device, graph, batch));
  RETURN_IF_ERROR(net->Build(with_backward, params, grads));
  return net;
}

absl::Status GraphNetwork::Build(bool with_backward, const float* params, float* grads) {
  with_backward_ = with_backward;
  params_ = params;
  grads_ = grads;
  var_offsets_ = graph_.variable_offsets();
  const int num_tensors = static_cast<int>(graph_.tensors.size());
  const int num_nodes = static_cast<int>(graph_.nodes.size());
  act_n_.resize(num_tensors);
  for (int t = 0; t < num_tensors; ++t) act_n_[t] = graph_.tensors[t].Floats(batch_);
  auto node_error = [&](const Node& n, const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(graph_.name, ": node '", n.name, "' (", OpName(n.op), "): ",
                                               s.message()));
  };

  // ---- which tensors share storage: views (Reshape without a data move, Identity) and in-place ReLUs ----
  std::vector<int> producer(num_tensors, -1);
  std::vector<int> readers(num_tensors, 0);
  for (int i = 0; i < num_nodes; ++i) {
    producer[graph_.nodes[i].output] = i;
    for (int t : graph_.nodes[i].inputs) ++readers[t];
  }
  steps_.resize(num_nodes);
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = graph_.nodes[i];
    Step& s = steps_[i];
    s.node = &graph_.nodes[i];
    s.index = i;
    if (n.op == Op::kReshape) {
      const TensorShape& in = graph_.tensors[n.inputs[0]];
      const TensorShape& out = graph_.tensors[n.output];
      s.move = Step::Move::kView;
      if (in.is_image() && !out.is_image() && n.flatten_order == FlattenOrder::kChannelsFirst && in.dims[0] > 1 &&
          in.dims[1] * in.dims[2] > 1) {
        s.move = Step::Move::kToChannelsFirst;  // [H*W, C] -> [C, H*W]
        s.t_rows = in.dims[1] * in.dims[2];
        s.t_cols = in.dims[0];
      } else if (!in.is_image() && out.is_image() && n.flatten_order == FlattenOrder::kChannelsFirst &&
                 out.dims[0] > 1 && out.dims[1] * out.dims[2] > 1) {
        s.move = Step::Move::kToChannelsLast;  // [C, H*W] -> [H*W, C]
        s.t_rows = out.dims[0];
        s.t_cols = out.dims[1] * out.dims[2];
      }
    }
    if (n.op == Op::kTranspose) {
      // A view when y's storage strides are x's, permuted (an image <-> its NHWC order as a plain tensor).
      const std::vector<int64_t> xs = graph_.tensors[n.inputs[0]].Strides(batch_);
      const std::vector<int64_t> ys = graph_.tensors[n.output].Strides(batch_);
      const std::vector<int64_t> yd = graph_.tensors[n.output].FullDims(batch_);
      s.view = true;
      for (size_t k = 0; k < n.perm.size(); ++k) s.view = s.view && (yd[k] == 1 || xs[n.perm[k]] == ys[k]);
    }
  }
  auto is_view = [&](int i) {
    const Node& n = graph_.nodes[i];
    return n.op == Op::kIdentity || (n.op == Op::kReshape && steps_[i].move == Step::Move::kView) ||
           (n.op == Op::kTranspose && steps_[i].view);
  };
  // root[t]: the tensor whose buffer t lives in.
  std::vector<int> root(num_tensors);
  for (int t = 0; t < num_tensors; ++t) root[t] = t;
  std::vector<int> real_readers(num_tensors, 0);  // per root: reads by nodes that are not views
  std::vector<bool> root_writer_reads_output(num_tensors, false);
  for (int t = 0; t < num_tensors; ++t) {
    if (producer[t] >= 0) root_writer_reads_output[t] = BackwardReadsOutput(graph_.nodes[producer[t]].op);
  }
  for (int i = 0; i < num_nodes; ++i) {
    if (is_view(i)) root[graph_.nodes[i].output] = root[graph_.nodes[i].inputs[0]];
  }
  for (int i = 0; i < num_nodes; ++i) {
    if (is_view(i)) continue;
    for (int t : graph_.nodes[i].inputs) ++real_readers[root[t]];
  }
  // In-place ReLU: its input's buffer is read by nobody else, is not the graph's input, and the node that
  // wrote it does not read its own output going backward. The ReLU then owns the buffer (and reads it back).
  std::vector<bool> in_place(num_nodes, false);
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = graph_.nodes[i];
    if (n.op != Op::kRelu) continue;
    const int r = root[n.inputs[0]];
    if (r == 0 || real_readers[r] != 1 || root_writer_reads_output[r]) continue;
    in_place[i] = true;
    root[n.output] = r;
    root_writer_reads_output[r] = true;
  }
  // Views of a tensor produced later (an in-place ReLU changes its group's root): recompute in node order.
  for (int i = 0; i < num_nodes; ++i) {
    if (is_view(i) || in_place[i]) root[graph_.nodes[i].output] = root[graph_.nodes[i].inputs[0]];
  }

  // ---- activation buffers ----
  // With a backward pass every activation is kept for it. Forward only (evaluation), a buffer is handed on once
  // its last reader has run (best fit from a free list), so a deep net at a large evaluation batch holds only
  // what is live at once.
  act_.assign(num_tensors, nullptr);
  ASSIGN_OR_RETURN(input_, Alloc(act_n_[0]));
  RETURN_IF_ERROR(device_->Fill(0.0f, input_, act_n_[0]));
  act_[0] = input_;
  std::vector<int> last_use(num_tensors, -1);  // per root: the last node reading it
  for (int i = 0; i < num_nodes; ++i) {
    last_use[root[graph_.nodes[i].output]] = std::max(last_use[root[graph_.nodes[i].output]], i);
    for (int t : graph_.nodes[i].inputs) last_use[root[t]] = std::max(last_use[root[t]], i);
  }
  last_use[root[0]] = last_use[root[graph_.output]] = num_nodes;  // the caller's input and output: never reused
  std::multimap<int64_t, float*> free_buffers;                     // size -> buffer
  std::vector<int64_t> capacity(num_tensors, 0);                   // per root: its buffer's size
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = graph_.nodes[i];
    const int out = n.output;
    if (root[out] != out) {
      act_[out] = act_[root[out]];
    } else if (n.op == Op::kVariable) {
      // The parameters' own memory (read only: BackwardReadsOutput keeps in-place ops off it).
      act_[out] = const_cast<float*>(params_) + var_offsets_[n.variables[0]];
      steps_[i].view = true;
      last_use[out] = num_nodes;
    } else {
      auto fit = with_backward ? free_buffers.end() : free_buffers.lower_bound(act_n_[out]);
      if (fit != free_buffers.end()) {
        act_[out] = fit->second;
        capacity[out] = fit->first;
        free_buffers.erase(fit);
      } else {
        ASSIGN_OR_RETURN(act_[out], Alloc(act_n_[out]));
        capacity[out] = act_n_[out];
      }
    }
    if (with_backward) continue;
    std::vector<int> done = {root[out]};
    for (int t : n.inputs) done.push_back(root[t]);
    std::sort(done.begin(), done.end());
    done.erase(std::unique(done.begin(), done.end()), done.end());
    for (int r : done) {
      if (last_use[r] == i && capacity[r] > 0) free_buffers.emplace(capacity[r], act_[r]);
    }
  }
  output_ = act_[graph_.output];

  // ---- ops and variable views ----
  uint64_t dropouts = 0;
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = graph_.nodes[i];
    Step& s = steps_[i];
    if (!n.variables.empty()) {
      s.var_begin = var_offsets_[n.variables.front()];
      s.var_end = var_offsets_[n.variables.back()] + graph_.variables[n.variables.back()].size();
      for (size_t k = 0; k < n.variables.size(); ++k) {
        const int v = n.variables[k];
        if (k > 0 && var_offsets_[v] != var_offsets_[n.variables[k - 1]] + graph_.variables[n.variables[k - 1]].size()) {
          return node_error(n, absl::InternalError("its variables are not contiguous in the flat buffer"));
        }
        s.w.push_back(params_ + var_offsets_[v]);
        s.dw.push_back(grads_ != nullptr ? grads_ + var_offsets_[v] : nullptr);
        if (graph_.variables[v].trainable) {
          s.has_trainable = true;
        } else if (n.op != Op::kBatchNorm) {
          s.constant_slots.push_back(k);  // zeroed once (after PlanBackward) and after a kernel wrote it
        }
      }
    }
    const TensorShape& in0 = graph_.tensors[n.inputs.empty() ? 0 : n.inputs[0]];
    absl::Status made = absl::OkStatus();
    switch (n.op) {
      case Op::kConv: {
        kernels::Conv2DParams p = n.conv;
        p.batch = batch_;
        auto op = device_->MakeConv2D(p);
        if (op.ok()) s.conv = std::move(op).value(); else made = op.status();
        break;
      }
      case Op::kDense: {
        kernels::DenseParams p = n.dense;
        p.batch = static_cast<int>(act_n_[n.inputs[0]] / p.in);  // rows: every index but the features
        auto op = device_->MakeDense(p);
        if (op.ok()) s.dense = std::move(op).value(); else made = op.status();
        break;
      }
      case Op::kMaxPool: {
        kernels::PoolParams p = n.pool;
        p.batch = batch_;
        auto op = device_->MakeMaxPool(p);
        if (op.ok()) s.maxpool = std::move(op).value(); else made = op.status();
        break;
      }
      case Op::kAvgPool: {
        kernels::PoolParams p = n.pool;
        p.batch = batch_;
        auto op = device_->MakeAvgPool(p);
        if (op.ok()) s.avgpool = std::move(op).value(); else made = op.status();
        break;
      }
      case Op::kLrn: {
        kernels::LrnParams p = n.lrn;
        p.batch = batch_;
        auto op = device_->MakeLrn(p);
        if (op.ok()) s.lrn = std::move(op).value(); else made = op.status();
        break;
      }
      case Op::kBatchNorm: {
        kernels::BatchNormParams p;
        p.batch = batch_;
        p.channels = static_cast<int>(in0.dims[0]);
        p.spatial = in0.is_image() ? in0.dims[1] * in0.dims[2] : 1;
        p.epsilon = n.epsilon;
        s.bn_count = batch_ * p.spatial;
        auto op = device_->MakeBatchNorm(p);
        if (op.ok()) s.bn = std::move(op).value(); else made = op.status();
        if (made.ok()) {
          ASSIGN_OR_RETURN(s.bn_mean, Alloc(p.channels));
          ASSIGN_OR_RETURN(s.bn_var, Alloc(p.channels));
        }
        break;
      }
      case Op::kBinary: {
        s.b_is_variable = n.inputs.size() == 1;
        TensorShape b;
        if (s.b_is_variable) {
          b.dims = graph_.variables[n.variables[0]].shape;
          b.batch_axis = TensorShape::kNoBatch;
        } else {
          b = graph_.tensors[n.inputs[1]];
        }
        absl::StatusOr<kernels::BroadcastParams> p =
            BroadcastOver(graph_.tensors[n.output], batch_, in0, b, n.binary);
        if (!p.ok()) return node_error(n, p.status());
        auto op = device_->MakeBinary(*p);
        if (op.ok()) s.binary = std::move(op).value(); else made = op.status();
        break;
      }
      case Op::kDropout:
        s.dropout_index = dropouts++;
        if (with_backward) {
          ASSIGN_OR_RETURN(s.mask, Alloc(act_n_[n.output]));
        }
        break;
      case Op::kConcat: {
        // Rows: the storage dims outside the concatenated axis (every input is stored as the output is).
        const TensorShape& out = graph_.tensors[n.output];
        const std::vector<int> order = StorageOrder(out);
        const std::vector<int64_t> full = out.FullDims(batch_);
        s.concat_rows = 1;
        for (size_t k = 0; order[k] != n.axis; ++k) s.concat_rows *= full[order[k]];
        s.concat_out_cols = act_n_[n.output] / s.concat_rows;
        for (int t : n.inputs) s.concat_cols.push_back(act_n_[t] / s.concat_rows);
        break;
      }
      case Op::kInteraction:
        s.interaction.batch = batch_;
        s.interaction.features = static_cast<int>(in0.dims[0]);
        s.interaction.dim = static_cast<int>(in0.dims[1]);
        break;
      case Op::kEmbedding:
        s.has_trainable = true;  // its table's rows
        break;
      case Op::kRelu:
      case Op::kActivation:
      case Op::kReshape:
      case Op::kIdentity:
        break;
      case Op::kTranspose:
      case Op::kMatMul:
      case Op::kSoftmax:
      case Op::kLayerNorm:
      case Op::kReduce:
      case Op::kSlice:
      case Op::kGather:
      case Op::kExpand:
      case Op::kVariable:
        made = BuildTensorOp(s);
        break;
    }
    if (!made.ok()) return node_error(n, made);
  }
  if (with_backward) {
    RETURN_IF_ERROR(PlanBackward());
    // Constants (non-trainable variables other than BatchNorm's running statistics, whose slots Forward
    // writes) push a zero change.
    for (int i = 0; i < num_nodes; ++i) {
      for (size_t k : steps_[i].constant_slots) {
        RETURN_IF_ERROR(device_->Fill(0.0f, steps_[i].dw[k], graph_.variables[graph_.nodes[i].variables[k]].size()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status GraphNetwork::PlanBackward() {
  const int num_tensors = static_cast<int>(graph_.tensors.size());
  const int num_nodes = static_cast<int>(graph_.nodes.size());
  requires_grad_.assign(num_tensors, false);
  for (int i = 0; i < num_nodes; ++i) {
    const Node& n = graph_.nodes[i];
    bool r = steps_[i].has_trainable;
    for (int t : n.inputs) r = r || requires_grad_[t];
    requires_grad_[n.output] = r;
  }
  // Whether a gradient reaches each tensor (from the output, through nodes that run backward).
  std::vector<bool> flows(num_tensors, false);
  flows[graph_.output] = true;
  for (int i = num_nodes; i-- > 0;) {
    const Node& n = graph_.nodes[i];
    Step& s = steps_[i];
    s.run_backward = flows[n.output] && requires_grad_[n.output];
    s.zero_var_grads = !s.run_backward && s.has_trainable;
    if (!s.run_backward) continue;
    for (int t : n.inputs) {
      if (requires_grad_[t]) flows[t] = true;
    }
  }

  // Liveness simulation: buffers are handed out from a free list (best fit) and returned after the backward of
  // the producer of the tensor whose gradient they hold.
  struct Buffer {
    int64_t size = 0;
    float* ptr = nullptr;
  };
  std::vector<Buffer> buffers;
  std::multimap<int64_t, int> free_list;  // size -> buffer id
  constexpr int kNone = -1, kExternal = -2;
  std::vector<int> gbuf(num_tensors, kNone);
  gbuf[graph_.output] = kExternal;
  auto take = [&](int64_t n) {
    auto it = free_list.lower_bound(n);
    if (it != free_list.end()) {
      const int id = it->second;
      free_list.erase(it);
      return id;
    }
    buffers.push_back({n, nullptr});
    return static_cast<int>(buffers.size()) - 1;
  };
  // Per node and input slot, which buffer id (resolved to pointers below).
  std::vector<std::vector<int>> dst_id(num_nodes);
  std::vector<int> dy_id(num_nodes, kNone);
  int64_t scratch_n = 0;
  for (int i = num_nodes; i-- > 0;) {
    const Node& n = graph_.nodes[i];
    Step& s = steps_[i];
    s.in_grad.assign(n.inputs.size(), {});
    dst_id[i].assign(n.inputs.size(), kNone);
    if (!s.run_backward) continue;
    const int dy = gbuf[n.output];
    dy_id[i] = dy;
    bool transferred = false;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int t = n.inputs[k];
      if (!requires_grad_[t]) continue;
      Step::InGrad& g = s.in_grad[k];
      g.needed = true;
      // dx can be dy's own buffer: elementwise ops computed in place, pure views, and a same-shape Add's first
      // operand (the gradient passes through unchanged).
      const bool same_size = act_n_[t] == act_n_[n.output];
      const bool same_storage = SameStorage(graph_.tensors[t], graph_.tensors[n.output]);
      const bool passable =
          same_size && (n.op == Op::kRelu || n.op == Op::kDropout || n.op == Op::kActivation ||
                        n.op == Op::kIdentity || (n.op == Op::kReshape && s.move == Step::Move::kView) ||
                        (n.op == Op::kTranspose && s.view) ||
                        (n.op == Op::kBinary && n.binary == kernels::BinaryOp::kAdd && k == 0 && same_storage));
      if (gbuf[t] == kNone) {
        if (passable && !transferred && dy != kExternal) {
          gbuf[t] = dy;
          transferred = true;
          g.alias = true;
        } else {
          gbuf[t] = take(act_n_[t]);
        }
      } else {
        g.accumulate = true;
        // Ops that add natively or from dy directly need no scratch.
        const bool direct = n.op == Op::kIdentity || n.op == Op::kConcat || n.op == Op::kTranspose ||
                            n.op == Op::kSlice || n.op == Op::kGather ||
                            (n.op == Op::kReshape && s.move == Step::Move::kView) ||
                            (n.op == Op::kBinary && n.binary == kernels::BinaryOp::kAdd && same_storage);
        if (!direct) scratch_n = std::max(scratch_n, act_n_[t]);
      }
      dst_id[i][k] = gbuf[t];
    }
    if ((n.op == Op::kBatchNorm || n.op == Op::kLayerNorm) && !s.in_grad[0].needed) {
      scratch_n = std::max(scratch_n, act_n_[n.inputs[0]]);  // dx computed with the weights' gradients
    }
    if (dy >= 0 && !transferred) free_list.emplace(buffers[dy].size, dy);
  }
  for (Buffer& b : buffers) {
    ASSIGN_OR_RETURN(b.ptr, Alloc(b.size));
  }
  if (scratch_n > 0) {
    ASSIGN_OR_RETURN(scratch_, Alloc(scratch_n));
  }
  for (int i = 0; i < num_nodes; ++i) {
    Step& s = steps_[i];
    s.dy = dy_id[i] >= 0 ? buffers[dy_id[i]].ptr : nullptr;
    for (size_t k = 0; k < s.in_grad.size(); ++k) {
      if (dst_id[i][k] >= 0) s.in_grad[k].dst = buffers[dst_id[i][k]].ptr;
    }
  }
  return absl::OkStatus();
}

absl::Status GraphNetwork::Forward(bool training, uint64_t seed, int64_t step, const NodeHook* before_node) {
  return ForwardImpl(training, seed, step, nullptr, 0, 0, before_node);
}

absl::Status GraphNetwork::ForwardDeviceCounter(bool training, uint64_t seed, const kernels::DeviceCounter& step,
                                                uint64_t counter_stride, uint64_t counter_offset,
                                                const NodeHook* before_node) {
  return ForwardImpl(training, seed, 0, &step, counter_stride, counter_offset, before_node);
}

absl::Status GraphNetwork::ForwardImpl(bool training, uint64_t seed, int64_t step,
                                       const kernels::DeviceCounter* device_step, uint64_t counter_stride,
                                       uint64_t counter_offset, const NodeHook* before_node) {
  for (Step& s : steps_) {
    if (before_node != nullptr && s.var_end > s.var_begin) RETURN_IF_ERROR((*before_node)(s.index));
    RETURN_IF_ERROR(ForwardNode(s, training, seed, step, device_step, counter_stride, counter_offset));
  }
  return absl::OkStatus();
}

absl::Status GraphNetwork::ForwardNode(Step& s, bool training, uint64_t seed, int64_t step,
                                       const kernels::DeviceCounter* device_step, uint64_t counter_stride,
                                       uint64_t counter_offset) {
  const Node& n = *s.node;
  const float* x = act_[n.inputs.empty() ? 0 : n.inputs[0]];
  float* y = act_[n.output];
  const int64_t out_n = act_n_[n.output];
  switch (n.op) {
    case Op::kConv:
      return s.conv->Forward(x, s.w[0], n.conv.has_bias ? s.w[1] : nullptr, y);
    case Op::kDense:
      return s.dense->Forward(x, s.w[0], n.dense.has_bias ? s.w[1] : nullptr, y);
    case Op::kMaxPool:
      return s.maxpool->Forward(x, y);
    case Op::kAvgPool:
      return s.avgpool->Forward(x, y);
    case Op::kLrn:
      return s.lrn->Forward(x, y);
    case Op::kRelu:
      return device_->Relu(x, y, out_n);
    case Op::kActivation:
      return device_->Activation(n.activation, x, y, out_n);
    case Op::kBatchNorm:
      if (!training) return s.bn->ForwardInference(x, s.w[0], s.w[1], s.w[2], s.w[3], y);
      RETURN_IF_ERROR(s.bn->ForwardTraining(x, s.w[0], s.w[1], y, s.bn_mean, s.bn_var));
      if (grads_ == nullptr) return absl::OkStatus();
      return device_->BatchNormRunningDelta(s.w[2], s.w[3], s.bn_mean, s.bn_var,
                                            static_cast<int>(graph_.variables[n.variables[2]].size()), s.bn_count,
                                            n.momentum, n.unbiased_running_var, s.dw[2], s.dw[3]);
    case Op::kBinary:
      return s.binary->Forward(x, s.b_is_variable ? s.w[0] : act_[n.inputs[1]], y);
    case Op::kDropout:
      if (training && s.mask != nullptr) {
        // Each dropout node gets its own key so two nodes never share a mask.
        const uint64_t node_seed = seed * 0x9E3779B97F4A7C15ULL + s.dropout_index;
        if (device_step != nullptr) {
          return device_->DropoutDeviceCounter(x, y, s.mask, out_n, n.keep_prob, node_seed, *device_step,
                                               counter_stride, counter_offset);
        }
        return device_->Dropout(x, y, s.mask, out_n, n.keep_prob, node_seed, static_cast<uint64_t>(step));
      }
      return device_->CopyOnDevice(x, y, out_n);
    case Op::kReshape:
      if (s.move == Step::Move::kView) return absl::OkStatus();
      return device_->Transpose(x, y, batch_, s.t_rows, s.t_cols);
    case Op::kIdentity:
      return absl::OkStatus();
    case Op::kConcat: {
      int64_t col = 0;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        RETURN_IF_ERROR(device_->CopyStrided(act_[n.inputs[k]], s.concat_cols[k], y + col, s.concat_out_cols,
                                             s.concat_rows, s.concat_cols[k], /*accumulate=*/false));
        col += s.concat_cols[k];
      }
      return absl::OkStatus();
    }
    case Op::kInteraction:
      return device_->Interaction(s.interaction, x, y);
    case Op::kEmbedding: {
      kernels::GatherParams p;
      RETURN_IF_ERROR(EmbeddingParams(n, &p));
      const Node::Embedding& e = n.embedding;
      return device_->Gather(p, sparse_->rows[e.table], sparse_->indices[e.feature],
                             e.bag ? sparse_->offsets[e.feature] : nullptr, y);
    }
    case Op::kTranspose:
    case Op::kMatMul:
    case Op::kSoftmax:
    case Op::kLayerNorm:
    case Op::kReduce:
    case Op::kSlice:
    case Op::kGather:
    case Op::kExpand:
    case Op::kVariable:
      return ForwardTensorOp(s);
  }
  return absl::OkStatus();
}

absl::Status GraphNetwork::EmbeddingParams(const Node& n, kernels::GatherParams* p) const {
  const Node::Embedding& e = n.embedding;
  if (sparse_ == nullptr || e.table >= static_cast<int>(sparse_->rows.size()) ||
      e.feature >= static_cast<int>(sparse_->indices.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat(graph_.name, ": node '", n.name, "' (Embedding) runs without its sparse inputs bound"));
  }
  p->rows = sparse_->num_rows[e.table];
  p->dim = graph_.tables[e.table].dim;
  p->count = sparse_->counts[e.feature];
  p->num_bags = e.bag ? batch_ : 0;
  p->mean = e.mean;
  if (!e.bag && p->count != batch_) {
    return absl::InvalidArgumentError(absl::StrCat(graph_.name, ": node '", n.name, "' (Embedding) takes one id per example, got ",
                                                   p->count, " for ", batch_, " examples"));
  }
  return absl::OkStatus();
}

absl::Status GraphNetwork::Deliver(const float* src, float* dst, int64_t n, bool accumulate) {
  // src == dst: the gradient was passed through to this very buffer (x + x): it counts twice.
  if (src == dst) return accumulate ? device_->Scale(2.0f, dst, dst, n) : absl::OkStatus();
  return accumulate ? device_->Axpy(1.0f, src, dst, n) : device_->CopyOnDevice(src, dst, n);
}

absl::Status GraphNetwork::Backward(float* doutput, const NodeHook* grads_ready) {
  if (!with_backward_) return absl::FailedPreconditionError("GraphNetwork::Backward on a forward-only network");
  for (Step& s : steps_) {
    if (!s.zero_var_grads) continue;
    for (size_t k = 0; k < s.dw.size(); ++k) {
      if (graph_.variables[s.node->variables[k]].trainable) {
        RETURN_IF_ERROR(device_->Fill(0.0f, s.dw[k], graph_.variables[s.node->variables[k]].size()));
      }
    }
  }
  external_dy_ = doutput;
  for (size_t i = steps_.size(); i-- > 0;) {
    Step& s = steps_[i];
    if (s.run_backward) {
      RETURN_IF_ERROR(BackwardNode(s, grads_ready));
    } else if (s.zero_var_grads && grads_ready != nullptr) {
      RETURN_IF_ERROR((*grads_ready)(s.index));
    }
  }
  return absl::OkStatus();
}

absl::Status GraphNetwork::BackwardNode(Step& s, const NodeHook* grads_ready) {
  const Node& n = *s.node;
  // The gradient of the output: the planned buffer, or the caller's for the graph's output.
  float* dy = s.dy != nullptr ? s.dy : external_dy_;
  const float* x = act_[n.inputs.empty() ? 0 : n.inputs[0]];
  const float* y = act_[n.output];
  const int64_t out_n = act_n_[n.output];
  auto ready = [&]() -> absl::Status {
    // Conv's and Dense's kernels write every weight gradient, a constant's too (a constant bias): it must
    // stay zero. (Binary writes only a trainable operand's.)
    if (n.op == Op::kConv || n.op == Op::kDense || n.op == Op::kLayerNorm) {
      for (size_t k : s.constant_slots) {
        RETURN_IF_ERROR(device_->Fill(0.0f, s.dw[k], graph_.variables[n.variables[k]].size()));
      }
    }
    if (grads_ready != nullptr && s.var_end > s.var_begin) return (*grads_ready)(s.index);
    return absl::OkStatus();
  };
  auto target = [&](size_t k) -> float* { return GradTarget(s, k); };
  auto finish = [&](size_t k) -> absl::Status { return FinishGrad(s, k); };
  switch (n.op) {
    case Op::kConv:
      RETURN_IF_ERROR(s.conv->BackwardWeights(x, dy, s.dw[0], n.conv.has_bias ? s.dw[1] : nullptr));
      RETURN_IF_ERROR(ready());
      if (s.in_grad[0].needed) {
        RETURN_IF_ERROR(s.conv->BackwardData(dy, s.w[0], target(0)));
        RETURN_IF_ERROR(finish(0));
      }
      return absl::OkStatus();
    case Op::kDense:
      RETURN_IF_ERROR(s.dense->BackwardWeights(x, dy, s.dw[0], n.dense.has_bias ? s.dw[1] : nullptr));
      RETURN_IF_ERROR(ready());
      if (s.in_grad[0].needed) {
        RETURN_IF_ERROR(s.dense->BackwardData(dy, s.w[0], target(0)));
        RETURN_IF_ERROR(finish(0));
      }
      return absl::OkStatus();
    case Op::kBatchNorm: {
      float* dx = s.in_grad[0].needed ? target(0) : scratch_;  // the plan sized the scratch for an unused dx
      RETURN_IF_ERROR(s.bn->Backward(x, dy, s.w[0], s.bn_mean, s.bn_var, dx, s.dw[0], s.dw[1]));
      RETURN_IF_ERROR(ready());
      return s.in_grad[0].needed ? finish(0) : absl::OkStatus();
    }
    case Op::kBinary: {
      const float* a = x;
      const float* b = s.b_is_variable ? s.w[0] : act_[n.inputs[1]];
      if (s.b_is_variable) {
        // The variable's gradient first (it is final then), then the tensor's. A constant (a non-trainable
        // variable) has none: its slot stays zero (Build).
        if (s.has_trainable) RETURN_IF_ERROR(s.binary->Backward(a, b, dy, nullptr, s.dw[0]));
        RETURN_IF_ERROR(ready());
        if (s.in_grad[0].needed) {
          RETURN_IF_ERROR(s.binary->Backward(a, b, dy, target(0), nullptr));
          RETURN_IF_ERROR(finish(0));
        }
        return absl::OkStatus();
      }
      const bool plain_add = n.binary == kernels::BinaryOp::kAdd;
      // In the planned order (a gradient written before one accumulated into the same buffer). A same-shape
      // Add passes dy through to input 0 (alias: nothing to do, dy stays intact for input 1).
      for (size_t k = 0; k < 2; ++k) {
        const Step::InGrad& g = s.in_grad[k];
        if (!g.needed) continue;
        if (plain_add && SameStorage(graph_.tensors[n.inputs[k]], graph_.tensors[n.output])) {
          if (!g.alias) RETURN_IF_ERROR(Deliver(dy, g.dst, out_n, g.accumulate));
          continue;
        }
        RETURN_IF_ERROR(s.binary->Backward(a, b, dy, k == 0 ? target(0) : nullptr, k == 1 ? target(1) : nullptr));
        RETURN_IF_ERROR(finish(k));
      }
      return absl::OkStatus();
    }
    case Op::kConcat: {
      // Several inputs, any of which may need no gradient (a graph input): not the single-input path below.
      int64_t col = 0;
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        if (s.in_grad[k].needed) {
          RETURN_IF_ERROR(device_->CopyStrided(dy + col, s.concat_out_cols, s.in_grad[k].dst, s.concat_cols[k],
                                               s.concat_rows, s.concat_cols[k], s.in_grad[k].accumulate));
        }
        col += s.concat_cols[k];
      }
      return absl::OkStatus();
    }
    case Op::kEmbedding: {
      kernels::GatherParams p;
      RETURN_IF_ERROR(EmbeddingParams(n, &p));
      const Node::Embedding& e = n.embedding;
      return device_->GatherBackward(p, dy, sparse_->indices[e.feature], e.bag ? sparse_->offsets[e.feature] : nullptr,
                                     sparse_->row_grads[e.table]);
    }
    case Op::kLayerNorm:
    case Op::kVariable:
    case Op::kMatMul:
      // Ops with variables or several inputs: the variables' gradients first, then the inputs'.
      RETURN_IF_ERROR(BackwardTensorOp(s, dy));
      return ready();
    case Op::kTranspose:
    case Op::kSoftmax:
    case Op::kReduce:
    case Op::kSlice:
    case Op::kGather:
    case Op::kExpand:
      return BackwardTensorOp(s, dy);
    default:
      break;
  }
  // Ops with one input and no variables.
  if (!s.in_grad[0].needed) return absl::OkStatus();
  const Step::InGrad& g = s.in_grad[0];
  const int64_t in_n = act_n_[n.inputs[0]];
  switch (n.op) {
    case Op::kRelu:
      RETURN_IF_ERROR(device_->ReluBackward(y, dy, target(0), out_n));
      return finish(0);
    case Op::kActivation:
      RETURN_IF_ERROR(device_->ActivationBackward(n.activation, x, y, dy, target(0), out_n));
      return finish(0);
    case Op::kDropout:
      RETURN_IF_ERROR(device_->DropoutBackward(dy, s.mask, target(0), out_n));
      return finish(0);
    case Op::kMaxPool:
      RETURN_IF_ERROR(s.maxpool->Backward(dy, target(0)));
      return finish(0);
    case Op::kAvgPool:
      RETURN_IF_ERROR(s.avgpool->Backward(dy, target(0)));
      return finish(0);
    case Op::kLrn:
      RETURN_IF_ERROR(s.lrn->Backward(x, y, dy, target(0)));
      return finish(0);
    case Op::kIdentity:
      return g.alias ? absl::OkStatus() : Deliver(dy, g.dst, in_n, g.accumulate);
    case Op::kReshape:
      if (s.move == Step::Move::kView) return g.alias ? absl::OkStatus() : Deliver(dy, g.dst, in_n, g.accumulate);
      // The inverse transpose: the forward's [rows, cols] became [cols, rows].
      RETURN_IF_ERROR(device_->Transpose(dy, target(0), batch_, s.t_cols, s.t_rows));
      return finish(0);
    case Op::kInteraction:
      RETURN_IF_ERROR(device_->InteractionBackward(s.interaction, x, dy, target(0)));
      return finish(0);
    default:
      return absl::InternalError(absl::StrCat("no backward for ", OpName(n.op)));
  }
}

}  // namespace dtrain::models
