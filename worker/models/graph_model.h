// GraphModel: the Model implementation shared by every architecture, built-in or imported. It owns the flat
// parameter and gradient buffers on the device, a training GraphNetwork for options.batch_size, and (when
// eval_batch_size differs) a forward-only one for evaluation, and the loss head (softmax or sigmoid
// cross-entropy, plus the weight-decay terms). Nothing is allocated per step.
//
// Thread-safety: one thread at a time (a tower), like its Device.
#ifndef DTRAIN_WORKER_MODELS_GRAPH_MODEL_H_
#define DTRAIN_WORKER_MODELS_GRAPH_MODEL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/models/graph.h"
#include "worker/models/graph_network.h"
#include "worker/models/model.h"

namespace dtrain::models {

class GraphModel : public Model {
 public:
  // `device` must outlive the model. InvalidArgument for bad options (sizes, a batch geometry that is not the
  // graph's input, a class count its output does not give); device errors (out of memory) as the device reports.
  static absl::StatusOr<std::unique_ptr<Model>> Create(Graph graph, const ModelOptions& options,
                                                       kernels::Device* device);
  ~GraphModel() override;

  const std::string& name() const override { return name_; }
  const std::vector<VariableInfo>& variables() const override { return vars_; }
  const Graph& graph() const override { return graph_; }
  absl::Status SetParameters(const float* host_params) override;
  absl::StatusOr<float> TrainStep(const HostBatch& batch, int64_t step, float* host_grads) override;
  absl::StatusOr<float> ComputeGradients(const HostBatch& batch, int64_t step,
                                         const StepHooks* hooks = nullptr) override;
  float* device_gradients() override { return grads_; }
  float* device_parameters() override { return params_; }
  float* device_images() override { return train_ ? train_->input() : nullptr; }
  float* device_labels() override { return labels_; }
  const float* device_loss() const override { return loss_; }
  absl::Status CheckTrainingBatch(const HostBatch& batch) const override;
  absl::Status EnqueueGradients(const kernels::DeviceCounter& step, uint64_t counter_stride,
                                uint64_t counter_offset, const EnqueueHooks* hooks = nullptr) override;
  absl::StatusOr<int> CountCorrect(const HostBatch& batch) override;
  absl::Status Predict(const HostBatch& batch, float* logits) override;
  absl::Status SetSparseInputs(const SparseInputs& inputs) override;
  const float* device_sparse_gradients(int table) const override { return row_grads_[table]; }
  kernels::Device* device() override { return device_; }

 private:
  struct Decayed {
    int64_t offset, size;
    float weight_decay;
  };
  GraphModel(std::string name, const ModelOptions& options, kernels::Device* device);
  // Checks a batch's geometry against the model (and its count against `max_count`) and its labels.
  absl::Status CheckBatch(const HostBatch& batch, int min_count, int max_count) const;
  // The two halves of a training step on the batch already in train_->input() / labels_, shared by
  // ComputeGradients and EnqueueGradients: forward + loss (the loss, weight decay included, in loss_), with
  // dropout's counter from `device_step` when given (then * stride + offset), else `step`; then backward,
  // with weight decay added to each layer's gradient before `grads_ready` sees its range.
  using RangeHook = std::function<absl::Status(int64_t begin, int64_t end)>;
  absl::Status EnqueueForwardAndLoss(int64_t step, const kernels::DeviceCounter* device_step, uint64_t stride,
                                     uint64_t offset, const RangeHook& before_forward);
  absl::Status EnqueueBackward(const RangeHook& grads_ready);

  std::string name_;
  ModelOptions options_;
  kernels::Device* device_;
  Graph graph_;
  std::vector<VariableInfo> vars_;
  std::vector<Decayed> decayed_;
  int64_t num_params_ = 0;
  int64_t example_size_ = 0;
  std::vector<float*> owned_;  // device buffers this model allocated (not the ones given in ModelOptions)
  float* params_ = nullptr;
  float* grads_ = nullptr;
  float* labels_ = nullptr;
  float* dlogits_ = nullptr;
  float* loss_ = nullptr;        // device scalar
  float* l2_scratch_ = nullptr;  // device scalar
  std::unique_ptr<GraphNetwork> train_;  // null for a predict-only model
  std::unique_ptr<GraphNetwork> eval_;   // null: evaluation runs on train_ (same batch size)
  std::vector<float> host_logits_;
  // Sparse models: per table the rows bound for this step (device copies, or the caller's host rows on the CPU)
  // and their gradients; per feature the indices (int32 in device buffers, padded to the larger batch) and bag
  // offsets; the bindings of the training and evaluation networks.
  int max_batch_ = 0;
  std::vector<float*> rows_, row_grads_;
  std::vector<int64_t> rows_capacity_, grads_capacity_, num_rows_;
  std::vector<int32_t*> indices_, offsets_;
  std::vector<int> table_of_feature_;  // -1: no embedding node reads it
  std::vector<int64_t> indices_capacity_;
  GraphNetwork::SparseBinding train_binding_, eval_binding_;
  // Grows a device buffer to at least n floats (bound by the model, freed with it).
  absl::StatusOr<float*> Grow(float* old, int64_t* capacity, int64_t n);
};

}  // namespace dtrain::models

#endif  // DTRAIN_WORKER_MODELS_GRAPH_MODEL_H_
