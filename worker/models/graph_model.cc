#include "worker/models/graph_model.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dtrain::models {

GraphModel::GraphModel(std::string name, const ModelOptions& options, kernels::Device* device)
    : name_(std::move(name)), options_(options), device_(device) {}

GraphModel::~GraphModel() {
  // The networks hold views into params_/grads_: release them first.
  train_.reset();
  eval_.reset();
  for (float* p : owned_) device_->Free(p);
}

absl::StatusOr<std::unique_ptr<Model>> GraphModel::Create(Graph graph, const ModelOptions& options,
                                                          kernels::Device* device) {
  const std::string name = graph.name;
  if (device == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, ": no device"));
  if (options.batch_size < 1 || options.eval_batch_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": batch_size (", options.batch_size,
                                                   ") must be positive and eval_batch_size (",
                                                   options.eval_batch_size, ") non-negative"));
  }
  if (graph.loss == Loss::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": a graph without a loss head cannot be trained"));
  }
  const TensorShape& in = graph.input_shape();
  if (!(in.is_image() && in.dims[0] == options.channels && in.dims[1] == options.height &&
        in.dims[2] == options.width)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the model takes ", in.ToString(),
                                                   " (C x H x W) inputs but the options give ", options.channels,
                                                   "x", options.height, "x", options.width));
  }
  const int classes = graph.loss == Loss::kSoftmaxCrossEntropy ? static_cast<int>(graph.output_shape().size()) : 2;
  if (classes != options.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the model's output has ", graph.output_shape().size(),
                                                   " logits but the data set has ", options.num_classes,
                                                   " classes"));
  }
  const int64_t example_size = in.size();
  std::unique_ptr<GraphModel> m(new GraphModel(name, options, device));
  if (m->options_.eval_batch_size == 0) m->options_.eval_batch_size = options.batch_size;
  m->graph_ = std::move(graph);
  m->vars_ = m->graph_.variables;
  m->num_params_ = TotalSize(m->vars_);
  m->example_size_ = example_size;
  const std::vector<int64_t> offsets = Offsets(m->vars_);
  for (size_t i = 0; i < m->vars_.size(); ++i) {
    if (m->vars_[i].weight_decay > 0.0f && m->vars_[i].trainable) {
      m->decayed_.push_back({offsets[i], m->vars_[i].size(), m->vars_[i].weight_decay});
    }
  }

  auto alloc = [&](int64_t n) -> absl::StatusOr<float*> {
    ASSIGN_OR_RETURN(float* p, device->Alloc(n));
    m->owned_.push_back(p);
    return p;
  };
  const int batch = options.batch_size;
  const int64_t logits = m->graph_.output_shape().size();
  if (options.params_buffer != nullptr) {
    m->params_ = options.params_buffer;
  } else {
    ASSIGN_OR_RETURN(m->params_, alloc(m->num_params_));
    RETURN_IF_ERROR(device->Fill(0.0f, m->params_, m->num_params_));
  }
  if (options.grads_buffer != nullptr) {
    m->grads_ = options.grads_buffer;
  } else {
    ASSIGN_OR_RETURN(m->grads_, alloc(m->num_params_));
    RETURN_IF_ERROR(device->Fill(0.0f, m->grads_, m->num_params_));
  }
  ASSIGN_OR_RETURN(m->labels_, alloc(batch));
  ASSIGN_OR_RETURN(m->dlogits_, alloc(static_cast<int64_t>(batch) * logits));
  ASSIGN_OR_RETURN(m->loss_, alloc(1));
  ASSIGN_OR_RETURN(m->l2_scratch_, alloc(1));

  ASSIGN_OR_RETURN(m->train_, GraphNetwork::Create(device, m->graph_, batch, /*with_backward=*/true, m->params_,
                                                   m->grads_));
  if (m->options_.eval_batch_size != batch) {
    ASSIGN_OR_RETURN(m->eval_, GraphNetwork::Create(device, m->graph_, m->options_.eval_batch_size,
                                                    /*with_backward=*/false, m->params_, nullptr));
  }
  m->host_logits_.resize(static_cast<size_t>(m->options_.eval_batch_size) * logits);
  return std::unique_ptr<Model>(std::move(m));
}

