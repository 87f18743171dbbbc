#include "worker/models/layers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::models {

using kernels::Padding;

LayerSpec LayerSpec::Conv(std::string name, int kernel, int out, Padding padding, Initializer w, Initializer b,
                          float weight_decay) {
  LayerSpec s;
  s.kind = Kind::kConv;
  s.name = std::move(name);
  s.kernel = kernel;
  s.out = out;
  s.padding = padding;
  s.weights_init = w;
  s.biases_init = b;
  s.weight_decay = weight_decay;
  return s;
}

LayerSpec LayerSpec::Dense(std::string name, int out, Initializer w, Initializer b, float weight_decay) {
  LayerSpec s;
  s.kind = Kind::kDense;
  s.name = std::move(name);
  s.out = out;
  s.weights_init = w;
  s.biases_init = b;
  s.weight_decay = weight_decay;
  return s;
}

LayerSpec LayerSpec::Relu() { return LayerSpec{}; }

LayerSpec LayerSpec::MaxPool(int window, int stride, Padding padding) {
  LayerSpec s;
  s.kind = Kind::kMaxPool;
  s.kernel = window;
  s.stride = stride;
  s.padding = padding;
  return s;
}

LayerSpec LayerSpec::Lrn(int depth_radius, float bias, float alpha, float beta) {
  LayerSpec s;
  s.kind = Kind::kLrn;
  s.lrn.depth_radius = depth_radius;
  s.lrn.bias = bias;
  s.lrn.alpha = alpha;
  s.lrn.beta = beta;
  return s;
}

LayerSpec LayerSpec::Dropout(float keep_prob) {
  LayerSpec s;
  s.kind = Kind::kDropout;
  s.keep_prob = keep_prob;
  return s;
}

Initializer TruncatedNormal(float stddev) {
  Initializer i;
  i.kind = Initializer::Kind::kTruncatedNormal;
  i.stddev = stddev;
  return i;
}

Initializer Constant(float value) {
  Initializer i;
  i.kind = Initializer::Kind::kConstant;
  i.value = value;
  return i;
}

namespace {

std::string LayerLabel(const LayerSpec& s, size_t index) {
  static const char* kKinds[] = {"conv", "dense", "relu", "maxpool", "lrn", "dropout"};
  return s.name.empty() ? absl::StrCat(kKinds[static_cast<int>(s.kind)], " (layer ", index, ")")
                        : absl::StrCat(s.name, " (layer ", index, ")");
}

}  // namespace

absl::StatusOr<std::vector<Geometry>> InferShapes(const std::string& model, const std::vector<LayerSpec>& layers,
                                                  Geometry input) {
  if (input.h < 1 || input.w < 1 || input.c < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, ": input geometry ", input.h, "x", input.w, "x", input.c, " must be positive"));
  }
  std::vector<Geometry> out;
  Geometry g = input;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& s = layers[i];
    Geometry next = g;
    switch (s.kind) {
      case LayerSpec::Kind::kConv:
        if (s.kernel < 1 || s.out < 1 || s.stride < 1) {
          return absl::InvalidArgumentError(absl::StrCat(model, ": bad conv spec at ", LayerLabel(s, i)));
        }
        next = {kernels::OutputSize(g.h, s.kernel, s.stride, s.padding),
                kernels::OutputSize(g.w, s.kernel, s.stride, s.padding), s.out};
        break;
      case LayerSpec::Kind::kMaxPool:
        if (s.kernel < 1 || s.stride < 1) {
          return absl::InvalidArgumentError(absl::StrCat(model, ": bad pool spec at ", LayerLabel(s, i)));
        }
        next = {kernels::OutputSize(g.h, s.kernel, s.stride, s.padding),
                kernels::OutputSize(g.w, s.kernel, s.stride, s.padding), g.c};
        break;
      case LayerSpec::Kind::kDense:
        if (s.out < 1) {
          return absl::InvalidArgumentError(absl::StrCat(model, ": bad dense spec at ", LayerLabel(s, i)));
        }
        next = {1, 1, s.out};
        break;
      case LayerSpec::Kind::kDropout:
        if (!(s.keep_prob > 0.0f && s.keep_prob <= 1.0f)) {
          return absl::InvalidArgumentError(
              absl::StrCat(model, ": dropout keep_prob ", s.keep_prob, " not in (0, 1] at ", LayerLabel(s, i)));
        }
        break;
      case LayerSpec::Kind::kRelu:
      case LayerSpec::Kind::kLrn:
        break;
    }
    if (next.h < 1 || next.w < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          model, ": input ", input.h, "x", input.w, "x", input.c, " is too small: the output of ", LayerLabel(s, i),
          " would be ", next.h, "x", next.w, " (", g.h, "x", g.w, " in)"));
    }
    out.push_back(next);
    g = next;
  }
  return out;
}

