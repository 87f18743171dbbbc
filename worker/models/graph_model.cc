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
  const bool fits = in.is_image() ? in.dims[0] == options.channels && in.dims[1] == options.height &&
                                        in.dims[2] == options.width
                                  : in.size() == int64_t{options.channels} * options.height * options.width;
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the model takes ", in.ToString(),
                                                   in.is_image() ? " (C x H x W)" : " (features)",
                                                   " inputs but the data gives ", options.channels, "x",
                                                   options.height, "x", options.width));
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

  if (!options.predict_only) {
    ASSIGN_OR_RETURN(m->train_, GraphNetwork::Create(device, m->graph_, batch, /*with_backward=*/true, m->params_,
                                                     m->grads_));
  }
  if (m->options_.eval_batch_size != batch || options.predict_only) {
    ASSIGN_OR_RETURN(m->eval_, GraphNetwork::Create(device, m->graph_, m->options_.eval_batch_size,
                                                    /*with_backward=*/false, m->params_, nullptr));
  }
  m->host_logits_.resize(static_cast<size_t>(m->options_.eval_batch_size) * logits);
  // Sparse inputs: buffers grow with the batches (SetSparseInputs); the networks read the bindings.
  const size_t tables = m->graph_.tables.size(), features = m->graph_.num_sparse_features;
  m->max_batch_ = std::max(batch, m->options_.eval_batch_size);
  m->rows_.assign(tables, nullptr);
  m->row_grads_.assign(tables, nullptr);
  m->rows_capacity_.assign(tables, 0);
  m->grads_capacity_.assign(tables, 0);
  m->num_rows_.assign(tables, 0);
  m->indices_.assign(features, nullptr);
  m->table_of_feature_ = m->graph_.table_of_feature();
  m->offsets_.assign(features, nullptr);
  m->indices_capacity_.assign(features, 0);
  for (size_t f = 0; f < features; ++f) {
    ASSIGN_OR_RETURN(float* off, alloc(m->max_batch_ + 1));
    m->offsets_[f] = reinterpret_cast<int32_t*>(off);
  }
  if (tables > 0) {
    if (m->train_) m->train_->BindSparse(&m->train_binding_);
    if (m->eval_) m->eval_->BindSparse(&m->eval_binding_);
  }
  return std::unique_ptr<Model>(std::move(m));
}

absl::Status GraphModel::SetParameters(const float* host_params) {
  if (host_params == nullptr) return absl::InvalidArgumentError(absl::StrCat(name_, ": SetParameters(nullptr)"));
  if (host_params == params_) return absl::OkStatus();  // the model reads the caller's buffer directly
  return device_->CopyToDevice(host_params, params_, num_params_);
}

absl::Status GraphModel::CheckBatch(const HostBatch& batch, int min_count, int max_count) const {
  if (graph_.num_sparse_features > 0 &&
      (batch.num_sparse != graph_.num_sparse_features || (batch.batch > 0 && (batch.ids == nullptr || batch.id_offsets == nullptr)))) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": the model reads ", graph_.num_sparse_features,
                                                   " sparse features per example, the batch has ", batch.num_sparse));
  }
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
  if (!train_) return absl::FailedPreconditionError(absl::StrCat(name_, ": a predict-only model does not train"));
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
  // The embedding nodes add their rows' gradients: start from zero.
  for (size_t t = 0; t < graph_.tables.size(); ++t) {
    if (row_grads_[t] == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(name_, ": a step without sparse inputs (SetSparseInputs)"));
    }
    RETURN_IF_ERROR(device_->Fill(0.0f, row_grads_[t], std::max<int64_t>(num_rows_[t], 1) * graph_.tables[t].dim));
  }
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
  if (!train_) return absl::FailedPreconditionError(absl::StrCat(name_, ": a predict-only model does not train"));
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

absl::Status GraphModel::Predict(const HostBatch& batch, float* logits) {
  RETURN_IF_ERROR(CheckBatch(batch, 0, options_.eval_batch_size));
  const int n = batch.batch;
  if (n == 0) return absl::OkStatus();
  // Examples past n keep stale inputs (sparse ones padded with row 0); every op is per example (BatchNorm uses
  // its running statistics here), so their logits are simply ignored.
  GraphNetwork* net = eval_ ? eval_.get() : train_.get();
  RETURN_IF_ERROR(device_->CopyToDevice(batch.images, net->input(), n * example_size_));
  RETURN_IF_ERROR(net->Forward(/*training=*/false, options_.seed, 0));
  return device_->CopyToHost(net->output(), logits, static_cast<int64_t>(n) * graph_.output_shape().size());
}

absl::StatusOr<float*> GraphModel::Grow(float* old, int64_t* capacity, int64_t n) {
  if (old != nullptr && n <= *capacity) return old;
  const int64_t want = std::max<int64_t>(n + n / 4, 64);
  ASSIGN_OR_RETURN(float* p, device_->Alloc(want));
  if (old != nullptr) {
    owned_.erase(std::find(owned_.begin(), owned_.end(), old));
    device_->Free(old);
  }
  owned_.push_back(p);
  *capacity = want;
  return p;
}

