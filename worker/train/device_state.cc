#include "worker/train/device_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps/core/optimizer.h"

namespace dtrain::worker {

absl::StatusOr<kernels::OptimizerParams> DeviceOptimizerParams(const ps::TrainConfig& config) {
  return ps::ToOptimizerParams(config.optimizer, config.moving_average_decay);
}

DeviceState::DeviceState(Towers* towers, const kernels::OptimizerParams& params)
    : towers_(towers), params_(params), n_(towers->num_parameters()) {}

absl::StatusOr<std::unique_ptr<DeviceState>> DeviceState::Create(Towers* towers,
                                                                 const kernels::OptimizerParams& params) {
  if (towers == nullptr || towers->host_resident()) {
    return absl::InvalidArgumentError("DeviceState: needs towers whose models own their device buffers");
  }
  RETURN_IF_ERROR(kernels::ValidateOptimizerParams(params));
  std::unique_ptr<DeviceState> s(new DeviceState(towers, params));
  // Runs of trainable variables get the optimizer; runs of state (BatchNorm running statistics) the plain
  // change the ps applies to them (ps/api/ps_types.h, SliceSpec::trainable).
  int64_t offset = 0;
  for (const models::VariableInfo& v : towers->tower(0)->variables()) {
    if (!s->runs_.empty() && s->runs_.back().trainable == v.trainable) {
      s->runs_.back().size += v.size();
    } else {
      s->runs_.push_back({offset, v.size(), v.trainable});
    }
    offset += v.size();
  }
  s->state_.resize(towers->size());
  for (int t = 0; t < towers->size(); ++t) {
    kernels::Device* dev = towers->device(t);
    TowerState& ts = s->state_[t];
    for (int k = 0; k < params.num_slots(); ++k) {
      ASSIGN_OR_RETURN(ts.slots[k], dev->Alloc(s->n_));
    }
    ASSIGN_OR_RETURN(ts.optimizer, dev->MakeOptimizer(params, towers->step_counter(t)));
  }
  if (params.moving_average_decay > 0.0f) {
    ASSIGN_OR_RETURN(s->shadow_, towers->device(0)->Alloc(s->n_));
  }
  return s;
}

DeviceState::~DeviceState() {
  for (int t = 0; t < static_cast<int>(state_.size()); ++t) {
    state_[t].optimizer.reset();
    for (float* slot : state_[t].slots) towers_->device(t)->Free(slot);
  }
  towers_->device(0)->Free(shadow_);
  towers_->device(0)->Free(kept_values_);
}

absl::Status DeviceState::Load(const ps::CheckpointData& state) {
  if (state.num_slots != params_.num_slots()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device state: the ps holds ", state.num_slots,
                     " optimizer slots per variable, the device optimizer needs ", params_.num_slots()));
  }
  if (using_averages_) RETURN_IF_ERROR(UseMovingAverages(false));
  // The flat buffers, assembled from the slices (which must cover [0, n) exactly once).
  std::vector<float> values(n_), shadow(shadow_ != nullptr ? n_ : 0);
  std::vector<std::vector<float>> slots(params_.num_slots(), std::vector<float>(n_));
  std::vector<ps::SliceState> sorted = state.slices;
  std::sort(sorted.begin(), sorted.end(), [](const ps::SliceState& a, const ps::SliceState& b) {
    return a.spec.flat_offset < b.spec.flat_offset;
  });
  int64_t covered = 0;
  layout_.clear();
  for (const ps::SliceState& s : sorted) {
    const int64_t off = s.spec.flat_offset, len = s.spec.length;
    if (off != covered || len < 0 || off + len > n_ || static_cast<int64_t>(s.values.size()) != len ||
        static_cast<int>(s.slots.size()) != params_.num_slots()) {
      return absl::FailedPreconditionError(absl::StrCat("device state: slice '", s.spec.variable, "' [", off,
                                                        ", +", len, ") does not fit a flat buffer of ", n_,
                                                        " floats covered up to ", covered));
    }
    std::copy(s.values.begin(), s.values.end(), values.begin() + off);
    for (int k = 0; k < params_.num_slots(); ++k) {
      if (static_cast<int64_t>(s.slots[k].size()) != len) {
        return absl::FailedPreconditionError(absl::StrCat("device state: slot ", k, " of '", s.spec.variable,
                                                          "' has ", s.slots[k].size(), " floats, not ", len));
      }
      std::copy(s.slots[k].begin(), s.slots[k].end(), slots[k].begin() + off);
    }
    if (shadow_ != nullptr) {
      // A checkpoint without moving averages starts them at the values (the parameter server's rule).
      const std::vector<float>& src =
          s.moving_average.size() == s.values.size() ? s.moving_average : s.values;
      std::copy(src.begin(), src.end(), shadow.begin() + off);
    }
    layout_.push_back(s.spec);
    covered = off + len;
  }
  if (covered != n_) {
    return absl::FailedPreconditionError(
        absl::StrCat("device state: the slices cover ", covered, " of the model's ", n_, " floats"));
  }
  for (int t = 0; t < towers_->size(); ++t) {
    kernels::Device* dev = towers_->device(t);
    RETURN_IF_ERROR(dev->CopyToDevice(values.data(), towers_->tower(t)->device_parameters(), n_));
    for (int k = 0; k < params_.num_slots(); ++k) {
      RETURN_IF_ERROR(dev->CopyToDevice(slots[k].data(), state_[t].slots[k], n_));
    }
    RETURN_IF_ERROR(towers_->step_counter(t)->Set(state.task_step));
    RETURN_IF_ERROR(dev->Synchronize());  // the host vectors go away on return
  }
  if (shadow_ != nullptr) {
    RETURN_IF_ERROR(towers_->device(0)->CopyToDevice(shadow.data(), shadow_, n_));
    RETURN_IF_ERROR(towers_->device(0)->Synchronize());
  }
  return absl::OkStatus();
}

