#include "ps/core/slice_store.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace dtrain::ps {

static_assert(kMaxOptimizerSlots <= static_cast<int>(kMaxCheckpointSlots),
              "every optimizer's slots must fit a checkpoint (ps/checkpoint/checkpoint_format.h)");

absl::StatusOr<std::unique_ptr<SliceStore>> SliceStore::Create(std::vector<SliceSpec> slices,
                                                               const OptimizerConfig& optimizer,
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
  return std::unique_ptr<SliceStore>(new SliceStore(std::move(slices), *std::move(opt), moving_average_decay));
}

SliceStore::SliceStore(std::vector<SliceSpec> specs, Optimizer optimizer, float moving_average_decay)
    : specs_(std::move(specs)), optimizer_(std::move(optimizer)), moving_average_decay_(moving_average_decay) {
  const int n = static_cast<int>(specs_.size());
  slices_.reserve(n);
  for (int i = 0; i < n; ++i) {
    auto s = std::make_unique<Slice>();
    s->spec = specs_[i];
    const int64_t len = s->spec.length;
    s->values.assign(len, 0.0f);
    for (int k = 0; k < optimizer_.num_slots(); ++k) s->slots.emplace_back(len, optimizer_.SlotInitialValue(k));
    if (has_moving_averages()) s->shadow.assign(len, 0.0f);
    index_of_key_[s->spec.key] = i;
    total_floats_ += len;
    slices_.push_back(std::move(s));
  }
  absl::MutexLock lock(&progress_mu_);
  progress_.assign(n, Progress{});
}

absl::StatusOr<int> SliceStore::IndexOf(uint32_t key) const {
  auto it = index_of_key_.find(key);
  if (it == index_of_key_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("slice key ", key, " is not held by this ps task"));
  }
  return it->second;
}

absl::Status SliceStore::CheckRange(int i, int64_t offset, int64_t n) const {
  const SliceSpec& s = slices_[i]->spec;
  if (offset < 0 || n < 0 || offset > s.length - n) {
    return absl::InvalidArgumentError(absl::StrCat("slice key ", s.key, " ('", s.variable, "') has ", s.length,
                                                   " values; got floats [", offset, ", ", offset + n, ")"));
  }
  return absl::OkStatus();
}

absl::Status SliceStore::WriteValues(int i, int64_t offset, int64_t n, WireDtype dtype, const void* data) {
  if (absl::Status s = CheckRange(i, offset, n); !s.ok()) return s;
  Slice& slice = *slices_[i];
  absl::MutexLock lock(&slice.mu);
  DecodeFloats(dtype, data, n, slice.values.data() + offset);
  return absl::OkStatus();
}

void SliceStore::ResetSlotsAndAverages(int64_t version) {
  for (auto& s : slices_) {
    absl::MutexLock lock(&s->mu);
    for (size_t k = 0; k < s->slots.size(); ++k) {
      std::fill(s->slots[k].begin(), s->slots[k].end(), optimizer_.SlotInitialValue(static_cast<int>(k)));
    }
    if (has_moving_averages()) s->shadow = s->values;
    s->tentative_floats = 0;
  }
  absl::MutexLock lock(&progress_mu_);
  for (Progress& p : progress_) p = Progress{version, version, 0};
}

void SliceStore::Publish(int i, int64_t applying_version, int64_t applied_floats, bool done) {
  absl::MutexLock lock(&progress_mu_);
  Progress& p = progress_[i];
  p.applying_version = applying_version;
  p.applied_floats = applied_floats;
  if (done) p.version = applying_version;
}

