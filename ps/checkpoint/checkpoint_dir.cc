#include "ps/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "ps/checkpoint/checkpoint_reshard.h"
#include "glog/logging.h"

namespace dtrain::ps {

std::string CheckpointPrefix(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, dir.empty() || dir.back() == '/' ? "" : "/", "model.ckpt-", step);
}

std::string CheckpointPath(const std::string& dir, int64_t step, int task, int num_ps) {
  return absl::StrCat(CheckpointPrefix(dir, step), ".ps", task, "-of-", num_ps);
}

bool ParseCheckpointFileName(absl::string_view name, CheckpointFile* out) {
  constexpr absl::string_view kPrefix = "model.ckpt-";
  if (!absl::ConsumePrefix(&name, kPrefix)) return false;
  const size_t dot = name.find(".ps");
  if (dot == absl::string_view::npos) return false;
  const absl::string_view step = name.substr(0, dot);
  const absl::string_view rest = name.substr(dot + 3);
  const size_t of = rest.find("-of-");
  if (of == absl::string_view::npos) return false;
  int64_t s = 0;
  int task = 0, num_ps = 0;
  auto digits = [](absl::string_view v) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (!digits(step) || !digits(rest.substr(0, of)) || !digits(rest.substr(of + 4))) return false;
  if (!absl::SimpleAtoi(step, &s) || !absl::SimpleAtoi(rest.substr(0, of), &task) ||
      !absl::SimpleAtoi(rest.substr(of + 4), &num_ps) || num_ps < 1 || task >= num_ps) {
    return false;
  }
  out->step = s;
  out->task = task;
  out->num_ps = num_ps;
  return true;
}

absl::StatusOr<std::vector<CheckpointFile>> ListCheckpointFiles(Env* env, const std::string& dir) {
  std::vector<CheckpointFile> files;
  if (!env->FileExists(dir)) return files;
  absl::StatusOr<std::vector<std::string>> names = env->GetChildren(dir);
  if (absl::IsNotFound(names.status())) return files;  // removed meanwhile
  if (!names.ok()) {
    return absl::Status(names.status().code(),
                        absl::StrCat("cannot list checkpoint directory: ", names.status().message()));
  }
  for (const std::string& name : *names) {
    CheckpointFile f;
    if (ParseCheckpointFileName(name, &f)) {
      f.path = absl::StrCat(dir, dir.back() == '/' ? "" : "/", name);
      files.push_back(std::move(f));
    }
  }
  std::sort(files.begin(), files.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
    return std::tie(a.step, a.task, a.num_ps) < std::tie(b.step, b.task, b.num_ps);
  });
  return files;
}

absl::StatusOr<CheckpointData> ReadCheckpoint(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, env->ReadFile(path));
  return ParseCheckpoint(bytes, path);
}

namespace {

// The sparse tables: the same tables (name, dim, rows, initializer) and sparse optimizer. max_rows and
// admit_after are memory settings a resumed run may change (rows beyond a smaller max_rows are evicted).
absl::Status CheckTablesCompatible(const CheckpointData& data, const std::string& path, const TrainConfig& config,
                                   const std::string& hint) {
  if (data.tables.size() != config.tables.size()) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": holds ", data.tables.size(),
                                                      " sparse tables, this run has ", config.tables.size(),
                                                      data.tables.empty() ? " (written before format version 4, "
                                                                            "or by a model without tables)"
                                                                          : "",
                                                      hint));
  }
  if (config.tables.empty()) return absl::OkStatus();
  if (data.sparse_optimizer != config.sparse_optimizer.name) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": sparse tables trained with '", data.sparse_optimizer,
                                                      "', this run uses sparse_optimizer '",
                                                      config.sparse_optimizer.name, "'", hint));
  }
  for (size_t i = 0; i < config.tables.size(); ++i) {
    const SparseTableSpec &a = data.tables[i].spec, &b = config.tables[i];
    std::string diff;
    if (a.name != b.name) diff = absl::StrCat("name '", a.name, "' vs '", b.name, "'");
    else if (a.dim != b.dim) diff = absl::StrCat("dim ", a.dim, " vs ", b.dim);
    else if (a.rows != b.rows) diff = absl::StrCat("rows ", a.rows, " vs ", b.rows);
    else if (a.init_scale != b.init_scale) diff = absl::StrCat("init_scale ", a.init_scale, " vs ", b.init_scale);
    else if (a.init_seed != b.init_seed) diff = absl::StrCat("init_seed ", a.init_seed, " vs ", b.init_seed);
    if (!diff.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(path, ": sparse table ", i, " differs: ", diff,
                                                        " (checkpoint vs this run)", hint));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {
constexpr char kHint[] =
    "; restore needs the same model and optimizer as the run that wrote it: use another --checkpoint_dir (or "
    "remove the old checkpoints) to start afresh";
}  // namespace

absl::Status CheckModelCompatible(const CheckpointData& data, const std::string& path, const TrainConfig& config) {
  const std::string hint = kHint;
  if (data.model_signature != config.model_signature) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": checkpoint of another model (signature '",
                                                      data.model_signature, "', this run has '",
                                                      config.model_signature, "')", hint));
  }
  if (data.optimizer != config.optimizer.name) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": written with optimizer '", data.optimizer,
                                                      "', this run uses '", config.optimizer.name, "'", hint));
  }
  if (data.num_slots != config.optimizer.num_slots()) {
    // The same optimizer with another slot layout (rmsprop's momentum or centered changed).
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": written with ", data.num_slots, " optimizer slots per value, this run's '", config.optimizer.name,
        "' keeps ", config.optimizer.num_slots(), " (rmsprop: 1, +1 with momentum > 0, +1 when centered)", hint));
  }
  return CheckTablesCompatible(data, path, config, hint);
}