absl::Status DeviceState::EnqueueUpdates() {
  if (using_averages_) {
    return absl::FailedPreconditionError("device state: a step while tower 0 holds the moving averages");
  }
  for (int t = 0; t < towers_->size(); ++t) {
    models::Model* m = towers_->tower(t);
    kernels::Device* dev = towers_->device(t);
    float* shadow = t == 0 ? shadow_ : nullptr;
    if (params_.clip_norm > 0.0f) {
      // The global norm of the step's (averaged) gradient over every trainable run, gathered on the device.
      RETURN_IF_ERROR(state_[t].optimizer->ClearNorm());
      for (const Run& r : runs_) {
        if (!r.trainable) continue;
        RETURN_IF_ERROR(state_[t].optimizer->AddToNorm(m->device_gradients() + r.offset, r.size, 1.0f));
      }
    }
    for (const Run& r : runs_) {
      if (!r.trainable) {
        RETURN_IF_ERROR(dev->Axpy(-1.0f, m->device_gradients() + r.offset, m->device_parameters() + r.offset, r.size));
        if (shadow != nullptr) {
          RETURN_IF_ERROR(dev->CopyOnDevice(m->device_parameters() + r.offset, shadow + r.offset, r.size));
        }
        continue;
      }
      kernels::OptimizerBuffers b;
      b.grad = m->device_gradients() + r.offset;
      b.var = m->device_parameters() + r.offset;
      b.slot0 = state_[t].slots[0] != nullptr ? state_[t].slots[0] + r.offset : nullptr;
      b.slot1 = state_[t].slots[1] != nullptr ? state_[t].slots[1] + r.offset : nullptr;
      b.slot2 = state_[t].slots[2] != nullptr ? state_[t].slots[2] + r.offset : nullptr;
      b.shadow = shadow != nullptr ? shadow + r.offset : nullptr;
      b.n = r.size;
      RETURN_IF_ERROR(state_[t].optimizer->Apply(b, 1.0f));
    }
  }
  return absl::OkStatus();
}

const float* DeviceState::values0() {
  return using_averages_ ? kept_values_ : towers_->tower(0)->device_parameters();
}

absl::StatusOr<std::vector<float>> DeviceState::ExportValues() {
  std::vector<float> values(n_);
  RETURN_IF_ERROR(towers_->device(0)->CopyToHost(values0(), values.data(), n_));
  return values;
}

absl::StatusOr<std::vector<ps::SliceState>> DeviceState::Export() {
  if (layout_.empty()) return absl::FailedPreconditionError("device state: Export before Load");
  kernels::Device* dev = towers_->device(0);
  ASSIGN_OR_RETURN(std::vector<float> values, ExportValues());
  std::vector<std::vector<float>> slots(params_.num_slots(), std::vector<float>(n_));
  for (int k = 0; k < params_.num_slots(); ++k) {
    RETURN_IF_ERROR(dev->CopyToHost(state_[0].slots[k], slots[k].data(), n_));
  }
  std::vector<float> shadow;
  if (shadow_ != nullptr) {
    shadow.resize(n_);
    RETURN_IF_ERROR(dev->CopyToHost(shadow_, shadow.data(), n_));
  }
  std::vector<ps::SliceState> out(layout_.size());
  for (size_t i = 0; i < layout_.size(); ++i) {
    const ps::SliceSpec& spec = layout_[i];
    const auto begin = static_cast<std::ptrdiff_t>(spec.flat_offset);
    const auto end = begin + static_cast<std::ptrdiff_t>(spec.length);
    out[i].spec = spec;
    out[i].values.assign(values.begin() + begin, values.begin() + end);
    for (const std::vector<float>& slot : slots)
      out[i].slots.emplace_back(slot.begin() + begin, slot.begin() + end);
    if (!shadow.empty()) out[i].moving_average.assign(shadow.begin() + begin, shadow.begin() + end);
  }
  return out;
}

absl::Status DeviceState::UseMovingAverages(bool use) {
  if (use == using_averages_) return absl::OkStatus();
  if (shadow_ == nullptr) {
    return absl::FailedPreconditionError("device state: no moving averages (moving_average_decay is 0)");
  }
  kernels::Device* dev = towers_->device(0);
  float* params = towers_->tower(0)->device_parameters();
  if (use) {
    if (kept_values_ == nullptr) {
      ASSIGN_OR_RETURN(kept_values_, dev->Alloc(n_));
    }
    RETURN_IF_ERROR(dev->CopyOnDevice(params, kept_values_, n_));
    RETURN_IF_ERROR(dev->CopyOnDevice(shadow_, params, n_));
  } else {
    RETURN_IF_ERROR(dev->CopyOnDevice(kept_values_, params, n_));
  }
  using_averages_ = use;
  return absl::OkStatus();
}

}  // namespace dtrain::worker