namespace {

bool AnyNonFinite(const float* x, int64_t n) {
  uint32_t any = 0;
  for (int64_t k = 0; k < n; ++k) {
    uint32_t bits;
    std::memcpy(&bits, x + k, sizeof(bits));
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any != 0;
}

// Replaces the values of x[0, n) that are NaN or Inf with 0; returns how many it replaced.
int64_t ZeroNonFinite(float* x, int64_t n) {
  // One branch-free pass (vectorized) finds whether any exponent is all ones; the rare second pass replaces.
  if (!AnyNonFinite(x, n)) return 0;
  int64_t zeroed = 0;
  for (int64_t k = 0; k < n; ++k) {
    if (!std::isfinite(x[k])) {
      x[k] = 0.0f;
      ++zeroed;
    }
  }
  return zeroed;
}

}  // namespace

int64_t SliceStore::Apply(int i, int64_t step, const float* const* grads, int num_grads, float grad_scale,
                          int64_t version, const float* weights, ApplyGuard guard) {
  Slice& slice = *slices_[i];
  const int64_t n = slice.spec.length;
  if (num_grads == 0) {
    Publish(i, version, n, /*done=*/true);
    return 0;
  }
  const bool state = !slice.spec.trainable;
  // Trainable slices: a single gradient's weight folds into grad_scale; several are summed with their weights.
  const bool weighted = weights != nullptr && !state;
  const float scale = weighted && num_grads == 1 ? grad_scale * weights[0] : grad_scale;
  // Guarded, or several workers' gradients: each chunk is formed in a per-thread scratch the optimizer reads.
  const bool copy = num_grads > 1 || guard == ApplyGuard::kCopyFinite;
  std::atomic<int64_t> zeroed{0};
  thread_local std::vector<float> scratch;
  auto apply = [&](int64_t begin, int64_t end, float* sum) {
    const float* grad = grads[0] + begin;
    if (copy) {
      const bool check = guard == ApplyGuard::kCopyFinite;
      if (weighted && num_grads > 1) {  // (one gradient's weight is in `scale`)
        for (int64_t k = 0; k < end - begin; ++k) sum[k] = weights[0] * grad[k];
        for (int k = 1; k < num_grads; ++k) AxpyInto(weights[k], grads[k] + begin, sum, end - begin);
      } else {
        std::memcpy(sum, grad, (end - begin) * sizeof(float));
        for (int k = 1; k < num_grads; ++k) AddInto(grads[k] + begin, sum, end - begin);
      }
      if (check) {
        if (const int64_t z = ZeroNonFinite(sum, end - begin); z > 0) zeroed.fetch_add(z);
      }
      grad = sum;
    }
    UpdateRange(slice, step, grad, scale, grad_scale, begin, end);
  };
  const int64_t chunks = (n + kChunkFloats - 1) / kChunkFloats;
  if (apply_threads_ > 1 && chunks > 1) {
    // Local mode: nobody streams concurrently; use the worker's threads for the whole slice.
    absl::MutexLock lock(&slice.mu);
#pragma omp parallel num_threads(apply_threads_)
    {
      thread_local std::vector<float> local;
      if (copy) local.resize(kChunkFloats);
#pragma omp for schedule(static)
      for (int64_t c = 0; c < chunks; ++c) {
        apply(c * kChunkFloats, std::min(n, (c + 1) * kChunkFloats), local.data());
      }
    }
  } else {
    if (copy) scratch.resize(kChunkFloats);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t end = std::min(n, (c + 1) * kChunkFloats);
      {
        absl::MutexLock lock(&slice.mu);
        apply(c * kChunkFloats, end, scratch.data());
      }
      if (end < n) Publish(i, version, end, /*done=*/false);
    }
  }
  Publish(i, version, n, /*done=*/true);
  return zeroed.load();
}

void SliceStore::UpdateRange(Slice& slice, int64_t step, const float* grad, float scale, float state_scale,
                             int64_t begin, int64_t end) const {
  float* var = slice.values.data();
  float* shadow = has_moving_averages() ? slice.shadow.data() : nullptr;
  if (slice.spec.trainable) {
    float* chunk_slots[kMaxOptimizerSlots] = {};
    for (size_t k = 0; k < slice.slots.size(); ++k) chunk_slots[k] = slice.slots[k].data() + begin;
    optimizer_.Apply(step, scale, grad, var + begin, chunk_slots, end - begin);
    if (shadow != nullptr) {
      UpdateMovingAverage(MovingAverageDecay(moving_average_decay_, step + 1), var + begin, shadow + begin,
                          end - begin);
    }
  } else {
    // State (BatchNorm running statistics): the pushed change, averaged; the "average" is the value itself.
    for (int64_t k = 0; k < end - begin; ++k) var[begin + k] -= state_scale * grad[k];
    if (shadow != nullptr) std::memcpy(shadow + begin, var + begin, (end - begin) * sizeof(float));
  }
}