absl::Status CheckCompatible(const CheckpointData& data, const std::string& path, const TrainConfig& config,
                             int task, int num_ps) {
  const std::string hint = kHint;
  if (data.task_index != task || data.num_ps != num_ps) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": written by ps task ", data.task_index, " of ",
                                                      data.num_ps, ", this is ps task ", task, " of ", num_ps,
                                                      hint));
  }
  RETURN_IF_ERROR(CheckModelCompatible(data, path, config));
  std::map<uint32_t, const SliceSpec*> want;
  for (const SliceSpec& s : config.slices) want[s.key] = &s;
  if (want.size() != data.slices.size()) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": holds ", data.slices.size(),
                                                      " slices, this ps task is configured with ", want.size(),
                                                      " (another variable placement)", hint));
  }
  for (const SliceState& s : data.slices) {
    auto it = want.find(s.spec.key);
    if (it == want.end() || !(*it->second == s.spec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": slice ", DescribeSlice(s.spec), " does not match this ps task's slice ",
          it == want.end() ? std::string("(no such key)") : DescribeSlice(*it->second),
          " (another variable placement: --min_slice_bytes or the number of ps tasks changed?)", hint));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<RestorableCheckpoint>> FindCheckpointToRestore(Env* env, const std::string& dir,
                                                                           const TrainConfig& config, int task,
                                                                           int num_ps, int64_t restore_step) {
  if (restore_step == kRestoreNone || dir.empty()) return std::nullopt;
  if (restore_step < 0 && restore_step != kRestoreNewest) {
    return absl::InvalidArgumentError(absl::StrCat("restore_step ", restore_step, " is not a step, ",
                                                   kRestoreNewest, " (newest) or ", kRestoreNone, " (none)"));
  }
  // Newest first: the steps with a file of this task, or a complete checkpoint of another number of ps tasks.
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, CandidateSteps(env, dir, task, num_ps));
  if (steps.empty()) {
    ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(env, dir));
    for (auto it = files.rbegin(); it != files.rend(); ++it) {
      if (it->num_ps == num_ps) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint directory '", dir, "' holds checkpoints written by ", it->num_ps, " ps tasks (e.g. ",
          it->path, "), but none complete (a file of every task for one step), so none can be resharded onto this "
          "cluster's ", num_ps, ": restore the missing files, or use another --checkpoint_dir to start afresh"));
    }
    return std::nullopt;
  }
  std::optional<RestorableCheckpoint> found;
  if (restore_step >= 0) {
    absl::Status problem;
    const bool missing = std::find(steps.begin(), steps.end(), restore_step) == steps.end();
    if (missing) {
      problem = absl::FailedPreconditionError(absl::StrCat(
          "ps task ", task, " has no checkpoint for step ", restore_step, " (the step ps task 0 restored) in '",
          dir, "'; its newest is step ", steps.front(),
          ": the checkpoint files of the ps tasks are out of step; restore them together or start afresh"));
    } else {
      absl::StatusOr<RestorableCheckpoint> r =
          ReadCheckpointForTask(env, dir, restore_step, config, task, num_ps);
      if (r.ok()) {
        found = *std::move(r);
      } else {
        problem = r.status();
      }
    }
    if (!found.has_value()) {
      // Sync: every task must hold that very step. A checkpoint of another model is refused in any mode.
      if (config.mode == "sync" || (!missing && absl::IsFailedPrecondition(problem))) return problem;
      LOG(WARNING) << "ps task " << task << ": cannot restore step " << restore_step << " like ps task 0 ("
                   << problem.message() << "); async mode: restoring this task's newest valid checkpoint instead";
    }
  }
  if (!found.has_value()) {
    int skipped = 0;
    for (size_t i = 0; i < steps.size() && !found.has_value(); ++i) {
      absl::StatusOr<RestorableCheckpoint> r = ReadCheckpointForTask(env, dir, steps[i], config, task, num_ps);
      if (r.ok()) {
        found = *std::move(r);
      } else if (absl::IsDataLoss(r.status()) || absl::IsNotFound(r.status())) {
        ++skipped;
        const std::string own = CheckpointPath(dir, steps[i], task, num_ps);
        LOG(WARNING) << "skipping corrupt checkpoint " << (env->FileExists(own) ? own : CheckpointPrefix(dir, steps[i]))
                     << ": " << r.status().message()
                     << (i + 1 < steps.size() ? "; trying the previous one" : "; no older one left");
      } else {
        // A checkpoint of another model or layout is refused, never skipped: two runs never mix their files.
        return r.status();
      }
    }
    if (!found.has_value()) {
      LOG(WARNING) << "ps task " << task << ": no valid checkpoint in '" << dir << "' (" << skipped
                   << " corrupt checkpoints skipped): starting from the chief's initial values";
      return std::nullopt;
    }
  }
  return found;
}

absl::Status PruneCheckpoints(Env* env, const std::string& dir, int task, int num_ps, int keep) {
  if (keep <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(env, dir));
  std::vector<const CheckpointFile*> mine;
  for (const CheckpointFile& f : files) {
    if (f.task == task && f.num_ps == num_ps) mine.push_back(&f);
  }
  absl::Status first_error;
  for (size_t i = 0; i + keep < mine.size(); ++i) {  // sorted by step: the oldest first
    absl::Status s = env->RemoveFile(mine[i]->path);
    if (!s.ok() && !absl::IsNotFound(s)) {
      s = absl::Status(s.code(), absl::StrCat("cannot delete old checkpoint: ", s.message()));
      LOG(WARNING) << s.message();
      if (first_error.ok()) first_error = s;
    }
  }
  return first_error;
}

}  // namespace dtrain::ps
