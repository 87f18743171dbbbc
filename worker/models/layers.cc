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

}  // namespace dtrain::models
