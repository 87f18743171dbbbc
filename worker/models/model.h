// Models: a network built from kernels::Device ops, with all its parameters in one flat float buffer
// (llm.c style). The flat buffer is what travels to and from the parameter servers: variable i occupies
// [offset_i, offset_i + size_i) of it, in the order of Model::variables(). Gradients use the same layout.
//
// Thread-safety: a Model (one tower) is used by one thread at a time.
//
// Example:
//   ASSIGN_OR_RETURN(auto dev, kernels::CreateDevice(kernels::DeviceSpec::Cpu(1)));
//   ASSIGN_OR_RETURN(ModelRef spec, ResolveModel("mlp"));   // worker/models/registry.h
//   ASSIGN_OR_RETURN(auto model, CreateModel(*spec, ModelOptions{.batch_size = 100}, dev.get()));
//   std::vector<float> params = InitialParameters(model->variables(), /*seed=*/1);
//   RETURN_IF_ERROR(model->SetParameters(params.data()));
//   ASSIGN_OR_RETURN(float loss, model->TrainStep(batch, grads.data()));
#ifndef DTRAIN_WORKER_MODELS_MODEL_H_
#define DTRAIN_WORKER_MODELS_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device.h"
#include "worker/data/dataset.h"

namespace dtrain::models {

struct Graph;  // worker/models/graph.h

// How a variable is initialized by the chief.
struct Initializer {
  enum class Kind { kTruncatedNormal, kConstant, kValues };
  Kind kind = Kind::kConstant;
  float stddev = 0.0f;  // kTruncatedNormal: N(0, stddev) resampled beyond 2 stddev (TensorFlow's rule)
  float value = 0.0f;   // kConstant
  // kValues: exactly these (an imported model's initializer, shared by every copy of the variable list).
  std::shared_ptr<const std::vector<float>> values;
};

struct VariableInfo {
  std::string name;            // e.g. "conv1/weights", or an ONNX initializer's name ("fc1.weight")
  std::vector<int64_t> shape;  // logical shape (HWIO / [in, out] for the built-ins; ONNX's own for imports)
  Initializer init;
  float weight_decay = 0.0f;   // L2 coefficient applied in the loss (lambda * l2_loss(w)), 0 = none
  // false: state, not trained (BatchNorm's running statistics): the ps applies its "gradient" as a plain
  // change (value -= gradient, averaged over the aggregated workers in sync mode), whatever the optimizer.
  bool trainable = true;
  int64_t size() const;        // product of shape
};

// Total number of floats in the flat buffer of `vars`, and each variable's offset in it.
int64_t TotalSize(const std::vector<VariableInfo>& vars);
std::vector<int64_t> Offsets(const std::vector<VariableInfo>& vars);

// The chief's initial values for the flat buffer, deterministic in `seed`.
std::vector<float> InitialParameters(const std::vector<VariableInfo>& vars, uint64_t seed);
// The same values written into out[0, TotalSize(vars)) (no temporary copy of a large model's parameters).
void WriteInitialParameters(const std::vector<VariableInfo>& vars, uint64_t seed, float* out);

// A stable fingerprint of a model's variables (names and shapes) and options, so a parameter server can
// refuse a worker built for another model. Example: "mlp/v1/784x500,500,500x10,10/4b1c...".
std::string Signature(const std::string& model_name, const std::vector<VariableInfo>& vars);

// One batch on the host. Images are NHWC floats already preprocessed by the data pipeline; labels are class
// indices stored as floats.
struct HostBatch {
  int batch = 0, height = 0, width = 0, channels = 0;
  // batch * height * width * channels: images (NHWC), or dense features (height = width = 1, channels = their
  // count) for click-through-rate data.
  const float* images = nullptr;
  const float* labels = nullptr;  // batch
  // Sparse features (click-through-rate data; the model's graph has tables): num_sparse per example; the ids of
  // example e, feature f are ids[id_offsets[e * num_sparse + f] .. id_offsets[e * num_sparse + f + 1]).
  int num_sparse = 0;
  const int64_t* ids = nullptr;
  const int32_t* id_offsets = nullptr;  // batch * num_sparse + 1
};

// What a sparse model's embedding nodes read for one batch (worker/batch/sparse_batch.h builds it): per table the rows
// the batch's ids refer to (pulled from the ps tasks; host memory), per sparse feature the row index of each id
// (bags: their offsets).
struct SparseInputs {
  struct Table {
    const float* rows = nullptr;  // num_rows * dim floats
    int64_t num_rows = 0;
  };
  struct Feature {
    const int32_t* indices = nullptr;  // count row indices into its table's rows
    int64_t count = 0;
    const int32_t* offsets = nullptr;  // bag features: batch + 1 offsets into indices (else null)
  };
  int batch = 0;                  // examples the indices are for
  std::vector<Table> tables;      // Graph::tables order
  std::vector<Feature> features;  // Graph::num_sparse_features
};

struct ModelOptions {
  int batch_size = 100;      // examples per step on this tower; ops are specialized for it
  int eval_batch_size = 0;   // 0: same as batch_size. Evaluate() handles any count <= this.
  uint64_t seed = 1;         // dropout RNG seed (combined with the step counter)
  // Input geometry (from the data set): 28x28x1 for MNIST-like data, 24x24x3 for cifar10 (after cropping).
  int height = 28, width = 28, channels = 1;
  int num_classes = 10;
  // Sparse features per example in the data (click-through-rate data; 0 for images).
  int num_sparse = 0;
  // Flat buffers to use instead of allocating (memory of the model's device; on the CPU, host memory), each
  // num_parameters() floats, outliving the model: the parameters (only read by the model, so several models
  // may share one) and the gradients. Null: the model allocates its own. CPU towers pass the worker's flat
  // host buffers here, so parameters arrive from the ps and gradients leave for it without a copy.
  float* params_buffer = nullptr;
  float* grads_buffer = nullptr;
  // A model that only predicts (dtrain_eval): no training network, whose activations and gradients a deep net
  // at an evaluation batch would hold (gigabytes for a transformer at 500 examples); the training calls return
  // FailedPrecondition.
  bool predict_only = false;
};

// Per-layer hooks of a training step, all optional. Ranges [begin, end) are in the flat buffer and cover one
// layer's variables; an error from a hook ends the step with that error.
struct StepHooks {
  // Before a layer reads its parameters in the forward pass (e.g. wait for them to arrive from the ps).
  std::function<absl::Status(int64_t begin, int64_t end)> before_forward;
  // Once the loss of the batch is known, before the backward pass (e.g. refuse a diverged step).
  std::function<absl::Status(float loss)> after_forward;
  // As soon as the gradient of a layer's variables (weight decay included) is final in the gradient buffer,
  // last layer first (e.g. push it while backward goes on).
  std::function<absl::Status(int64_t begin, int64_t end)> gradients_ready;
};

// Per-layer hooks of a step that is only enqueued on the device (Model::EnqueueGradients), all optional. They
// run on the host while the step is being enqueued, before the device has run it; ranges as in StepHooks. An
// error from a hook ends the enqueuing with that error (what was enqueued so far still runs).
struct EnqueueHooks {
  // Before a layer's forward is enqueued (e.g. wait for its parameters to reach the host, then enqueue their
  // upload and make the compute queue wait for it).
  std::function<absl::Status(int64_t begin, int64_t end)> before_forward;
  // Once the loss (device_loss()) is enqueued, before the backward pass (e.g. enqueue its copy to the host).
  std::function<absl::Status()> loss_enqueued;
  // Once the final gradient of a layer's variables (weight decay included) is enqueued, last layer first
  // (e.g. enqueue its average across towers or its copy to the host).
  std::function<absl::Status(int64_t begin, int64_t end)> gradients_enqueued;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const std::string& name() const = 0;
  virtual const std::vector<VariableInfo>& variables() const = 0;
  // The graph the model runs (its tables, its loss).
  virtual const Graph& graph() const = 0;
  int64_t num_parameters() const { return TotalSize(variables()); }