int64_t SliceStore::ApplyTentative(int i, int64_t step, const float* grad, int64_t available, int64_t version,
                                   ApplyGuard guard, int64_t* zeroed) {
  Slice& slice = *slices_[i];
  const int64_t n = slice.spec.length;
  int64_t from;
  {
    absl::MutexLock lock(&slice.mu);
    from = slice.tentative_floats;
  }
  const int64_t to = available >= n ? n : available / kChunkFloats * kChunkFloats;
  if (to <= from) return from;
  if (from == 0) {
    int64_t before;
    {
      absl::MutexLock lock(&progress_mu_);
      before = progress_[i].version;
    }
    absl::MutexLock lock(&slice.mu);
    slice.tentative_from = before;
    if (slice.undo_values.empty()) {
      slice.undo_values.resize(n);
      slice.undo_slots.assign(slice.slots.size(), std::vector<float>(n));
      if (has_moving_averages()) slice.undo_shadow.resize(n);
    }
  }
  for (int64_t begin = from; begin < to; begin += kChunkFloats) {
    const int64_t end = std::min(to, begin + kChunkFloats);
    {
      absl::MutexLock lock(&slice.mu);
      const size_t bytes = (end - begin) * sizeof(float);
      std::memcpy(slice.undo_values.data() + begin, slice.values.data() + begin, bytes);
      for (size_t k = 0; k < slice.slots.size(); ++k) {
        std::memcpy(slice.undo_slots[k].data() + begin, slice.slots[k].data() + begin, bytes);
      }
      if (!slice.undo_shadow.empty()) {
        std::memcpy(slice.undo_shadow.data() + begin, slice.shadow.data() + begin, bytes);
      }
      const float* chunk = grad + begin;
      if (guard == ApplyGuard::kCopyFinite) {
        // As Apply's guard: the optimizer reads this task's checked copy, not the lender's memory.
        thread_local std::vector<float> copied;
        copied.assign(chunk, chunk + (end - begin));
        const int64_t z = ZeroNonFinite(copied.data(), end - begin);
        if (zeroed != nullptr) *zeroed += z;
        chunk = copied.data();
      }
      UpdateRange(slice, step, chunk, 1.0f, 1.0f, begin, end);
      slice.tentative_floats = end;
    }
    Publish(i, version, end, /*done=*/end == n);
  }
  return to;
}

int64_t SliceStore::tentative_floats(int i) const {
  absl::MutexLock lock(&slices_[i]->mu);
  return slices_[i]->tentative_floats;
}

void SliceStore::ConfirmTentative(int i) {
  absl::MutexLock lock(&slices_[i]->mu);
  slices_[i]->tentative_floats = 0;
}

void SliceStore::UndoTentative(int i) {
  Slice& slice = *slices_[i];
  int64_t before;
  {
    absl::MutexLock lock(&slice.mu);
    const int64_t m = slice.tentative_floats;
    if (m == 0) return;
    const size_t bytes = m * sizeof(float);
    std::memcpy(slice.values.data(), slice.undo_values.data(), bytes);
    for (size_t k = 0; k < slice.slots.size(); ++k) {
      std::memcpy(slice.slots[k].data(), slice.undo_slots[k].data(), bytes);
    }
    if (!slice.undo_shadow.empty()) std::memcpy(slice.shadow.data(), slice.undo_shadow.data(), bytes);
    slice.tentative_floats = 0;
    before = slice.tentative_from;
  }
  absl::MutexLock lock(&progress_mu_);
  progress_[i] = Progress{before, before, 0};
}

// The waits below are conditions of progress_mu_, not waits on a condition variable: every published chunk
// signalled one, and with W pulls waiting each chunk woke all W, which then queued for progress_mu_ (64 sync
// workers: a pull thread woken ~9 times a step to find its chunk not yet there). The mutex evaluates each waiter's condition as
// it is released and wakes only a pull whose chunk is there (or that must stop). `stop` is evaluated there too:
// it must read only atomics.
bool SliceStore::WaitReadable(int i, int64_t end, int64_t version, absl::Time deadline,
                              const std::function<bool()>& stop) const {
  absl::MutexLock lock(&progress_mu_);
  auto readable = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress_mu_) {
    return progress_[i].ReadableEnd(specs_[i].length, version) >= end;
  };
  auto readable_or_stop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress_mu_) {
    return readable() || (stop && stop());
  };
  progress_mu_.AwaitWithDeadline(absl::Condition(&readable_or_stop), deadline);
  return readable();
}

