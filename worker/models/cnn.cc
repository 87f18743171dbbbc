// TensorFlow's "Deep MNIST for experts" network: two 5x5 SAME convolutions (32, 64 channels), each followed by
// ReLU and 2x2 max-pooling, a 1024-unit fully connected layer, dropout (keep 0.5), and the logits layer.
// All weights truncated normal stddev 0.1, all biases 0.1. 3,274,634 parameters for 28x28x1.
#include "worker/models/model_defs.h"

namespace dtrain::models {
namespace {

using kernels::Padding;

std::vector<LayerSpec> CnnLayers(const ModelOptions& o) {
  const Initializer w = TruncatedNormal(0.1f), b = Constant(0.1f);
  return {
      LayerSpec::Conv("conv1", 5, 32, Padding::kSame, w, b),
      LayerSpec::Relu(),
      LayerSpec::MaxPool(2, 2, Padding::kSame),
      LayerSpec::Conv("conv2", 5, 64, Padding::kSame, w, b),
      LayerSpec::Relu(),
      LayerSpec::MaxPool(2, 2, Padding::kSame),
      LayerSpec::Dense("fc1", 1024, w, b),
      LayerSpec::Relu(),
      LayerSpec::Dropout(0.5f),
      LayerSpec::Dense("fc2", o.num_classes, w, b),
  };
}

}  // namespace

const ModelDef& CnnDef() {
  static const ModelDef def{"cnn", &CnnLayers, {"adam", 1e-4f, 50}};
  return def;
}

}  // namespace dtrain::models
