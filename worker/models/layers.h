// The built-in models' declarative layer lists (LayerSpec), their shape inference and variables. A layer list
// becomes a Graph (worker/models/graph.h, GraphFromLayers), which GraphNetwork runs.
//
// Thread-safety: plain values and functions.
//
// Example:
//   std::vector<LayerSpec> layers = {LayerSpec::Dense("fc1", 500, w, b), LayerSpec::Relu(), ...};
//   ASSIGN_OR_RETURN(auto vars, VariablesOf("mlp", layers, {28, 28, 1}));
//   ASSIGN_OR_RETURN(Graph graph, GraphFromLayers("mlp", layers, {28, 28, 1}, /*num_classes=*/10));
#ifndef DTRAIN_WORKER_MODELS_LAYERS_H_
#define DTRAIN_WORKER_MODELS_LAYERS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/models/model.h"

namespace dtrain::models {

// Spatial geometry of one example (NHWC without the N).
struct Geometry {
  int h = 0, w = 0, c = 0;
  int64_t size() const { return static_cast<int64_t>(h) * w * c; }
};

struct LayerSpec {
  enum class Kind { kConv, kDense, kRelu, kMaxPool, kLrn, kDropout };
  Kind kind = Kind::kRelu;
  std::string name;  // kConv/kDense: prefix of the variables ("conv1" -> "conv1/weights", "conv1/biases")
  int out = 0;       // kConv: output channels; kDense: output units
  int kernel = 0;    // kConv: square filter size; kMaxPool: square window
  int stride = 1;    // kConv, kMaxPool
  kernels::Padding padding = kernels::Padding::kSame;  // kConv, kMaxPool
  Initializer weights_init, biases_init;               // kConv, kDense
  float weight_decay = 0.0f;                           // kConv, kDense: L2 coefficient on the weights
  kernels::LrnParams lrn;                              // kLrn: depth_radius, bias, alpha, beta
  float keep_prob = 1.0f;                              // kDropout

  static LayerSpec Conv(std::string name, int kernel, int out, kernels::Padding padding, Initializer w,
                        Initializer b, float weight_decay = 0.0f);
  // Flattens its input (NHWC order, as tf.reshape does) and applies x w + b.
  static LayerSpec Dense(std::string name, int out, Initializer w, Initializer b, float weight_decay = 0.0f);
  static LayerSpec Relu();
  static LayerSpec MaxPool(int window, int stride, kernels::Padding padding);
  static LayerSpec Lrn(int depth_radius, float bias, float alpha, float beta);
  static LayerSpec Dropout(float keep_prob);
};

Initializer TruncatedNormal(float stddev);
Initializer Constant(float value);

// Output geometry of every layer (element i is layer i's output) for an input geometry, or InvalidArgument
// naming the model and the first layer whose output would be empty (input too small) or whose spec is bad.
absl::StatusOr<std::vector<Geometry>> InferShapes(const std::string& model, const std::vector<LayerSpec>& layers,
                                                  Geometry input);

// The variables of a layer list, in flat-buffer order: for each kConv/kDense layer, "<name>/weights" (HWIO or
// [in, out]) then "<name>/biases".
absl::StatusOr<std::vector<VariableInfo>> VariablesOf(const std::string& model,
                                                      const std::vector<LayerSpec>& layers, Geometry input);

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_LAYERS_H_