  // Copies the flat parameter buffer (host, num_parameters() floats) to the device.
  virtual absl::Status SetParameters(const float* host_params) = 0;

  // Forward + backward on one batch of exactly options.batch_size examples (dropout on). Writes the flat
  // gradient of the total loss (cross-entropy + weight decay terms) to `host_grads` (num_parameters() floats)
  // and returns the total loss. `step` seeds dropout so runs are reproducible.
  virtual absl::StatusOr<float> TrainStep(const HostBatch& batch, int64_t step, float* host_grads) = 0;

  // Device-side variant: gradients stay in device_gradients() after the call (the grads_buffer when one was
  // given). Calls `hooks` (may be null) as the step goes. Returns the loss.
  virtual absl::StatusOr<float> ComputeGradients(const HostBatch& batch, int64_t step,
                                                 const StepHooks* hooks = nullptr) = 0;
  virtual float* device_gradients() = 0;  // flat gradient buffer on the device (num_parameters() floats)

  // ---- Steps enqueued on the device with nothing copied or synchronized (GPU towers, worker/towers/towers.h) ----
  // The device buffers such a step reads and writes.
  virtual float* device_parameters() = 0;        // num_parameters() floats (the params_buffer when given)
  virtual float* device_images() = 0;            // batch_size * height * width * channels floats
  virtual float* device_labels() = 0;            // batch_size floats (class indices)
  virtual const float* device_loss() const = 0;  // one float: the total loss of the last step enqueued
  // InvalidArgument unless `batch` fits a training step (geometry, exactly batch_size examples, labels that
  // are class indices): the check ComputeGradients makes, for callers that stage batches themselves.
  virtual absl::Status CheckTrainingBatch(const HostBatch& batch) const = 0;
  // Enqueues forward (dropout on, its counter = *step * counter_stride + counter_offset, read when it runs) +
  // loss + backward on the batch in device_images()/device_labels(), leaving the loss in device_loss() and
  // the gradients in device_gradients(). Never allocates nor synchronizes with the host, so a CUDA graph can
  // capture it (with hooks that do neither). The same values as ComputeGradients(batch, that counter).
  virtual absl::Status EnqueueGradients(const kernels::DeviceCounter& step, uint64_t counter_stride,
                                        uint64_t counter_offset, const EnqueueHooks* hooks = nullptr) = 0;

