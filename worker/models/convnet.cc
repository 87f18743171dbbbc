// A larger VGG-like convnet (the Keras-style benchmark network of the seeds):
//   conv 5x5x64 VALID, ReLU, max-pool 2 -> conv 3x3x256 VALID, ReLU -> conv 3x3x512 VALID, ReLU, max-pool 2
//   -> dense 2048, ReLU, dropout 0.25 -> dense 1024, ReLU, dropout 0.25 -> dense classes.
// Pools are VALID (Keras' default), so 28x28 goes 24 -> 12 -> 10 -> 8 -> 4 (8192 features) and the smallest
// input is 16x16. He initialization (truncated normal, stddev sqrt(2 / fan_in)), zero biases.
#include <algorithm>
#include <cmath>

#include "worker/models/model_defs.h"

namespace dtrain::models {
namespace {

using kernels::Padding;

constexpr float kKeepProb = 0.75f;  // drop rate 0.25

Initializer He(double fan_in) { return TruncatedNormal(static_cast<float>(std::sqrt(2.0 / fan_in))); }

std::vector<LayerSpec> ConvnetLayers(const ModelOptions& o) {
  // Flattened features after the last pool (0 when the input is too small; InferShapes then reports it).
  const int h = ((o.height - 4) / 2 - 4) / 2, w = ((o.width - 4) / 2 - 4) / 2;
  const double flat = std::max(1, h) * std::max(1, w) * 512.0;
  const Initializer zero = Constant(0.0f);
  return {
      LayerSpec::Conv("conv1", 5, 64, Padding::kValid, He(25.0 * o.channels), zero),
      LayerSpec::Relu(),
      LayerSpec::MaxPool(2, 2, Padding::kValid),
      LayerSpec::Conv("conv2", 3, 256, Padding::kValid, He(9.0 * 64), zero),
      LayerSpec::Relu(),
      LayerSpec::Conv("conv3", 3, 512, Padding::kValid, He(9.0 * 256), zero),
      LayerSpec::Relu(),
      LayerSpec::MaxPool(2, 2, Padding::kValid),
      LayerSpec::Dense("fc1", 2048, He(flat), zero),
      LayerSpec::Relu(),
      LayerSpec::Dropout(kKeepProb),
      LayerSpec::Dense("fc2", 1024, He(2048), zero),
      LayerSpec::Relu(),
      LayerSpec::Dropout(kKeepProb),
      LayerSpec::Dense("fc3", o.num_classes, TruncatedNormal(static_cast<float>(std::sqrt(1.0 / 1024))), zero),
  };
}

}  // namespace

const ModelDef& ConvnetDef() {
  static const ModelDef def{"convnet", &ConvnetLayers, {"adam", 1e-3f, 1024}};
  return def;
}

}  // namespace dtrain::models
