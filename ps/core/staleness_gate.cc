#include "ps/core/staleness_gate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dtrain::ps {

StalenessGate::StalenessGate(int num_workers, int max_staleness)
    : max_staleness_(max_staleness), clock_(num_workers, 0), histogram_(kBuckets, 0) {}

void StalenessGate::RecordCommit(int worker, int64_t staleness) {
  ++histogram_[std::min<int64_t>(staleness, kBuckets - 1)];
  max_seen_ = std::max(max_seen_, staleness);
  ++clock_[worker];
}

int64_t StalenessGate::MinActiveClock(const Membership& members) const {
  int64_t min_clock = -1;
  for (int w = 0; w < members.num_workers(); ++w) {
    if (!members.done(w) && (min_clock < 0 || clock_[w] < min_clock)) min_clock = clock_[w];
  }
  return min_clock;
}

bool StalenessGate::MustWait(int worker, const Membership& members) const {
  if (max_staleness_ < 0 || members.done(worker)) return false;
  return clock_[worker] - MinActiveClock(members) > max_staleness_;
}

std::string StalenessGate::DescribeWait(int worker, const Membership& members) const {
  return absl::StrCat("the slowest worker (worker ", worker, " has ", clock_[worker],
                      " commits, the slowest active worker ", MinActiveClock(members), ", max_staleness ",
                      max_staleness_, ")");
}

}  // namespace dtrain::ps