absl::Status GraphModel::SetParameters(const float* host_params) {
  if (host_params == nullptr) return absl::InvalidArgumentError(absl::StrCat(name_, ": SetParameters(nullptr)"));
  if (host_params == params_) return absl::OkStatus();  // the model reads the caller's buffer directly
  return device_->CopyToDevice(host_params, params_, num_params_);
}

absl::Status GraphModel::CheckBatch(const HostBatch& batch, int min_count, int max_count) const {
  if (batch.height != options_.height || batch.width != options_.width || batch.channels != options_.channels) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": batch images are ", batch.height, "x", batch.width, "x",
                                                   batch.channels, " but the model was built for ", options_.height,
                                                   "x", options_.width, "x", options_.channels));
  }
  if (batch.batch < min_count || batch.batch > max_count) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": batch of ", batch.batch, " examples, expected ",
                                                   min_count == max_count ? "exactly " : "at most ", max_count));
  }
  if (batch.batch > 0 && (batch.images == nullptr || batch.labels == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": batch without images or labels"));
  }
  for (int i = 0; i < batch.batch; ++i) {
    const float l = batch.labels[i];
    if (!(l >= 0.0f && l < static_cast<float>(options_.num_classes)) || l != std::floor(l)) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": label ", l, " of example ", i,
                                                     " is not a class index in [0, ", options_.num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status GraphModel::CheckTrainingBatch(const HostBatch& batch) const {
  return CheckBatch(batch, options_.batch_size, options_.batch_size);
}

absl::Status GraphModel::EnqueueForwardAndLoss(int64_t step, const kernels::DeviceCounter* device_step,
                                                    uint64_t stride, uint64_t offset,
                                                    const RangeHook& before_forward) {
  GraphNetwork::NodeHook before_layer = [&](int layer) {
    const auto [begin, end] = train_->variable_range(layer);
    return before_forward(begin, end);
  };
  const GraphNetwork::NodeHook* hook = before_forward ? &before_layer : nullptr;
  if (device_step != nullptr) {
    RETURN_IF_ERROR(
        train_->ForwardDeviceCounter(/*training=*/true, options_.seed, *device_step, stride, offset, hook));
  } else {
    RETURN_IF_ERROR(train_->Forward(/*training=*/true, options_.seed, step, hook));
  }
  if (graph_.loss == Loss::kSigmoidCrossEntropy) {
    RETURN_IF_ERROR(device_->SigmoidCrossEntropy(train_->output(), labels_, options_.batch_size, dlogits_, loss_));
  } else {
    RETURN_IF_ERROR(device_->SoftmaxCrossEntropy(train_->output(), labels_, options_.batch_size,
                                                 options_.num_classes, dlogits_, loss_));
  }
  for (const Decayed& d : decayed_) {
    RETURN_IF_ERROR(device_->L2Loss(params_ + d.offset, d.size, l2_scratch_));
    RETURN_IF_ERROR(device_->Axpy(d.weight_decay, l2_scratch_, loss_, 1));
  }
  return absl::OkStatus();
}

absl::Status GraphModel::EnqueueBackward(const RangeHook& grads_ready) {
  // As soon as a layer's variable gradients are written: d(wd * l2_loss(w))/dw = wd * w is added to them (the
  // backward pass overwrote the buffer), then they are final.
  GraphNetwork::NodeHook layer_ready = [&](int layer) -> absl::Status {
    const auto [begin, end] = train_->variable_range(layer);
    for (const Decayed& d : decayed_) {
      if (d.offset >= begin && d.offset + d.size <= end) {
        RETURN_IF_ERROR(device_->Axpy(d.weight_decay, params_ + d.offset, grads_ + d.offset, d.size));
      }
    }
    return grads_ready ? grads_ready(begin, end) : absl::OkStatus();
  };
  return train_->Backward(dlogits_, &layer_ready);
}

absl::StatusOr<float> GraphModel::ComputeGradients(const HostBatch& batch, int64_t step,
                                                        const StepHooks* hooks) {
  const int n = options_.batch_size;
  RETURN_IF_ERROR(CheckBatch(batch, n, n));
  RETURN_IF_ERROR(device_->CopyToDevice(batch.images, train_->input(), n * example_size_));
  RETURN_IF_ERROR(device_->CopyToDevice(batch.labels, labels_, n));
  RETURN_IF_ERROR(
      EnqueueForwardAndLoss(step, nullptr, 0, 0, hooks != nullptr ? hooks->before_forward : nullptr));
  float loss = 0.0f;
  bool have_loss = false;
  if (hooks != nullptr && hooks->after_forward) {
    RETURN_IF_ERROR(device_->CopyToHost(loss_, &loss, 1));
    have_loss = true;
    RETURN_IF_ERROR(hooks->after_forward(loss));
  }
  RETURN_IF_ERROR(EnqueueBackward(hooks != nullptr ? hooks->gradients_ready : nullptr));
  if (!have_loss) RETURN_IF_ERROR(device_->CopyToHost(loss_, &loss, 1));
  return loss;
}

absl::Status GraphModel::EnqueueGradients(const kernels::DeviceCounter& step, uint64_t counter_stride,
                                               uint64_t counter_offset, const EnqueueHooks* hooks) {
  if (step.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": EnqueueGradients with another device's counter"));
  }
  RETURN_IF_ERROR(EnqueueForwardAndLoss(0, &step, counter_stride, counter_offset,
                                        hooks != nullptr ? hooks->before_forward : nullptr));
  if (hooks != nullptr && hooks->loss_enqueued) RETURN_IF_ERROR(hooks->loss_enqueued());
  return EnqueueBackward(hooks != nullptr ? hooks->gradients_enqueued : nullptr);
}

