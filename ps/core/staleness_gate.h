// ps task 0 in async mode: each worker's clock (commits applied), the staleness histogram, and the bounded-
// staleness rule: a worker's Pull waits while its clock exceeds the slowest active worker's by more than
// max_staleness, so at the moment a Pull returns, clock - min clock <= max_staleness.
//
// Thread-safety: thread-compatible; the ParameterServer guards it with its lock.
#ifndef DTRAIN_PS_CORE_STALENESS_GATE_H_
#define DTRAIN_PS_CORE_STALENESS_GATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ps/core/membership.h"

namespace dtrain::ps {

class StalenessGate {
 public:
  static constexpr int kBuckets = 33;  // staleness 0..31, then ">= 32"

  // max_staleness < 0: unbounded (Pulls never wait here).
  StalenessGate(int num_workers, int max_staleness);

  // A commit computed `staleness` global steps ago was applied for `worker`.
  void RecordCommit(int worker, int64_t staleness);
  bool MustWait(int worker, const Membership& members) const;
  // Why a Pull of `worker` waits, for a timeout message.
  std::string DescribeWait(int worker, const Membership& members) const;

  const std::vector<int64_t>& histogram() const { return histogram_; }
  int64_t max_staleness_seen() const { return max_seen_; }

 private:
  int64_t MinActiveClock(const Membership& members) const;

  int max_staleness_;
  std::vector<int64_t> clock_;
  std::vector<int64_t> histogram_;
  int64_t max_seen_ = 0;
};

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CORE_STALENESS_GATE_H_
