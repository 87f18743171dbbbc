#include "ps/core/elastic_plan.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain::ps {
namespace {

std::vector<int> Minus(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// "worker 3 joined", "workers 3, 4 left".
std::string Phrase(const std::vector<int>& workers, const char* what) {
  return absl::StrCat(workers.size() == 1 ? "worker " : "workers ", absl::StrJoin(workers, ", "), " ", what);
}

}  // namespace

ElasticPlan::ElasticPlan(bool sync, bool global, int unit, int replicas_to_aggregate)
    : sync_(sync), global_(global), unit_(unit), replicas_(replicas_to_aggregate) {}

void ElasticPlan::Start(int64_t step, const std::vector<int>& active) {
  (void)step;
  if (plan_ != active) ++version_;
  plan_ = active;
  joins_.clear();
}

int64_t ElasticPlan::Join(int worker, int64_t step, const std::vector<int>& active) {
  if (std::binary_search(plan_.begin(), plan_.end(), worker)) {
    joins_.erase(worker);
    return step;
  }
  if (!sync_) {
    return step;  // Changed() records it
  }
  if (Needed(active) == 0) {
    // Nobody of the plan is left to decide the step: the worker takes it up at once.
    plan_.push_back(worker);
    std::sort(plan_.begin(), plan_.end());
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

std::string ElasticPlan::Advance(int64_t decided, const std::vector<int>& active) {
  if (!global_) cursor_ += static_cast<int64_t>(plan_.size());
  std::vector<int> next;
  for (int w : active) {
    auto it = joins_.find(w);
    if (it != joins_.end() && it->second > decided + 1) continue;
    next.push_back(w);
    if (it != joins_.end()) joins_.erase(it);
  }
  if (next == plan_) return "";
  const std::vector<int> before = std::move(plan_);
  plan_ = std::move(next);
  ++version_;
  return Describe(decided + 1, before, plan_);
}

std::string ElasticPlan::Changed(int64_t step, const std::vector<int>& active) {
  if (active == plan_) return "";
  const std::vector<int> before = std::move(plan_);
  plan_ = active;
  ++version_;
  return Describe(step, before, plan_);
}

ElasticView ElasticPlan::View(int64_t step, int worker, bool take_batch) {
  (void)worker;
  ElasticView v;
  v.version = version_;
  v.workers = plan_;
  v.aggregating = aggregating();
  v.unit = unit_;
  if (sync_) {
    v.first_batch = global_ ? step : cursor_;
  } else {
    v.first_batch = take_batch ? cursor_++ : -1;
  }
  return v;
}

int ElasticPlan::aggregating() const {
  const int n = static_cast<int>(plan_.size());
  return replicas_ > 0 ? std::min(replicas_, n) : n;
}

int64_t ElasticPlan::global_batch() const {
  return global_ ? unit_ : static_cast<int64_t>(unit_) * static_cast<int64_t>(plan_.size());
}

std::string ElasticPlan::Describe(int64_t step, const std::vector<int>& before, const std::vector<int>& after) const {
  const std::vector<int> joined = Minus(after, before), left = Minus(before, after);
  std::string what;
  if (!joined.empty()) what = Phrase(joined, "joined");
  if (!left.empty()) absl::StrAppend(&what, what.empty() ? "" : ", ", Phrase(left, "left"));
  if (sync_) {
    return absl::StrCat("step ", step, ": ", what, " (", after.size(), " worker", after.size() == 1 ? "" : "s",
                        ", aggregating ", aggregating(), ", global batch ", global_batch(), ")");
  }
  return absl::StrCat("step ", step, ": ", what, " (", after.size(), " worker", after.size() == 1 ? "" : "s",
                      ", async, batch ", unit_, " each)");
}

}  // namespace dtrain::ps
