#include "ps/slice_store.h"

#include <algorithm>
#include <cstring>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace dtrain::ps {

absl::StatusOr<SliceStore> SliceStore::Create(std::vector<SliceSpec> slices, const OptimizerConfig& optimizer,
                                              float moving_average_decay) {
  absl::StatusOr<Optimizer> opt = Optimizer::Create(optimizer);
  if (!opt.ok()) return opt.status();
  if (!(moving_average_decay >= 0.0f && moving_average_decay < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("moving_average_decay must be in [0, 1), got ", moving_average_decay));
  }
  std::unordered_map<uint32_t, int> seen;
  for (const SliceSpec& s : slices) {
    if (s.length <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", s.key, " has length ", s.length));
    }
    if (!seen.emplace(s.key, 0).second) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", s.key, " appears twice"));
    }
  }
  return SliceStore(std::move(slices), *std::move(opt), moving_average_decay);
}

SliceStore::SliceStore(std::vector<SliceSpec> specs, Optimizer optimizer, float moving_average_decay)
    : specs_(std::move(specs)), optimizer_(std::move(optimizer)), moving_average_decay_(moving_average_decay) {
  const int n = static_cast<int>(specs_.size());
  values_.resize(n);
  slots_.resize(n);
  shadows_.resize(n);
  for (int i = 0; i < n; ++i) {
    const int64_t len = specs_[i].length;
    index_of_key_[specs_[i].key] = i;
    total_floats_ += len;
    values_[i].assign(len, 0.0f);
    slots_[i].assign(optimizer_.num_slots(), std::vector<float>(len, 0.0f));
    if (has_moving_averages()) shadows_[i].assign(len, 0.0f);
  }
}

absl::StatusOr<int> SliceStore::IndexOf(uint32_t key) const {
  auto it = index_of_key_.find(key);
  if (it == index_of_key_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("slice key ", key, " is not held by this ps task"));
  }
  return it->second;
}

absl::Status SliceStore::SetValues(const std::vector<SliceData>& values) {
  std::vector<const SliceData*> by_index(specs_.size(), nullptr);
  for (const SliceData& d : values) {
    absl::StatusOr<int> i = IndexOf(d.key);
    if (!i.ok()) return i.status();
    if (by_index[*i] != nullptr) return absl::InvalidArgumentError(absl::StrCat("slice key ", d.key, " given twice"));
    if (static_cast<int64_t>(d.values.size()) != specs_[*i].length) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", d.key, " ('", specs_[*i].variable, "') has ",
                                                     d.values.size(), " values, expected ", specs_[*i].length));
    }
    by_index[*i] = &d;
  }
  for (size_t i = 0; i < by_index.size(); ++i) {
    if (by_index[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("no values for slice key ", specs_[i].key, " ('", specs_[i].variable, "')"));
    }
  }
  for (size_t i = 0; i < by_index.size(); ++i) {
    values_[i] = by_index[i]->values;
    for (std::vector<float>& slot : slots_[i]) std::fill(slot.begin(), slot.end(), 0.0f);
    if (has_moving_averages()) shadows_[i] = values_[i];
  }
  return absl::OkStatus();
}

void SliceStore::ApplyGradient(int i, int64_t step, const float* grad, float grad_scale) {
  std::vector<std::vector<float>>& slots = slots_[i];
  float* slot0 = slots.size() > 0 ? slots[0].data() : nullptr;
  float* slot1 = slots.size() > 1 ? slots[1].data() : nullptr;
  float* var = values_[i].data();
  float* shadow = has_moving_averages() ? shadows_[i].data() : nullptr;
  const float decay = MovingAverageDecay(moving_average_decay_, step + 1);
  const int64_t n = specs_[i].length;
  // The update is elementwise: large slices are cut into chunks applied in parallel (same result bit for bit).
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  auto apply = [&](int64_t begin, int64_t end) {
    optimizer_.Apply(step, grad_scale, grad + begin, var + begin, slot0 ? slot0 + begin : nullptr,
                     slot1 ? slot1 + begin : nullptr, end - begin);
    if (shadow != nullptr) UpdateMovingAverage(decay, var + begin, shadow + begin, end - begin);
  };
  if (apply_threads_ <= 1 || chunks < 2) {
    apply(0, n);
    return;
  }
#pragma omp parallel for num_threads(apply_threads_) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) apply(c * kChunk, std::min(n, (c + 1) * kChunk));
}

void SliceStore::CopyValuesToFlat(float* flat) const {
  for (size_t i = 0; i < specs_.size(); ++i) {
    std::memcpy(flat + specs_[i].flat_offset, values_[i].data(), specs_[i].length * sizeof(float));
  }
}

void SliceStore::CopyMovingAveragesToFlat(float* flat) const {
  CHECK(has_moving_averages());
  for (size_t i = 0; i < specs_.size(); ++i) {
    std::memcpy(flat + specs_[i].flat_offset, shadows_[i].data(), specs_[i].length * sizeof(float));
  }
}

void SliceStore::ReadValues(std::vector<SliceData>* out) const {
  out->resize(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    (*out)[i].key = specs_[i].key;
    (*out)[i].values.assign(values_[i].begin(), values_[i].end());
  }
}

void SliceStore::ReadMovingAverages(std::vector<SliceData>* out) const {
  CHECK(has_moving_averages());
  out->resize(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    (*out)[i].key = specs_[i].key;
    (*out)[i].values.assign(shadows_[i].begin(), shadows_[i].end());
  }
}

std::vector<SliceState> SliceStore::ExportState() const {
  std::vector<SliceState> out(specs_.size());
  for (size_t i = 0; i < specs_.size(); ++i) {
    out[i].spec = specs_[i];
    out[i].values = values_[i];
    out[i].slots = slots_[i];
    out[i].moving_average = shadows_[i];
  }
  return out;
}

absl::Status SliceStore::ImportState(const std::vector<SliceState>& slices) {
  std::vector<const SliceState*> by_index(specs_.size(), nullptr);
  for (const SliceState& s : slices) {
    absl::StatusOr<int> i = IndexOf(s.spec.key);
    if (!i.ok()) return i.status();
    const SliceSpec& spec = specs_[*i];
    if (by_index[*i] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", spec.key, " given twice"));
    }
    if (!(s.spec == spec)) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", spec.key, ": state for '", s.spec.variable,
                                                     "' [", s.spec.flat_offset, ", +", s.spec.length,
                                                     "), this store holds '", spec.variable, "' [",
                                                     spec.flat_offset, ", +", spec.length, ")"));
    }
    bool ok = static_cast<int64_t>(s.values.size()) == spec.length &&
              static_cast<int>(s.slots.size()) == optimizer_.num_slots() &&
              (s.moving_average.empty() || static_cast<int64_t>(s.moving_average.size()) == spec.length);
    for (const std::vector<float>& slot : s.slots) ok = ok && static_cast<int64_t>(slot.size()) == spec.length;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", spec.key, " ('", spec.variable,
                                                     "'): wrong number of values or optimizer slots"));
    }
    by_index[*i] = &s;
  }
  for (size_t i = 0; i < by_index.size(); ++i) {
    if (by_index[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("no state for slice key ", specs_[i].key, " ('", specs_[i].variable, "')"));
    }
  }
  for (size_t i = 0; i < by_index.size(); ++i) {
    const SliceState& s = *by_index[i];
    values_[i] = s.values;
    slots_[i] = s.slots;
    if (has_moving_averages()) shadows_[i] = s.moving_average.empty() ? s.values : s.moving_average;
  }
  return absl::OkStatus();
}

}  // namespace dtrain::ps
