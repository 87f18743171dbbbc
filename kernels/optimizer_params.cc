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

}  // namespace

absl::Status SetOptimizerFromName(const std::string& name, OptimizerParams* p) {
  OptimizerParams::Kind kind;
  if (name == "sgd") {
    kind = OptimizerParams::Kind::kSgd;
  } else if (name == "momentum") {
    kind = OptimizerParams::Kind::kMomentum;
  } else if (name == "adam" || name == "pytorch_adam") {
    kind = OptimizerParams::Kind::kAdam;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer '", name, "' (expected sgd, momentum, adam or pytorch_adam)"));
  }
  p->kind = kind;
  p->adam_paper_epsilon = name == "pytorch_adam";
  return absl::OkStatus();
}

absl::Status ValidateOptimizerParams(const OptimizerParams& p) {
  if (!std::isfinite(p.learning_rate) || p.learning_rate < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer learning_rate must be finite and >= 0, got ", p.learning_rate));
  }
  if (p.decay_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer decay_steps must be >= 0, got ", p.decay_steps));
  }
  if (p.decay_steps > 0 && !(std::isfinite(p.decay_rate) && p.decay_rate > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer decay_rate must be finite and > 0, got ", p.decay_rate));
  }
  if (p.kind == OptimizerParams::Kind::kMomentum && !(std::isfinite(p.momentum) && p.momentum >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer momentum must be finite and >= 0, got ", p.momentum));
  }
  if (p.kind == OptimizerParams::Kind::kAdam) {
    if (absl::Status s = CheckOpen01("beta1", p.beta1); !s.ok()) return s;
    if (absl::Status s = CheckOpen01("beta2", p.beta2); !s.ok()) return s;
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
  if (p.num_slots() >= 1 && b.slot0 == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": this optimizer needs slot0 (", p.kind == OptimizerParams::Kind::kAdam ? "m" : "accum", ")"));
  }
  if (p.num_slots() >= 2 && b.slot1 == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": adam needs slot1 (v)"));
  }
  if (b.shadow != nullptr && !(p.moving_average_decay > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": a moving-average shadow was given but moving_average_decay is 0"));
  }
  return absl::OkStatus();
}

}  // namespace dtrain::kernels
