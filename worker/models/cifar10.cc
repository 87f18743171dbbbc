// TensorFlow's CIFAR-10 tutorial network (cifar10.py inference()) on 24x24x3 crops:
//   conv1 5x5x64 SAME, ReLU, max-pool 3x3/2 SAME, LRN -> conv2 5x5x64 SAME, ReLU, LRN, max-pool 3x3/2 SAME
//   -> local3 dense 384, ReLU -> local4 dense 192, ReLU -> softmax_linear.
// Weight decay 0.004 on local3/local4 weights. 1,068,298 parameters for 24x24x3.
#include "worker/models/model_defs.h"

namespace dtrain::models {
namespace {

using kernels::Padding;

constexpr float kWeightDecay = 0.004f;

LayerSpec TutorialLrn() { return LayerSpec::Lrn(/*depth_radius=*/4, /*bias=*/1.0f, 0.001f / 9.0f, 0.75f); }

std::vector<LayerSpec> Cifar10Layers(const ModelOptions& o) {
  return {
      LayerSpec::Conv("conv1", 5, 64, Padding::kSame, TruncatedNormal(5e-2f), Constant(0.0f)),
      LayerSpec::Relu(),
      LayerSpec::MaxPool(3, 2, Padding::kSame),
      TutorialLrn(),
      LayerSpec::Conv("conv2", 5, 64, Padding::kSame, TruncatedNormal(5e-2f), Constant(0.1f)),
      LayerSpec::Relu(),
      TutorialLrn(),
      LayerSpec::MaxPool(3, 2, Padding::kSame),
      LayerSpec::Dense("local3", 384, TruncatedNormal(0.04f), Constant(0.1f), kWeightDecay),
      LayerSpec::Relu(),
      LayerSpec::Dense("local4", 192, TruncatedNormal(0.04f), Constant(0.1f), kWeightDecay),
      LayerSpec::Relu(),
      LayerSpec::Dense("softmax_linear", o.num_classes, TruncatedNormal(1.0f / 192.0f), Constant(0.0f)),
  };
}

}  // namespace

const ModelDef& Cifar10Def() {
  // TF's tutorial: plain SGD from 0.1, decayed by the parameter server's schedule.
  static const ModelDef def{"cifar10", &Cifar10Layers, {"sgd", 0.1f, 128}};
  return def;
}

}  // namespace dtrain::models
