#include "ps/api/ps_types.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dtrain::ps {

const char* LeavingName(Leaving leaving) {
  switch (leaving) {
    case Leaving::kCompleted:
      return "completed";
    case Leaving::kFailed:
      return "failed";
    case Leaving::kRefused:
      return "refused";
    case Leaving::kStopped:
      return "stopped";
    case Leaving::kPeerFailed:
      return "peer failed";
  }
  return "unknown";
}

namespace {

bool LeftEarly(const WorkerStats& w) { return w.lost || (w.done && w.failed); }

// A worker lost that this task last knew present at the last step or later missed no step: when a ps task
// restarts after the end (its state restored at the last step), a worker that had reported done to the old
// process is not heard from again, and the new one can only see it lost. It does not make the run degraded. (A
// worker lost in the middle of a run stays degraded however late its lease ran out: it was last present then.)
bool LostAfterTheEnd(const WorkerStats& w, int64_t train_steps) {
  return w.lost && !w.done && train_steps > 0 && w.present_at_step >= train_steps;
}

}  // namespace

bool EndedByRefusal(const std::string& why) { return why.rfind(kConfigurationRefused, 0) == 0; }

bool EndedByStop(const std::string& why) { return absl::StrContains(why, " was stopped "); }

std::string DescribeLeftEarly(const std::vector<WorkerStats>& workers) {
  std::string out;
  for (const WorkerStats& w : workers) {
    if (!LeftEarly(w)) continue;
    absl::StrAppend(&out, out.empty() ? "" : "; ", "worker ", w.worker_id, " (",
                    w.lost ? "lost" : LeavingName(w.leaving));
    if (w.left_at_step >= 0) absl::StrAppend(&out, " at step ", w.left_at_step);
    if (!w.reason.empty()) absl::StrAppend(&out, ": ", w.reason);
    out += ")";
  }
  return out;
}

RunOutcome SummarizeRun(const std::vector<WorkerStats>& workers, int64_t global_step, int64_t train_steps,
                        const std::string& job_ended, std::string* line, bool elastic) {
  const std::string of = train_steps > 0 ? absl::StrCat(" of ", train_steps) : "";
  bool any_completed = false, any_left = false;
  std::vector<WorkerStats> early;  // the workers that left before the end
  std::string after_end;           // "worker 1", "worker 1, worker 2": lost after the last step
  for (const WorkerStats& w : workers) {
    any_completed = any_completed || (w.done && !w.failed);
    if (LostAfterTheEnd(w, train_steps)) {
      absl::StrAppend(&after_end, after_end.empty() ? "" : ", ", "worker ", w.worker_id);
      continue;
    }
    early.push_back(w);
    any_left = any_left || LeftEarly(w);
  }
  const std::string left = DescribeLeftEarly(early);
  if (!job_ended.empty()) {
    *line = absl::StrCat("run ended early at step ", global_step, of, ": ", job_ended);
    return EndedByRefusal(job_ended) ? RunOutcome::kRefused : RunOutcome::kEndedEarly;
  }
  if (!any_completed) {
    *line = absl::StrCat("run ended early at step ", global_step, of, ": no worker is left to complete it",
                         left.empty() ? "" : absl::StrCat(" (", left, ")"));
    return RunOutcome::kEndedEarly;
  }
  if (!any_left) {
    *line = absl::StrCat("run complete: training reached step ", global_step, of, "; ");
    if (after_end.empty()) {
      absl::StrAppend(line, "all ", workers.size(), " worker", workers.size() == 1 ? "" : "s", " completed");
    } else {
      absl::StrAppend(line, after_end, " not heard from after the last step (no step was trained without ",
                      absl::StrContains(after_end, ",") ? "them" : "it", ")");
    }
    return RunOutcome::kComplete;
  }
  if (elastic && (train_steps == 0 || global_step >= train_steps)) {
    // Workers come and go in an elastic job: the run is complete when it reached its end with someone.
    *line = absl::StrCat("run complete: training reached step ", global_step, of, "; ", workers.size(),
                         " workers took part; left before the end: ", left);
    return RunOutcome::kComplete;
  }
  *line = absl::StrCat("run degraded: training reached step ", global_step, of, " without ", left);
  return RunOutcome::kDegraded;
}

