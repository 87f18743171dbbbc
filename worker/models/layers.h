// A small toolkit for the sequential networks behind every model: a declarative layer list (LayerSpec), its
// shape inference and variables, and `Network`, one instantiation of a layer list for a fixed batch size on a
// Device (ops made once, activations allocated once, parameters and gradients viewed in the flat buffers).
//
// Thread-safety: a Network is used by one thread at a time (like the Device it runs on).
//
// Example:
//   std::vector<LayerSpec> layers = {LayerSpec::Dense("fc1", 500, w, b), LayerSpec::Relu(), ...};
//   ASSIGN_OR_RETURN(auto vars, VariablesOf("mlp", layers, {28, 28, 1}));
//   ASSIGN_OR_RETURN(auto net, Network::Create(dev, layers, {28, 28, 1}, /*batch=*/100, /*with_backward=*/true,
//                                              params, grads));
//   RETURN_IF_ERROR(net->Forward(/*training=*/true, seed, step));  // reads net->input(), writes net->output()
//   RETURN_IF_ERROR(net->Backward(dlogits));                        // writes grads (overwrites)
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

// One layer list instantiated for `batch` examples on a device.
class Network {
 public:
  // `params` and `grads` are flat device buffers laid out as VariablesOf(layers); `grads` may be null when
  // !with_backward. Both must outlive the Network, as must `device`.
  static absl::StatusOr<std::unique_ptr<Network>> Create(kernels::Device* device, const std::vector<LayerSpec>& layers,
                                                         Geometry input, int batch, bool with_backward,
                                                         const float* params, float* grads);
  ~Network();
  Network(const Network&) = delete;
  Network& operator=(const Network&) = delete;

  int batch() const { return batch_; }
  float* input() { return input_; }             // batch * input geometry floats
  const float* output() const { return output_; }  // batch * classes floats (logits) after Forward
  int64_t output_size_per_example() const { return output_per_example_; }

  int num_layers() const;
  // Where layer i's variables lie in the flat buffer: [begin, end), empty for a layer without variables.
  std::pair<int64_t, int64_t> variable_range(int i) const;

  // Called with a layer's index; an error ends the pass with that error.
  using LayerHook = std::function<absl::Status(int layer)>;
  // Runs every layer on input(). Dropout is applied only when `training` (mask keyed by seed, step).
  // `before_layer` (may be null) runs before each layer that has variables.
  absl::Status Forward(bool training, uint64_t seed, int64_t step, const LayerHook* before_layer = nullptr);
  // Forward with dropout's counter read from device memory when each dropout layer runs:
  //   counter = *step * counter_stride + counter_offset   (kernels::Device::DropoutDeviceCounter)
  // the same masks as Forward(training, seed, that counter). A captured forward replayed after
  // step.Increment() draws new masks. `step` must be a counter of this network's device.
  absl::Status ForwardDeviceCounter(bool training, uint64_t seed, const kernels::DeviceCounter& step,
                                    uint64_t counter_stride, uint64_t counter_offset,
                                    const LayerHook* before_layer = nullptr);
  // Backpropagates `doutput` (batch * output floats, may be overwritten) through the last training Forward,
  // overwriting every variable's slice of the gradient buffer. Needs with_backward. `grads_ready` (may be
  // null) runs as soon as a layer's variable gradients are written, before its input gradient is computed.
  absl::Status Backward(float* doutput, const LayerHook* grads_ready = nullptr);

 private:
  struct Layer;
  Network(kernels::Device* device, int batch);
  absl::StatusOr<float*> Alloc(int64_t n);
  // Forward's body: dropout counter `step`, or read from `device_step` (then * stride + offset) when not
  // null.
  absl::Status ForwardImpl(bool training, uint64_t seed, int64_t step,
                           const kernels::DeviceCounter* device_step, uint64_t counter_stride,
                           uint64_t counter_offset, const LayerHook* before_layer);

  kernels::Device* device_;
  int batch_;
  bool with_backward_ = false;
  std::vector<Layer> layers_;
  std::vector<float*> owned_;  // device buffers to free
  float* input_ = nullptr;
  float* output_ = nullptr;
  int64_t output_per_example_ = 0;
  float* grad_buffers_[2] = {nullptr, nullptr};  // ping-pong activation gradients
};

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_LAYERS_H_