int SliceStore::WaitAnyReadable(const std::vector<int64_t>& sent, int64_t version, absl::Time deadline,
                                const std::function<bool()>& stop, int64_t* readable_end) const {
  CHECK_EQ(sent.size(), specs_.size());
  absl::MutexLock lock(&progress_mu_);
  auto find = [&](int64_t* end_out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress_mu_) {
    for (size_t k = 0; k < sent.size(); ++k) {
      const int64_t end = progress_[k].ReadableEnd(specs_[k].length, version);
      if (end > sent[k]) {
        *end_out = end;
        return static_cast<int>(k);
      }
    }
    return -1;
  };
  auto any_or_stop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(progress_mu_) {
    int64_t unused;
    return find(&unused) >= 0 || (stop && stop());
  };
  // (An InfinitePast deadline only looks: AwaitWithDeadline returns at once with the condition's value.)
  progress_mu_.AwaitWithDeadline(absl::Condition(&any_or_stop), deadline);
  return find(readable_end);
}

void SliceStore::WakeWaiters() const {
  absl::MutexLock lock(&progress_mu_);  // its release evaluates the waiters' conditions, their `stop` with them
}

int64_t SliceStore::version(int i) const {
  absl::MutexLock lock(&progress_mu_);
  return progress_[i].version;
}

void SliceStore::Read(int i, bool moving_average, int64_t offset, int64_t n, WireDtype dtype, void* dst) const {
  CHECK(!moving_average || has_moving_averages());
  const Slice& slice = *slices_[i];
  absl::ReaderMutexLock lock(&slice.mu);
  const std::vector<float>& src = moving_average ? slice.shadow : slice.values;
  EncodeFloats(dtype, src.data() + offset, n, dst);
}

std::vector<SliceState> SliceStore::ExportState() const {
  std::vector<SliceState> out(slices_.size());
  for (size_t i = 0; i < slices_.size(); ++i) {
    const Slice& s = *slices_[i];
    absl::ReaderMutexLock lock(&s.mu);
    out[i].spec = s.spec;
    out[i].values = s.values;
    out[i].slots = s.slots;
    out[i].moving_average = s.shadow;
    if (const int64_t m = s.tentative_floats; m > 0) {
      // A tentative update is not part of the state until confirmed: what it overwrote.
      std::copy_n(s.undo_values.begin(), m, out[i].values.begin());
      for (size_t k = 0; k < s.slots.size(); ++k) std::copy_n(s.undo_slots[k].begin(), m, out[i].slots[k].begin());
      if (!s.undo_shadow.empty()) std::copy_n(s.undo_shadow.begin(), m, out[i].moving_average.begin());
    }
  }
  return out;
}

absl::Status SliceStore::ImportState(const std::vector<SliceState>& state, int64_t version) {
  std::vector<const SliceState*> by_index(slices_.size(), nullptr);
  for (const SliceState& s : state) {
    absl::StatusOr<int> i = IndexOf(s.spec.key);
    if (!i.ok()) return i.status();
    const SliceSpec& spec = slices_[*i]->spec;
    if (by_index[*i] != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", spec.key, " given twice"));
    }
    if (!(s.spec == spec)) {
      return absl::InvalidArgumentError(absl::StrCat("slice key ", spec.key, ": state for '", s.spec.variable,
                                                     "' [", s.spec.flat_offset, ", +", s.spec.length,
                                                     "), this store holds '", spec.variable, "' [",
                                                     spec.flat_offset, ", +", spec.length, ")"));
    }
    if (static_cast<int>(s.slots.size()) != optimizer_.num_slots()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice key ", spec.key, " ('", spec.variable, "'): the state holds ", s.slots.size(),
          " optimizer slots per value, optimizer '", optimizer_.config().name, "' as configured keeps ",
          optimizer_.num_slots(), " (", optimizer_.DescribeSlots(), ")"));
    }
    bool ok = static_cast<int64_t>(s.values.size()) == spec.length &&
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
    Slice& slice = *slices_[i];
    absl::MutexLock lock(&slice.mu);
    slice.values = s.values;
    slice.slots = s.slots;
    if (has_moving_averages()) slice.shadow = s.moving_average.empty() ? s.values : s.moving_average;
    slice.tentative_floats = 0;  // the state replaced: nothing to take back
  }
  absl::MutexLock lock(&progress_mu_);
  for (Progress& p : progress_) p = Progress{version, version, 0};
  return absl::OkStatus();
}

}  // namespace dtrain::ps