namespace {

inline uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t Mix64(uint64_t x) { return Mix(x); }

int OptimizerConfig::num_slots() const {
  // Mirrors kernels::OptimizerParams::num_slots() (ps/core/optimizer_test.cc checks that they agree).
  if (name == "momentum" || name == "adagrad" || name == "pytorch_adagrad") return 1;
  if (name == "adam" || name == "pytorch_adam" || name == "adamw") return 2;
  if (name == "rmsprop" || name == "pytorch_rmsprop") return 1 + (momentum > 0.0f ? 1 : 0) + (centered ? 1 : 0);
  return 0;
}

bool OptimizerConfig::operator==(const OptimizerConfig& o) const {
  return name == o.name && learning_rate == o.learning_rate && lr_schedule == o.lr_schedule &&
         decay_steps == o.decay_steps && decay_rate == o.decay_rate && staircase == o.staircase &&
         min_learning_rate == o.min_learning_rate && warmup_steps == o.warmup_steps &&
         warmup_start_factor == o.warmup_start_factor && momentum == o.momentum && nesterov == o.nesterov &&
         beta1 == o.beta1 && beta2 == o.beta2 && epsilon == o.epsilon && weight_decay == o.weight_decay &&
         rho == o.rho && centered == o.centered && initial_accumulator == o.initial_accumulator &&
         clip_norm == o.clip_norm;
}

bool SparseTableSpec::operator==(const SparseTableSpec& o) const {
  return table == o.table && name == o.name && dim == o.dim && rows == o.rows && init_scale == o.init_scale &&
         init_seed == o.init_seed && max_rows == o.max_rows && admit_after == o.admit_after &&
         initial_values == o.initial_values && ttl_steps == o.ttl_steps && ttl_secs == o.ttl_secs &&
         admit_probability == o.admit_probability && row_dtype == o.row_dtype && slot_dtype == o.slot_dtype;
}

absl::StatusOr<RowDtype> ParseRowDtype(absl::string_view name) {
  if (name == "fp32") return RowDtype::kF32;
  if (name == "fp16") return RowDtype::kF16;
  if (name == "bf16") return RowDtype::kBF16;
  return absl::InvalidArgumentError(absl::StrCat("row dtype '", name, "': expected fp32, fp16 or bf16"));
}

const char* RowDtypeName(RowDtype d) {
  switch (d) {
    case RowDtype::kF32:
      return "fp32";
    case RowDtype::kF16:
      return "fp16";
    case RowDtype::kBF16:
      return "bf16";
  }
  return "?";
}

int SparseOptimizerConfig::num_slots() const {
  if (name == "adagrad") return 1;
  if (name == "adam" || name == "ftrl") return 2;
  return 0;
}

bool SparseOptimizerConfig::operator==(const SparseOptimizerConfig& o) const {
  return name == o.name && learning_rate == o.learning_rate && initial_accumulator == o.initial_accumulator &&
         beta1 == o.beta1 && beta2 == o.beta2 && epsilon == o.epsilon && l1 == o.l1 && l2 == o.l2 &&
         lr_power == o.lr_power;
}

int ShardOfId(int64_t id, int num_ps) {
  if (num_ps <= 1) return 0;
  return static_cast<int>(Mix64(static_cast<uint64_t>(id) ^ 0x5D5A0B7E5D5A0B7EULL) % static_cast<uint64_t>(num_ps));
}

void SparseInitialRow(const SparseTableSpec& table, int64_t id, float* row) {
  const uint64_t key = Mix(table.init_seed ^ Mix(static_cast<uint64_t>(table.table) + 1) ^
                           Mix(static_cast<uint64_t>(id) * 0xD6E8FEB86659FD93ULL));
  // Inlined so that the loop vectorizes (a row's creation was mostly this function).
  for (int k = 0; k < table.dim; ++k) {
    const uint64_t bits = Mix(key + static_cast<uint64_t>(k));
    const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
    row[k] = static_cast<float>((2.0 * u - 1.0) * table.init_scale);
  }
}

std::string DescribeMembershipChange(int64_t step, const std::vector<int>& before, const std::vector<int>& after,
                                     bool sync, int aggregating, int64_t global_batch, bool again) {
  std::vector<int> joined, left;
  for (int w : after) {
    if (std::find(before.begin(), before.end(), w) == before.end()) joined.push_back(w);
  }
  for (int w : before) {
    if (std::find(after.begin(), after.end(), w) == after.end()) left.push_back(w);
  }
  auto phrase = [](const std::vector<int>& ws, const char* what) {
    return absl::StrCat(ws.size() == 1 ? "worker " : "workers ", absl::StrJoin(ws, ", "), " ", what);
  };
  std::string what;
  if (!joined.empty()) what = phrase(joined, "joined");
  if (!left.empty()) absl::StrAppend(&what, what.empty() ? "" : ", ", phrase(left, "left"));
  if (what.empty()) what = "the membership changed";
  const size_t n = after.size();
  const std::string workers = absl::StrCat(n, " worker", n == 1 ? "" : "s");
  if (!sync) return absl::StrCat("step ", step, ": ", what, " (", workers, ", async, batch ", global_batch, " each)");
  return absl::StrCat("step ", step, ": ", what, " (", workers, ", aggregating ", aggregating, ", global batch ",
                      global_batch, ")", again ? absl::StrCat("; step ", step, " is computed again") : "");
}

}  // namespace dtrain::ps
