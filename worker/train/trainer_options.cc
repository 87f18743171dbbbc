#include "worker/train/trainer.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps/core/optimizer.h"
#include "worker/models/registry.h"

namespace dtrain::worker {

// The options a run takes from its model and its optimizer flags (trainer.h: ApplyModelDefaults,
// OptimizerConfigOf).
absl::Status ApplyModelDefaults(WorkerOptions* o) {
  if (o->resolved_model == nullptr) {
    models::ResolveOptions ro;
    ro.dlrm = o->dlrm;
    ASSIGN_OR_RETURN(o->resolved_model, models::ResolveModel(o->model, ro));
  }
  if (!o->export_onnx.empty() && !o->resolved_model->imported()) {
    return absl::InvalidArgumentError(absl::StrCat("--export_onnx needs a model imported from ONNX (--model=PATH.onnx); '",
                                                   o->resolved_model->name, "' is built in"));
  }
  const models::ModelDefaults& d = o->resolved_model->defaults;
  if (o->batch_size <= 0) o->batch_size = d.batch_size;
  if (o->optimizer.empty()) o->optimizer = d.optimizer;
  // The learning rate: the one given; else an adaptive optimizer other than the model's takes its framework's
  // default (the model's rate is tuned for the model's optimizer: mlp's 0.1 for sgd does not train rmsprop);
  // else the model's.
  if (o->learning_rate_note.empty()) {
    const ps::FrameworkLearningRate framework = ps::FrameworkDefaultLearningRate(o->optimizer);
    const std::string model = o->resolved_model->name;
    if (o->learning_rate > 0) {
      o->learning_rate_note = absl::StrCat("learning rate ", o->learning_rate, " (--learning_rate)");
    } else if (o->optimizer != d.optimizer && framework.rate > 0) {
      o->learning_rate = framework.rate;
      o->learning_rate_note = absl::StrCat("learning rate ", o->learning_rate, ": --optimizer=", o->optimizer,
                                           "'s default (as ", framework.source, "), not the model ", model, "'s ",
                                           d.learning_rate, " (for its ", d.optimizer,
                                           "); --learning_rate sets another");
    } else {
      o->learning_rate = d.learning_rate;
      o->learning_rate_note = absl::StrCat("learning rate ", o->learning_rate, ": the model ", model,
                                           "'s default (for ", d.optimizer, "); --learning_rate sets another");
    }
  }
  if (o->sparse_optimizer.empty()) o->sparse_optimizer = d.sparse_optimizer.empty() ? "adagrad" : d.sparse_optimizer;
  if (o->sparse_learning_rate <= 0) {
    o->sparse_learning_rate = d.sparse_learning_rate > 0 ? d.sparse_learning_rate : o->learning_rate;
  }
  if (o->mode != "sync" && o->mode != "async") {
    return absl::InvalidArgumentError(absl::StrCat("--mode must be sync or async, got '", o->mode, "'"));
  }
  if (o->train_steps < 0 || (o->train_steps == 0 && !o->follow)) {
    return absl::InvalidArgumentError("--train_steps must be > 0 (0, no end, only with --follow)");
  }
  if (o->log_every <= 0) return absl::InvalidArgumentError("--log_every must be > 0");
  return absl::OkStatus();
}

absl::StatusOr<ps::OptimizerConfig> OptimizerConfigOf(const WorkerOptions& o) {
  ASSIGN_OR_RETURN(ps::OptimizerConfig c, ps::DefaultOptimizerConfig(o.optimizer));
  c.learning_rate = o.learning_rate;
  if (o.momentum) c.momentum = *o.momentum;
  if (o.beta1) c.beta1 = *o.beta1;
  if (o.beta2) c.beta2 = *o.beta2;
  if (o.epsilon) c.epsilon = *o.epsilon;
  if (o.weight_decay) c.weight_decay = *o.weight_decay;
  if (o.rho) c.rho = *o.rho;
  if (o.initial_accumulator) c.initial_accumulator = *o.initial_accumulator;
  c.nesterov = o.nesterov;
  c.centered = o.centered;
  c.clip_norm = o.clip_norm;
  c.decay_steps = o.decay_steps;
  c.decay_rate = o.decay_rate;
  c.staircase = o.staircase;
  c.min_learning_rate = o.min_learning_rate;
  c.warmup_steps = o.warmup_steps;
  // Without warmup steps the factor means nothing: 0 then, so that the workers' configs agree whatever factor
  // each was given (ps::CompareTrainConfigs), and a run without warmup registers the config it did before 1/3.
  c.warmup_start_factor = o.warmup_steps > 0 ? o.warmup_start_factor : 0.0f;
  if (o.lr_schedule == "exponential") {
    c.lr_schedule = "exponential";
  } else if (o.lr_schedule == "step") {
    if (o.decay_steps <= 0) {
      return absl::InvalidArgumentError("--lr_schedule=step needs --decay_steps > 0 (the step size)");
    }
    c.lr_schedule = "exponential";
    c.staircase = true;
  } else if (o.lr_schedule == "cosine") {
    c.lr_schedule = "cosine";
    if (c.decay_steps == 0) c.decay_steps = std::max<int64_t>(1, o.train_steps - o.warmup_steps);
  } else if (o.lr_schedule == "constant") {
    c.lr_schedule = "exponential";
    c.decay_steps = 0;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--lr_schedule must be exponential, step, cosine or constant, got '",
                                                   o.lr_schedule, "'"));
  }
  if (absl::Status s = ps::ToOptimizerParams(c).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--optimizer=", o.optimizer, ": ", s.message()));
  }
  return c;
}

}  // namespace dtrain::worker
