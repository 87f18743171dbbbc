#include "ps/core/elastic_plan.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace dtrain::ps {

ElasticPlan::ElasticPlan(bool sync, bool global, int unit, int replicas_to_aggregate, int global_batch)
    : sync_(sync),
      global_(global),
      unit_(unit),
      replicas_(replicas_to_aggregate),
      global_batch_(global_batch > 0 ? global_batch : unit) {}

void ElasticPlan::Start(const std::vector<int>& active) {
  if (plan_ != active) ++version_;
  for (int64_t b : assigned_) returned_.insert(b);
  assigned_.clear();
  for (const auto& [worker, batch] : outstanding_) returned_.insert(batch);
  outstanding_.clear();
  for (const auto& [worker, batch] : reserved_) returned_.insert(batch);
  reserved_.clear();
  plan_ = active;
  joins_.clear();
  if (sync_) Assign();
}

int64_t ElasticPlan::TakeBatch() {
  if (!returned_.empty()) {
    const int64_t b = *returned_.begin();
    returned_.erase(returned_.begin());
    return b;
  }
  return cursor_++;
}

void ElasticPlan::Assign() {
  assigned_.clear();
  if (global_) return;
  for (size_t i = 0; i < plan_.size(); ++i) assigned_.push_back(TakeBatch());
}

bool ElasticPlan::InPlan(int worker) const { return std::binary_search(plan_.begin(), plan_.end(), worker); }

int64_t ElasticPlan::Join(int worker, int64_t step, const std::vector<int>& active) {
  if (std::binary_search(plan_.begin(), plan_.end(), worker)) {
    joins_.erase(worker);
    return step;
  }
  if (!sync_) {
    return step;  // Changed() records it
  }
  if (Needed(active) == 0) {
    // Nobody of the plan is left to decide the step: the worker takes it up at once, with the batches of the plan
    // (given back: nobody trained on them).
    for (int64_t b : assigned_) returned_.insert(b);
    plan_.push_back(worker);
    std::sort(plan_.begin(), plan_.end());
    Assign();
    ++version_;
    return step;
  }
  joins_[worker] = step + 1;
  return step + 1;
}

int ElasticPlan::Needed(const std::vector<int>& active) const {
  int n = 0;
  for (int w : plan_) n += std::binary_search(active.begin(), active.end(), w) ? 1 : 0;
  return replicas_ > 0 ? std::min(replicas_, n) : n;
}

std::string ElasticPlan::Advance(int64_t decided, const std::vector<int>& contributed,
                                 const std::vector<int>& active) {
  for (size_t i = 0; i < assigned_.size() && i < plan_.size(); ++i) {
    if (std::find(contributed.begin(), contributed.end(), plan_[i]) == contributed.end()) {
      returned_.insert(assigned_[i]);
    }
  }
  std::vector<int> next;
  for (int w : active) {
    auto it = joins_.find(w);
    if (it != joins_.end() && it->second > decided + 1) continue;
    next.push_back(w);
    if (it != joins_.end()) joins_.erase(it);
  }
  if (next == plan_) {
    Assign();
    return "";
  }
  const std::vector<int> before = std::move(plan_);
  plan_ = std::move(next);
  Assign();
  ++version_;
  return Describe(decided + 1, before, plan_);
}

std::string ElasticPlan::Replan(int64_t step, const std::vector<int>& active) {
  if (!sync_ || !global_) return "";
  std::vector<int> next;
  std::set_intersection(plan_.begin(), plan_.end(), active.begin(), active.end(), std::back_inserter(next));
  if (next == plan_) return "";
  if (next.empty()) {
    // Nobody of the step is left: the active workers waiting to count from the next step take this one up now.
    next = active;
    joins_.clear();
  }
  const std::vector<int> before = std::move(plan_);
  plan_ = std::move(next);
  ++version_;
  return Describe(step, before, plan_, /*again=*/true);
}

