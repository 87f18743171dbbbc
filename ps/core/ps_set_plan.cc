#include "ps/core/ps_set_plan.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain::ps {
namespace {

bool IsHostPort(const std::string& a) {
  const size_t colon = a.rfind(':');
  int port = 0;
  return colon != std::string::npos && colon > 0 && a.size() <= 255 &&
         absl::SimpleAtoi(a.substr(colon + 1), &port) && port > 0 && port < 65536 &&
         a.find_first_of(" ,;\t\n") == std::string::npos;
}

}  // namespace

absl::StatusOr<std::string> PsSetPlan::Add(const std::string& address) {
  if (!IsHostPort(address)) {
    return absl::InvalidArgumentError(absl::StrCat("add-ps '", address, "': not a host:port"));
  }
  if (hosts_.empty()) {
    return absl::FailedPreconditionError("this ps task was not told the job's ps hosts (--ps_hosts): it cannot add one");
  }
  if (pending() && leaving_.empty() && next_.size() == hosts_.size() + 1 && next_.back() == address) {
    // The same task asking again (dtrain_ps --join does while it waits, in case ps 0 restarted and lost the change).
    return absl::StrCat("ps task ", hosts_.size(), " (", address, ") joins at the next step boundary: ", next_.size(),
                        " ps tasks (asked before)");
  }
  if (pending()) {
    return absl::FailedPreconditionError(absl::StrCat("a change of the ps tasks is under way already (to ",
                                                      next_.size(),
                                                      " tasks): ask again once it is done"));
  }
  if (std::find(hosts_.begin(), hosts_.end(), address) != hosts_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(address, " is a ps task of the job already"));
  }
  next_ = hosts_;
  next_.push_back(address);
  leaving_.clear();
  move_step_ = -1;
  return absl::StrCat("ps task ", hosts_.size(), " (", address, ") joins at the next step boundary: ", next_.size(),
                      " ps tasks");
}

absl::StatusOr<std::string> PsSetPlan::Remove(int ps) {
  if (hosts_.empty()) {
    return absl::FailedPreconditionError("this ps task was not told the job's ps hosts (--ps_hosts): it cannot remove one");
  }
  if (pending()) {
    return absl::FailedPreconditionError(
        absl::StrCat("a change of the ps tasks is under way already (to ", next_.size(), " tasks): ask again once it is done"));
  }
  const int n = num_ps();
  if (ps < 0 || ps >= n) {
    return absl::FailedPreconditionError(absl::StrCat("remove-ps ", ps, ": the job has ps tasks 0..", n - 1));
  }
  if (n == 1) return absl::FailedPreconditionError("the job has one ps task: it cannot be removed (dtrain_ctl drain ends the job)");
  if (ps == 0) {
    return absl::FailedPreconditionError(
        "remove-ps 0: ps task 0 holds the global step and decides the steps: it stays while the job runs (dtrain_ctl "
        "drain ends the job)");
  }
  // The last task takes the leaving one's index; every other task keeps its own.
  next_.assign(hosts_.begin(), hosts_.end() - 1);
  if (ps != n - 1) next_[ps] = hosts_.back();
  leaving_ = {hosts_[ps]};
  move_step_ = -1;
  return absl::StrCat("ps task ", ps, " (", hosts_[ps], ") leaves at the next step boundary: ", next_.size(),
                      " ps task", next_.size() == 1 ? "" : "s",
                      ps != n - 1 ? absl::StrCat("; ps task ", n - 1, " (", hosts_.back(), ") becomes ps task ", ps)
                                  : std::string());
}

bool PsSetPlan::Decided(int64_t step) {
  if (!pending() || move_step_ >= 0) return false;
  move_step_ = step;
  return true;
}

PsSet PsSetPlan::View(int64_t step) const {
  PsSet v;
  if (pending() && move_step_ >= 0 && step >= move_step_) {
    v.version = version_ + 1;
    v.step = move_step_;
    v.hosts = next_;
    v.leaving = leaving_;
  } else if (version_ > 0) {
    v.version = version_;
    v.step = 0;
    v.hosts = hosts_;
  }
  return v;
}

absl::Status PsSetPlan::Moved(int num_ps, int64_t step) {
  if (!pending() || move_step_ < 0 || step != move_step_ || num_ps != static_cast<int>(next_.size())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no move onto ", num_ps, " ps tasks at step ", step, " was announced (",
        pending() ? absl::StrCat("the pending one is to ", next_.size(), " tasks at step ", move_step_)
                  : "none is pending",
        ")"));
  }
  hosts_ = std::move(next_);
  next_.clear();
  leaving_.clear();
  move_step_ = -1;
  ++version_;
  return absl::OkStatus();
}

absl::Status PsSetPlan::Adopt(const std::vector<std::string>& hosts, int64_t version, int num_ps) {
  if (pending()) {
    return absl::FailedPreconditionError(absl::StrCat("a change to ", next_.size(), " ps tasks is pending; the chief "
                                                      "restores onto ", num_ps));
  }
  if (static_cast<int>(hosts.size()) != num_ps || version <= 0) {
    return absl::FailedPreconditionError(absl::StrCat("the chief restores onto ", num_ps, " ps tasks but names ",
                                                      hosts.size(), " (version ", version, ")"));
  }
  hosts_ = hosts;
  version_ = version;
  return absl::OkStatus();
}

}  // namespace dtrain::ps