absl::Status GraphModel::SetSparseInputs(const SparseInputs& in) {
  const int tables = static_cast<int>(graph_.tables.size());
  const int features = graph_.num_sparse_features;
  if (static_cast<int>(in.tables.size()) != tables || static_cast<int>(in.features.size()) != features) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": sparse inputs for ", in.tables.size(), " tables and ",
                                                   in.features.size(), " features; the model has ", tables, " and ",
                                                   features));
  }
  if (in.batch < 0 || in.batch > max_batch_) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": sparse inputs for ", in.batch, " examples"));
  }
  const bool cpu = device_->spec().kind == kernels::DeviceSpec::Kind::kCpu;
  for (int t = 0; t < tables; ++t) {
    const int64_t n = in.tables[t].num_rows, dim = graph_.tables[t].dim;
    if (n < 0 || (n > 0 && in.tables[t].rows == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": table ", graph_.tables[t].name, " without rows"));
    }
    ASSIGN_OR_RETURN(row_grads_[t], Grow(row_grads_[t], &grads_capacity_[t], std::max<int64_t>(n, 1) * dim));
    if (cpu) {
      rows_[t] = const_cast<float*>(in.tables[t].rows);  // read in place (never written)
    } else {
      ASSIGN_OR_RETURN(rows_[t], Grow(rows_[t], &rows_capacity_[t], std::max<int64_t>(n, 1) * dim));
      if (n > 0) RETURN_IF_ERROR(device_->CopyToDevice(in.tables[t].rows, rows_[t], n * dim));
    }
    num_rows_[t] = n;
  }
  train_binding_ = {};
  for (int t = 0; t < tables; ++t) {
    train_binding_.rows.push_back(rows_[t]);
    train_binding_.num_rows.push_back(num_rows_[t]);
    train_binding_.row_grads.push_back(row_grads_[t]);
  }
  eval_binding_ = train_binding_;
  std::vector<int32_t> staged;
  for (int f = 0; f < features; ++f) {
    const SparseInputs::Feature& feature = in.features[f];
    const bool bag = feature.offsets != nullptr;
    const int table = table_of_feature_[f];
    if (table < 0) {
      // A feature no embedding reads (an imported model may look up only some columns of its ids).
      for (GraphNetwork::SparseBinding* b : {&train_binding_, &eval_binding_}) {
        b->indices.push_back(nullptr);
        b->counts.push_back(0);
        b->offsets.push_back(nullptr);
      }
      continue;
    }
    const int64_t rows = num_rows_[table];
    if (!bag && feature.count != in.batch) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": feature ", f, " has ", feature.count,
                                                     " ids for ", in.batch, " examples"));
    }
    // Indices, padded with row 0 to the larger network batch (one id features), checked on the host so that a
    // bad one is an error now rather than on the device.
    const int64_t padded = bag ? feature.count : max_batch_;
    staged.assign(std::max<int64_t>(padded, 1), 0);
    for (int64_t i = 0; i < feature.count; ++i) {
      const int32_t k = feature.indices[i];
      if (k < 0 || k >= rows) {
        return absl::InvalidArgumentError(absl::StrCat(name_, ": index ", k, " of feature ", f, " is not a row in [0, ",
                                                       rows, ")"));
      }
      staged[i] = k;
    }
    int64_t capacity = indices_capacity_[f];
    ASSIGN_OR_RETURN(float* idx, Grow(reinterpret_cast<float*>(indices_[f]), &capacity, static_cast<int64_t>(staged.size())));
    indices_capacity_[f] = capacity;
    indices_[f] = reinterpret_cast<int32_t*>(idx);
    RETURN_IF_ERROR(device_->CopyToDevice(reinterpret_cast<const float*>(staged.data()), idx,
                                          static_cast<int64_t>(staged.size())));
    if (bag) {
      std::vector<int32_t> offsets(max_batch_ + 1, static_cast<int32_t>(feature.count));
      for (int e = 0; e <= in.batch; ++e) offsets[e] = feature.offsets[e];
      RETURN_IF_ERROR(device_->CopyToDevice(reinterpret_cast<const float*>(offsets.data()),
                                            reinterpret_cast<float*>(offsets_[f]), max_batch_ + 1));
    }
    for (GraphNetwork::SparseBinding* b : {&train_binding_, &eval_binding_}) {
      const int net_batch = b == &train_binding_ ? options_.batch_size : options_.eval_batch_size;
      b->indices.push_back(indices_[f]);
      b->counts.push_back(bag ? feature.count : net_batch);
      b->offsets.push_back(bag ? offsets_[f] : nullptr);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> GraphModel::CountCorrect(const HostBatch& batch) {
  const int n = batch.batch, classes = options_.num_classes;
  RETURN_IF_ERROR(Predict(batch, host_logits_.data()));
  if (n == 0) return 0;
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