absl::StatusOr<float> GraphModel::TrainStep(const HostBatch& batch, int64_t step, float* host_grads) {
  if (host_grads == nullptr) return absl::InvalidArgumentError(absl::StrCat(name_, ": TrainStep without grads"));
  ASSIGN_OR_RETURN(float loss, ComputeGradients(batch, step));
  if (host_grads != grads_) RETURN_IF_ERROR(device_->CopyToHost(grads_, host_grads, num_params_));
  return loss;
}

absl::StatusOr<int> GraphModel::CountCorrect(const HostBatch& batch) {
  RETURN_IF_ERROR(CheckBatch(batch, 0, options_.eval_batch_size));
  const int n = batch.batch, classes = options_.num_classes;
  if (n == 0) return 0;
  // Examples past n keep stale inputs; every op is per-example, so their logits are simply ignored.
  GraphNetwork* net = eval_ ? eval_.get() : train_.get();
  RETURN_IF_ERROR(device_->CopyToDevice(batch.images, net->input(), n * example_size_));
  RETURN_IF_ERROR(net->Forward(/*training=*/false, options_.seed, 0));
  const int64_t logits = graph_.output_shape().size();
  RETURN_IF_ERROR(device_->CopyToHost(net->output(), host_logits_.data(), static_cast<int64_t>(n) * logits));
  int correct = 0;
  if (graph_.loss == Loss::kSigmoidCrossEntropy) {
    for (int i = 0; i < n; ++i) correct += (host_logits_[i] > 0.0f) == (batch.labels[i] > 0.5f);
    return correct;
  }
  for (int i = 0; i < n; ++i) {
    const float* row = host_logits_.data() + static_cast<size_t>(i) * classes;
    int best = 0;
    for (int c = 1; c < classes; ++c) {
      if (row[c] > row[best]) best = c;
    }
    if (best == static_cast<int>(batch.labels[i])) ++correct;
  }
  return correct;
}

}  // namespace dtrain::models
