#include "ps/membership.h"

#include "absl/strings/str_cat.h"

namespace dtrain::ps {

Membership::Membership(int num_workers) : workers_(num_workers) {
  for (int w = 0; w < num_workers; ++w) workers_[w].stats.worker_id = w;
}

absl::Status Membership::CheckWorker(int worker) const {
  if (worker < 0 || worker >= num_workers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", worker, " is out of range [0, ", num_workers(), ")"));
  }
  return absl::OkStatus();
}

bool Membership::MarkDone(int worker) {
  if (workers_[worker].stats.done) return false;
  workers_[worker].stats.done = true;
  ++num_done_;
  return true;
}

bool Membership::AnotherActive(int worker) const {
  for (int w = 0; w < num_workers(); ++w) {
    if (w != worker && !workers_[w].stats.done) return true;
  }
  return false;
}

std::vector<WorkerStats> Membership::AllStats() const {
  std::vector<WorkerStats> out;
  out.reserve(workers_.size());
  for (const Worker& w : workers_) out.push_back(w.stats);
  return out;
}

}  // namespace dtrain::ps
