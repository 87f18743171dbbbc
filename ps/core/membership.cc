#include "ps/core/membership.h"

#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ps/api/ps_interface.h"

namespace dtrain::ps {

Membership::Membership(int slots, int task, int initial)
    : task_(task), initial_(initial > 0 && initial < slots ? initial : slots), workers_(slots) {
  for (int w = 0; w < slots; ++w) {
    workers_[w].stats.worker_id = w;
    workers_[w].present = w < initial_;
  }
  std::random_device rd;
  random_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
}

absl::Status Membership::CheckWorker(int worker) const {
  if (worker < 0 || worker >= num_workers()) {
    if (worker >= initial_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker id ", worker, " is out of range [0, ", num_workers(), "): ps task ", task_, " takes at most ",
          num_workers(), " workers (the cluster spec has ", initial_,
          num_workers() > initial_ ? "; --max_workers is set to that"
                                   : "; start the ps tasks with --max_workers=N to let more join",
          ")"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("worker id ", worker, " is out of range [0, ", num_workers(), ")"));
  }
  return absl::OkStatus();
}

std::vector<int> Membership::present_workers() const {
  std::vector<int> out;
  for (int w = 0; w < num_workers(); ++w) {
    if (present(w)) out.push_back(w);
  }
  return out;
}

std::vector<int> Membership::active_workers() const {
  std::vector<int> out;
  for (int w = 0; w < num_workers(); ++w) {
    if (active(w)) out.push_back(w);
  }
  return out;
}

void Membership::StartLeases(absl::Time now, int64_t step) {
  for (Worker& w : workers_) {
    if (w.session != 0 || !w.present) continue;
    w.last_contact = now;
    w.stats.present_at_step = step;
  }
}

uint64_t Membership::Register(int worker, absl::Time now, int64_t step) {
  Worker& w = workers_[worker];
  do {
    w.session = random_();
  } while (w.session == 0);
  w.last_contact = now;
  w.stats.present_at_step = step;
  w.stats.lost = false;
  w.present = true;
  w.removed.clear();  // registering again after a removal: an operator started it anew
  return w.session;
}

absl::Status Membership::CheckSession(int worker, uint64_t session, absl::Time now) {
  Worker& w = workers_[worker];
  if (w.session == 0) {
    return absl::AbortedError(absl::StrCat("ps task ", task_, " has no session for worker ", worker,
                                           (w.stats.lost ? " (declared lost: no contact for too long)"
                                                         : " (the task restarted or rolled back)"),
                                           ": register again"));
  }
  if (session != w.session) {
    return absl::PermissionDeniedError(absl::StrCat("worker ", worker, "'s session on ps task ", task_,
                                                    " is another one: a newer process registered as worker ",
                                                    worker));
  }
  w.last_contact = now;
  if (!w.removed.empty()) return RemovedError(w.removed);
  return absl::OkStatus();
}

absl::Status Membership::CheckLeave(int worker, uint64_t session) const {
  const Worker& w = workers_[worker];
  if (w.session != 0 && session != w.session) {
    return absl::PermissionDeniedError(absl::StrCat("worker ", worker, "'s session on ps task ", task_,
                                                    " is another one: a newer process registered as worker ",
                                                    worker, "; this one cannot report it done"));
  }
  return absl::OkStatus();
}

void Membership::ResetSessions(absl::Time now, int64_t step) {
  for (Worker& w : workers_) {
    w.session = 0;
    w.last_contact = now;
    w.stats.present_at_step = step;
  }
}

void Membership::RenewLeases(absl::Time now) {
  for (int i = 0; i < num_workers(); ++i) {
    if (active(i)) workers_[i].last_contact = now;
  }
}

std::vector<int> Membership::ExpireLeases(absl::Time now, absl::Duration lease, int64_t step) {
  std::vector<int> lost;
  for (int i = 0; i < num_workers(); ++i) {
    Worker& w = workers_[i];
    if (!active(i) || now - w.last_contact <= lease) continue;
    w.stats.lost = true;
    ++w.stats.times_lost;
    w.stats.leaving = Leaving::kFailed;
    w.stats.left_at_step = step;
    w.stats.reason = absl::StrCat("no contact for ", absl::FormatDuration(lease));
    w.session = 0;
    lost.push_back(i);
  }
  return lost;
}

std::vector<int> Membership::ExpireAll(int64_t step, const std::string& why) {
  std::vector<int> lost;
  for (int i = 0; i < num_workers(); ++i) {
    Worker& w = workers_[i];
    if (!active(i)) continue;
    w.stats.lost = true;
    ++w.stats.times_lost;
    w.stats.leaving = Leaving::kFailed;
    w.stats.left_at_step = step;
    w.stats.reason = why;
    w.session = 0;
    lost.push_back(i);
  }
  return lost;
}

bool Membership::Rejoin(int worker) {
  WorkerStats& s = workers_[worker].stats;
  if (!s.done || s.leaving == Leaving::kCompleted) return false;
  s.done = false;
  s.failed = false;
  s.left_at_step = -1;
  s.reason.clear();
  workers_[worker].removed.clear();
  return true;
}

bool Membership::MarkDone(int worker, Leaving leaving, int64_t step, std::string reason) {
  WorkerStats& s = workers_[worker].stats;
  if (s.done) return false;
  workers_[worker].present = true;  // a worker that leaves before it joined (refused) is still reported
  s.done = true;
  s.failed = leaving != Leaving::kCompleted;
  s.leaving = leaving;
  s.left_at_step = step;
  s.reason = std::move(reason);
  return true;
}

bool Membership::any_completed() const {
  for (const Worker& w : workers_) {
    if (w.stats.done && !w.stats.failed) return true;
  }
  return false;
}

int Membership::num_active() const {
  int n = 0;
  for (int w = 0; w < num_workers(); ++w) n += active(w);
  return n;
}

int Membership::num_done() const {
  int n = 0;
  for (int w = 0; w < num_workers(); ++w) n += done(w);
  return n;
}

bool Membership::AnotherActive(int worker) const {
  for (int w = 0; w < num_workers(); ++w) {
    if (w != worker && active(w)) return true;
  }
  return false;
}

std::vector<int> Membership::lost_workers() const {
  std::vector<int> out;
  for (int w = 0; w < num_workers(); ++w) {
    if (lost(w)) out.push_back(w);
  }
  return out;
}

std::vector<WorkerStats> Membership::AllStats() const {
  std::vector<WorkerStats> out;
  out.reserve(workers_.size());
  for (const Worker& w : workers_) {
    if (w.present) out.push_back(w.stats);
  }
  return out;
}

void Membership::RecordInputPosition(int worker, int64_t step, std::string position) {
  Worker& w = workers_[worker];
  w.positions[step] = std::move(position);
  while (w.positions.size() > 4) w.positions.erase(w.positions.begin());  // checkpoints look one step back
  w.restored_position.clear();
}

std::map<int, std::string> Membership::InputPositionsBefore(int64_t label) const {
  std::map<int, std::string> out;
  for (int i = 0; i < num_workers(); ++i) {
    const std::map<int64_t, std::string>& p = workers_[i].positions;
    auto it = p.lower_bound(label);  // the first step >= label
    if (it == p.begin()) continue;
    out[i] = std::prev(it)->second;
  }
  return out;
}

void Membership::RestoreInputPositions(const std::map<int, std::string>& positions, int64_t label) {
  for (int i = 0; i < num_workers(); ++i) {
    Worker& w = workers_[i];
    w.positions.clear();
    w.restored_position.clear();
    auto it = positions.find(i);
    if (it == positions.end()) continue;
    w.positions[label - 1] = it->second;
    w.restored_position = it->second;
  }
}

std::string Membership::ResumeInputPosition(int worker) const {
  const Worker& w = workers_[worker];
  if (!w.restored_position.empty() || w.positions.empty()) return w.restored_position;
  return w.positions.rbegin()->second;
}

}  // namespace dtrain::ps