  // Inference (dropout off) on up to eval_batch_size examples; returns how many were classified correctly.
  virtual absl::StatusOr<int> CountCorrect(const HostBatch& batch) = 0;
  // Inference on up to eval_batch_size examples: their logits (batch.batch * outputs floats) into `logits`.
  virtual absl::Status Predict(const HostBatch& batch, float* logits) = 0;

  // ---- sparse models (the graph has tables) ----
  // The rows and indices the next training step or evaluation reads (copied to the device unless it is the
  // CPU, whose towers read the host memory in place: it must then stay unchanged until the step is done).
  // InvalidArgument when they do not fit the graph (table or feature count, an index outside its table's rows).
  virtual absl::Status SetSparseInputs(const SparseInputs& inputs) = 0;
  // After a training step: table t's row gradients (the last SetSparseInputs' num_rows * dim floats, device
  // memory; on the CPU host memory), of the total loss as the flat gradients are.
  virtual const float* device_sparse_gradients(int table) const = 0;

  virtual kernels::Device* device() = 0;
};

// What a model expects beyond its layers: the seeds' training defaults (used when the user does not override
// them), its input pipeline and its default learning-rate schedule. Everything model-specific the training
// loop, the benchmark and the evaluator need comes from here (e.g. cifar10: distorted 24x24 crops of 32x32x3
// images, lr 0.1 decayed by 0.1 every 350 epochs).
struct ModelDefaults {
  std::string optimizer;   // "sgd", "momentum", "adam"
  float learning_rate = 0.01f;
  int batch_size = 100;

  // Input pipeline: the preprocessing of training and evaluation images, and the crop the model takes
  // (0 = the data set's own height/width).
  data::Preprocess train_preprocess = data::Preprocess::kScale01;
  data::Preprocess eval_preprocess = data::Preprocess::kScale01;
  int crop_height = 0, crop_width = 0;
  // The images the model is made for (synthetic data for benchmarks takes this shape).
  int data_height = 28, data_width = 28, data_channels = 1;

  // Default learning-rate schedule, used when the user sets no decay: learning_rate * decay_rate every
  // decay_epochs epochs (floor()ed when staircase), counted in steps of one worker's batch. 0 = constant.
  int decay_epochs = 0;
  float decay_rate = 1.0f;
  bool staircase = false;

  // Models with sparse embedding tables: their optimizer and learning rate on the ps ("" without tables).
  std::string sparse_optimizer;
  float sparse_learning_rate = 0.0f;
  // The data the model reads: images (the fields above) or click-through-rate data (dense + sparse features).
  bool ctr_data = false;
};
// A model, resolved once from --model (a built-in name or an ONNX file: worker/models/registry.h) into the
// value that flows wherever the model matters: the towers build it, the ps checks its signature, evaluation
// and export use it. Nothing downstream looks a model up by its name again.
//
// Thread-safety: immutable once made; shared (std::shared_ptr<const ModelSpec>) by every tower and thread.
struct ModelSpec {
  std::string name;  // "cnn"; an imported model: the file's stem ("resnet20")
  std::string path;  // the ONNX file (empty for a built-in model)
  ModelDefaults defaults;
  // The graph for the options' input geometry and class count: a built-in model adapts to the data set; an
  // imported one checks they match its own input and output (InvalidArgument naming both shapes).
  std::function<absl::StatusOr<Graph>(const ModelOptions&)> build_graph;
  // What identifies the model's structure beyond its variables (for imported graphs, a hash of their nodes),
  // folded into the signature the ps checks.
  std::string structure;
  // What export needs (worker/models/onnx: the file's parsed ModelProto); null for built-ins.
  std::shared_ptr<const void> source;

  bool imported() const { return !path.empty(); }
};
using ModelRef = std::shared_ptr<const ModelSpec>;

// The variables of `spec` for the options (placement, signature) without building any op.
absl::StatusOr<std::vector<VariableInfo>> ModelVariables(const ModelSpec& spec, const ModelOptions& options);
// Builds one tower's model on `device` (which must outlive it). InvalidArgument for bad options (an input the
// graph cannot take, a class count its output does not give); Unimplemented when the device lacks an op.
absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelSpec& spec, const ModelOptions& options,
                                                   kernels::Device* device);
// The signature a ps compares: Signature(name or "onnx:<name>", variables), with the structure folded in.
std::string ModelSignature(const ModelSpec& spec, const std::vector<VariableInfo>& vars);

// Sets o's input geometry for a data set of height x width x channels images: the model's crop if it has one.
void SetInputGeometry(const ModelDefaults& d, int height, int width, int channels, ModelOptions* o);
// decay_steps of the default schedule: max(1, examples_per_epoch / batch_size) * decay_epochs (0 when the
// model has no default decay).
int64_t DefaultDecaySteps(const ModelDefaults& d, int64_t examples_per_epoch, int batch_size);

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_MODEL_H_