std::string ElasticPlan::Changed(int64_t step, const std::vector<int>& active) {
  if (active == plan_) return "";
  for (int w : plan_) {
    if (std::binary_search(active.begin(), active.end(), w)) continue;
    if (auto r = reserved_.find(w); r != reserved_.end()) {  // held for its next step, never trained on
      returned_.insert(r->second);
      reserved_.erase(r);
    }
    auto it = outstanding_.find(w);
    if (it == outstanding_.end()) continue;
    returned_.insert(it->second);  // it left before its next pull: its last batch may not have been trained on
    outstanding_.erase(it);
  }
  const std::vector<int> before = std::move(plan_);
  plan_ = active;
  ++version_;
  return Describe(step, before, plan_);
}

ElasticView ElasticPlan::View(int64_t step, int worker, bool take_batch, int64_t read_ahead) {
  ElasticView v;
  v.version = version_;
  v.workers = plan_;
  v.aggregating = aggregating();
  v.unit = unit_;
  if (sync_) {
    if (global_) v.first_batch = step;
    v.batches = assigned_;
  } else if (take_batch && read_ahead == -1) {
    const int64_t b = TakeBatch();  // the pull says the worker is done with the batch it took before
    outstanding_[worker] = b;
    v.batches = {b};
  } else if (take_batch) {
    // A worker that reads ahead: its pull carries the rows of the batch it drew, so the batch it trains is the one
    // held for it a pull before (or, pulling the same step again, the one it has).
    auto out = outstanding_.find(worker);
    auto held = reserved_.find(worker);
    if (out == outstanding_.end() || read_ahead != out->second) {
      // A new step (a pull of the same step again, after its read-ahead missed, keeps its batch): the one before
      // is done (trained and pushed); it trains the held batch (a read-ahead of another one, or none, is drawn
      // again with its rows), or the next one when none is held.
      if (held != reserved_.end()) {
        outstanding_[worker] = held->second;
        reserved_.erase(held);
      } else {
        outstanding_[worker] = TakeBatch();
      }
    }
    if (reserved_.find(worker) == reserved_.end()) reserved_[worker] = TakeBatch();
    v.batches = {outstanding_[worker]};
    v.next_batch = reserved_[worker];
  }
  return v;
}

std::string ElasticPlan::SaveState() const {
  std::set<int64_t> back = returned_;
  back.insert(assigned_.begin(), assigned_.end());
  for (const auto& [worker, batch] : outstanding_) back.insert(batch);
  for (const auto& [worker, batch] : reserved_) back.insert(batch);
  if (back.empty()) return absl::StrCat(cursor_);
  return absl::StrCat(cursor_, ":", absl::StrJoin(back, ","));
}

absl::Status ElasticPlan::RestoreState(absl::string_view state) {
  std::vector<absl::string_view> parts = absl::StrSplit(state, absl::MaxSplits(':', 1));
  int64_t cursor = 0;
  std::set<int64_t> back;
  bool ok = absl::SimpleAtoi(parts[0], &cursor) && cursor >= 0;
  if (ok && parts.size() == 2) {
    for (absl::string_view b : absl::StrSplit(parts[1], ',')) {
      int64_t k = 0;
      if (!absl::SimpleAtoi(b, &k) || k < 0 || k >= cursor) {
        ok = false;
        break;
      }
      back.insert(k);
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat("the elastic input's state '", state.substr(0, 64),
                                                   "' is malformed (expected cursor[:batch,...])"));
  }
  cursor_ = cursor;
  returned_ = std::move(back);
  assigned_.clear();
  outstanding_.clear();
  reserved_.clear();
  if (sync_) Assign();
  return absl::OkStatus();
}

int ElasticPlan::aggregating() const {
  const int n = static_cast<int>(plan_.size());
  return replicas_ > 0 ? std::min(replicas_, n) : n;
}

int64_t ElasticPlan::global_batch() const {
  return global_ ? global_batch_ : static_cast<int64_t>(unit_) * static_cast<int64_t>(plan_.size());
}

std::string ElasticPlan::Describe(int64_t step, const std::vector<int>& before, const std::vector<int>& after,
                                  bool again) const {
  return DescribeMembershipChange(step, before, after, sync_, aggregating(), sync_ ? global_batch() : unit_, again);
}

}  // namespace dtrain::ps
