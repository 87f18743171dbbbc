#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/optimizer_ops.h"

namespace dtrain::kernels {
namespace {

absl::Status CheckOpen01(const char* field, float value) {
  if (!(value > 0.0f && value < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", field, " must be in (0, 1), got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(const char* field, float value) {
  if (!(std::isfinite(value) && value >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer ", field, " must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

}  // namespace

const char* OptimizerNames() {
  return "sgd, momentum, adam, pytorch_adam, adamw, adagrad, pytorch_adagrad, rmsprop or pytorch_rmsprop";
}

absl::Status SetOptimizerFromName(const std::string& name, OptimizerParams* p) {
  using Kind = OptimizerParams::Kind;
  Kind kind;
  if (name == "sgd") {
    kind = Kind::kSgd;
  } else if (name == "momentum") {
    kind = Kind::kMomentum;
  } else if (name == "adam" || name == "pytorch_adam" || name == "adamw") {
    kind = Kind::kAdam;
  } else if (name == "adagrad" || name == "pytorch_adagrad") {
    kind = Kind::kAdagrad;
  } else if (name == "rmsprop" || name == "pytorch_rmsprop") {
    kind = Kind::kRmsProp;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer '", name, "' (expected ", OptimizerNames(), ")"));
  }
  p->kind = kind;
  p->adam_paper_epsilon = name == "pytorch_adam" || name == "adamw";
  p->decoupled_weight_decay = name == "adamw";
  p->torch_rmsprop = name == "pytorch_rmsprop";
  return absl::OkStatus();
}

absl::Status ValidateOptimizerParams(const OptimizerParams& p) {
  using Kind = OptimizerParams::Kind;
  if (!std::isfinite(p.learning_rate) || p.learning_rate < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer learning_rate must be finite and >= 0, got ", p.learning_rate));
  }
  if (p.decay_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer decay_steps must be >= 0, got ", p.decay_steps));
  }
  if (p.schedule == LrSchedule::kExponential && p.decay_steps > 0 &&
      !(std::isfinite(p.decay_rate) && p.decay_rate > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer decay_rate must be finite and > 0, got ", p.decay_rate));
  }
  if (p.schedule == LrSchedule::kCosine && p.decay_steps <= 0) {
    return absl::InvalidArgumentError(
        "the cosine learning-rate schedule needs decay_steps > 0 (the steps it takes to reach min_learning_rate)");
  }
  if (p.schedule != LrSchedule::kExponential && p.schedule != LrSchedule::kCosine) {
    return absl::InvalidArgumentError("unknown learning-rate schedule");
  }
  if (absl::Status s = CheckNonNegative("min_learning_rate", p.min_learning_rate); !s.ok()) return s;
  if (p.warmup_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer warmup_steps must be >= 0, got ", p.warmup_steps));
  }
  if (!(p.warmup_start_factor >= 0.0f && p.warmup_start_factor <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer warmup_start_factor must be in [0, 1], got ", p.warmup_start_factor));
  }
  if (absl::Status s = CheckNonNegative("weight_decay", p.weight_decay); !s.ok()) return s;
  if (absl::Status s = CheckNonNegative("clip_norm", p.clip_norm); !s.ok()) return s;
  if ((p.kind == Kind::kMomentum || p.kind == Kind::kRmsProp) && !(std::isfinite(p.momentum) && p.momentum >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer momentum must be finite and >= 0, got ", p.momentum));
  }
  if (p.nesterov && !(p.kind == Kind::kMomentum && p.momentum > 0.0f)) {
    return absl::InvalidArgumentError("nesterov needs the momentum optimizer with momentum > 0");
  }
  if (p.decoupled_weight_decay && p.kind != Kind::kAdam) {
    return absl::InvalidArgumentError("decoupled weight decay (adamw) is only defined for adam");
  }
  if (p.kind == Kind::kAdam) {
    if (absl::Status s = CheckOpen01("beta1", p.beta1); !s.ok()) return s;
    if (absl::Status s = CheckOpen01("beta2", p.beta2); !s.ok()) return s;
    if (!(std::isfinite(p.epsilon) && p.epsilon > 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer epsilon must be finite and > 0, got ", p.epsilon));
    }
  }
  if (p.kind == Kind::kAdagrad) {
    if (absl::Status s = CheckNonNegative("epsilon", p.epsilon); !s.ok()) return s;
    if (absl::Status s = CheckNonNegative("initial_accumulator", p.initial_accumulator); !s.ok()) return s;
    if (p.epsilon == 0.0f && p.initial_accumulator == 0.0f) {
      return absl::InvalidArgumentError(
          "adagrad needs epsilon > 0 or initial_accumulator > 0 (else a zero gradient divides 0 by 0)");
    }
  }
  if (p.kind == Kind::kRmsProp) {
    if (!(p.rho >= 0.0f && p.rho < 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer rho must be in [0, 1), got ", p.rho));
    }
    if (!(std::isfinite(p.epsilon) && p.epsilon > 0.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer epsilon must be finite and > 0, got ", p.epsilon));
    }
  }
  if (!(p.moving_average_decay >= 0.0f && p.moving_average_decay < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moving_average_decay must be in [0, 1), got ", p.moving_average_decay));
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizerBuffers(const OptimizerParams& p, const OptimizerBuffers& b, const char* op) {
  if (b.n < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": negative element count ", b.n));
  if (b.grad == nullptr || b.var == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": grad and var are required"));
  }
  const float* slots[] = {b.slot0, b.slot1, b.slot2};
  for (int k = 0; k < p.num_slots(); ++k) {
    if (slots[k] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": this optimizer keeps ", p.num_slots(), " slots; slot", k, " is missing"));
    }
  }
  if (b.shadow != nullptr && !(p.moving_average_decay > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": a moving-average shadow was given but moving_average_decay is 0"));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::kernels