absl::StatusOr<std::vector<VariableInfo>> VariablesOf(const std::string& model,
                                                      const std::vector<LayerSpec>& layers, Geometry input) {
  ASSIGN_OR_RETURN(std::vector<Geometry> shapes, InferShapes(model, layers, input));
  std::vector<VariableInfo> vars;
  Geometry in = input;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& s = layers[i];
    if (s.kind == LayerSpec::Kind::kConv) {
      vars.push_back({s.name + "/weights", {s.kernel, s.kernel, in.c, s.out}, s.weights_init, s.weight_decay});
      vars.push_back({s.name + "/biases", {s.out}, s.biases_init, 0.0f});
    } else if (s.kind == LayerSpec::Kind::kDense) {
      vars.push_back({s.name + "/weights", {in.size(), s.out}, s.weights_init, s.weight_decay});
      vars.push_back({s.name + "/biases", {s.out}, s.biases_init, 0.0f});
    }
    in = shapes[i];
  }
  return vars;
}

// ---------------------------------------------------------------------------------------------------------------

struct Network::Layer {
  LayerSpec spec;
  Geometry in, out;
  int64_t in_n = 0, out_n = 0;  // floats for the whole batch
  float* x = nullptr;           // input activations
  float* y = nullptr;           // output activations (== x for in-place ReLU)
  float* mask = nullptr;        // dropout mask
  const float* w = nullptr;
  const float* b = nullptr;
  int64_t var_begin = 0, var_end = 0;  // the layer's variables in the flat buffer
  float* dw = nullptr;
  float* db = nullptr;
  uint64_t dropout_index = 0;
  std::unique_ptr<kernels::Conv2D> conv;
  std::unique_ptr<kernels::Dense> dense;
  std::unique_ptr<kernels::MaxPool> pool;
  std::unique_ptr<kernels::Lrn> lrn;
};

Network::Network(kernels::Device* device, int batch) : device_(device), batch_(batch) {}

Network::~Network() {
  for (float* p : owned_) device_->Free(p);
}

absl::StatusOr<float*> Network::Alloc(int64_t n) {
  ASSIGN_OR_RETURN(float* p, device_->Alloc(std::max<int64_t>(n, 1)));
  owned_.push_back(p);
  return p;
}

