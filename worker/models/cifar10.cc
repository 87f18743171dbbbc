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

ModelDefaults Cifar10Defaults() {
  ModelDefaults d{"sgd", 0.1f, 128};  // TF's tutorial: plain SGD from 0.1 ...
  // ... on distorted 24x24 crops of the 32x32x3 images (central crops for evaluation) ...
  d.train_preprocess = data::Preprocess::kCifarTrain;
  d.eval_preprocess = data::Preprocess::kCifarEval;
  d.crop_height = d.crop_width = 24;
  d.data_height = d.data_width = 32;
  d.data_channels = 3;
  // ... decayed by 0.1 every 350 epochs, staircase (NUM_EPOCHS_PER_DECAY, LEARNING_RATE_DECAY_FACTOR).
  d.decay_epochs = 350;
  d.decay_rate = 0.1f;
  d.staircase = true;
  return d;
}

}  // namespace

const ModelDef& Cifar10Def() {
  static const ModelDef def{"cifar10", &Cifar10Layers, Cifar10Defaults()};
  return def;
}

}  // namespace dtrain::models