absl::StatusOr<std::unique_ptr<Network>> Network::Create(kernels::Device* device, const std::vector<LayerSpec>& layers,
                                                         Geometry input, int batch, bool with_backward,
                                                         const float* params, float* grads) {
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("batch size must be positive, got ", batch));
  if (layers.empty()) return absl::InvalidArgumentError("a network needs at least one layer");
  if (with_backward && grads == nullptr) return absl::InvalidArgumentError("with_backward needs a gradient buffer");
  ASSIGN_OR_RETURN(std::vector<Geometry> shapes, InferShapes("network", layers, input));
  std::unique_ptr<Network> net(new Network(device, batch));
  net->with_backward_ = with_backward;
  ASSIGN_OR_RETURN(net->input_, net->Alloc(batch * input.size()));
  RETURN_IF_ERROR(device->Fill(0.0f, net->input_, batch * input.size()));

  int64_t offset = 0, max_n = 0;
  uint64_t dropouts = 0;
  float* x = net->input_;
  Geometry in = input;
  net->layers_.resize(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    Layer& l = net->layers_[i];
    l.spec = layers[i];
    l.in = in;
    l.out = shapes[i];
    l.in_n = batch * in.size();
    l.out_n = batch * l.out.size();
    l.x = x;
    max_n = std::max({max_n, l.in_n, l.out_n});
    const LayerSpec& s = l.spec;
    switch (s.kind) {
      case LayerSpec::Kind::kConv: {
        kernels::Conv2DParams p;
        p.batch = batch;
        p.in_h = in.h;
        p.in_w = in.w;
        p.in_c = in.c;
        p.out_c = s.out;
        p.k_h = p.k_w = s.kernel;
        p.stride_h = p.stride_w = s.stride;
        p.padding = s.padding;
        ASSIGN_OR_RETURN(l.conv, device->MakeConv2D(p));
        break;
      }
      case LayerSpec::Kind::kDense: {
        ASSIGN_OR_RETURN(l.dense, device->MakeDense({batch, static_cast<int>(in.size()), s.out}));
        break;
      }
      case LayerSpec::Kind::kMaxPool: {
        kernels::PoolParams p;
        p.batch = batch;
        p.in_h = in.h;
        p.in_w = in.w;
        p.channels = in.c;
        p.window = s.kernel;
        p.stride = s.stride;
        p.padding = s.padding;
        ASSIGN_OR_RETURN(l.pool, device->MakeMaxPool(p));
        break;
      }
      case LayerSpec::Kind::kLrn: {
        kernels::LrnParams p = s.lrn;
        p.batch = batch;
        p.h = in.h;
        p.w = in.w;
        p.channels = in.c;
        ASSIGN_OR_RETURN(l.lrn, device->MakeLrn(p));
        break;
      }
      case LayerSpec::Kind::kDropout:
        l.dropout_index = dropouts++;
        if (with_backward) {
          ASSIGN_OR_RETURN(l.mask, net->Alloc(l.out_n));
        }
        break;
      case LayerSpec::Kind::kRelu:
        break;
    }
    if (s.kind == LayerSpec::Kind::kConv || s.kind == LayerSpec::Kind::kDense) {
      const int64_t w_n = s.kind == LayerSpec::Kind::kConv
                              ? static_cast<int64_t>(s.kernel) * s.kernel * in.c * s.out
                              : in.size() * s.out;
      l.w = params + offset;
      l.b = params + offset + w_n;
      l.var_begin = offset;
      l.var_end = offset + w_n + s.out;
      if (grads != nullptr) {
        l.dw = grads + offset;
        l.db = grads + offset + w_n;
      }
      offset += w_n + s.out;
    }
    // ReLU runs in place: the layers after it and its own backward only need its output.
    if (s.kind == LayerSpec::Kind::kRelu) {
      l.y = x;
    } else {
      ASSIGN_OR_RETURN(l.y, net->Alloc(l.out_n));
    }
    x = l.y;
    in = l.out;
  }
  net->output_ = x;
  net->output_per_example_ = in.size();
  if (with_backward) {
    ASSIGN_OR_RETURN(net->grad_buffers_[0], net->Alloc(max_n));
    ASSIGN_OR_RETURN(net->grad_buffers_[1], net->Alloc(max_n));
  }
  return net;
}

int Network::num_layers() const { return static_cast<int>(layers_.size()); }

std::pair<int64_t, int64_t> Network::variable_range(int i) const {
  return {layers_[i].var_begin, layers_[i].var_end};
}

absl::Status Network::Forward(bool training, uint64_t seed, int64_t step, const LayerHook* before_layer) {
  return ForwardImpl(training, seed, step, nullptr, 0, 0, before_layer);
}

absl::Status Network::ForwardDeviceCounter(bool training, uint64_t seed, const kernels::DeviceCounter& step,
                                           uint64_t counter_stride, uint64_t counter_offset,
                                           const LayerHook* before_layer) {
  return ForwardImpl(training, seed, 0, &step, counter_stride, counter_offset, before_layer);
}

absl::Status Network::ForwardImpl(bool training, uint64_t seed, int64_t step,
                                  const kernels::DeviceCounter* device_step, uint64_t counter_stride,
                                  uint64_t counter_offset, const LayerHook* before_layer) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    if (before_layer != nullptr && l.var_end > l.var_begin) RETURN_IF_ERROR((*before_layer)(static_cast<int>(i)));
    switch (l.spec.kind) {
      case LayerSpec::Kind::kConv:
        RETURN_IF_ERROR(l.conv->Forward(l.x, l.w, l.b, l.y));
        break;
      case LayerSpec::Kind::kDense:
        RETURN_IF_ERROR(l.dense->Forward(l.x, l.w, l.b, l.y));
        break;
      case LayerSpec::Kind::kRelu:
        RETURN_IF_ERROR(device_->Relu(l.x, l.y, l.in_n));
        break;
      case LayerSpec::Kind::kMaxPool:
        RETURN_IF_ERROR(l.pool->Forward(l.x, l.y));
        break;
      case LayerSpec::Kind::kLrn:
        RETURN_IF_ERROR(l.lrn->Forward(l.x, l.y));
        break;
      case LayerSpec::Kind::kDropout:
        if (training && l.mask != nullptr) {
          // Each dropout layer gets its own key so two layers never share a mask.
          const uint64_t layer_seed = seed * 0x9E3779B97F4A7C15ULL + l.dropout_index;
          if (device_step != nullptr) {
            RETURN_IF_ERROR(device_->DropoutDeviceCounter(l.x, l.y, l.mask, l.in_n, l.spec.keep_prob,
                                                          layer_seed, *device_step, counter_stride,
                                                          counter_offset));
          } else {
            RETURN_IF_ERROR(device_->Dropout(l.x, l.y, l.mask, l.in_n, l.spec.keep_prob, layer_seed,
                                             static_cast<uint64_t>(step)));
          }
        } else {
          RETURN_IF_ERROR(device_->CopyOnDevice(l.x, l.y, l.in_n));
        }
        break;
    }
  }
  return absl::OkStatus();
}

absl::Status Network::Backward(float* doutput, const LayerHook* grads_ready) {
  if (!with_backward_) return absl::FailedPreconditionError("Network::Backward on a forward-only network");
  float* dy = doutput;
  for (size_t i = layers_.size(); i-- > 0;) {
    Layer& l = layers_[i];
    const bool need_dx = i > 0;
    float* dx = dy == grad_buffers_[0] ? grad_buffers_[1] : grad_buffers_[0];
    switch (l.spec.kind) {
      case LayerSpec::Kind::kConv:
        RETURN_IF_ERROR(l.conv->BackwardWeights(l.x, dy, l.dw, l.db));
        if (grads_ready != nullptr) RETURN_IF_ERROR((*grads_ready)(static_cast<int>(i)));
        if (need_dx) RETURN_IF_ERROR(l.conv->BackwardData(dy, l.w, dx));
        break;
      case LayerSpec::Kind::kDense:
        RETURN_IF_ERROR(l.dense->BackwardWeights(l.x, dy, l.dw, l.db));
        if (grads_ready != nullptr) RETURN_IF_ERROR((*grads_ready)(static_cast<int>(i)));
        if (need_dx) RETURN_IF_ERROR(l.dense->BackwardData(dy, l.w, dx));
        break;
      case LayerSpec::Kind::kRelu:
        dx = dy;  // in place
        if (need_dx) RETURN_IF_ERROR(device_->ReluBackward(l.y, dy, dx, l.in_n));
        break;
      case LayerSpec::Kind::kMaxPool:
        if (need_dx) RETURN_IF_ERROR(l.pool->Backward(dy, dx));
        break;
      case LayerSpec::Kind::kLrn:
        if (need_dx) RETURN_IF_ERROR(l.lrn->Backward(l.x, l.y, dy, dx));
        break;
      case LayerSpec::Kind::kDropout:
        dx = dy;  // in place
        if (need_dx) RETURN_IF_ERROR(device_->DropoutBackward(dy, l.mask, dx, l.in_n));
        break;
    }
    dy = dx;
  }
  return absl::OkStatus();
}

}  // namespace dtrain::models
