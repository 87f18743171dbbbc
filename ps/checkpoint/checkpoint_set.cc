#include "ps/checkpoint/checkpoint_set.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps/checkpoint/checkpoint_dir.h"

namespace dtrain::ps {
namespace {

// Reads the files of `step` with `num_ps` tasks from `files` (all present), ordered by task.
absl::StatusOr<std::vector<CheckpointData>> ReadStep(Env* env, const std::vector<CheckpointFile>& files,
                                                     int64_t step, int num_ps, const std::string& what) {
  std::vector<const CheckpointFile*> by_task(num_ps, nullptr);
  for (const CheckpointFile& f : files) {
    if (f.step == step && f.num_ps == num_ps) by_task[f.task] = &f;
  }
  std::vector<CheckpointData> parts;
  for (int t = 0; t < num_ps; ++t) {
    if (by_task[t] == nullptr) {
      return absl::NotFoundError(absl::StrCat(what, ": the file of ps task ", t, " of ", num_ps, " is missing"));
    }
    ASSIGN_OR_RETURN(CheckpointData d, ReadCheckpoint(env, by_task[t]->path));
    if (d.task_index != t || d.num_ps != num_ps || d.global_step != step) {
      return absl::DataLossError(absl::StrCat(by_task[t]->path, ": holds task ", d.task_index, " of ", d.num_ps,
                                              " at step ", d.global_step, ", its name says otherwise"));
    }
    parts.push_back(std::move(d));
  }
  return parts;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointData>> ReadCheckpointSet(Env* env, const std::string& prefix_or_dir) {
  if (env->IsDirectory(prefix_or_dir)) {
    ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(env, prefix_or_dir));
    // Complete (step, num_ps) sets, newest first.
    std::map<std::pair<int64_t, int>, int> counts;
    for (const CheckpointFile& f : files) ++counts[{f.step, f.num_ps}];
    for (auto it = counts.rbegin(); it != counts.rend(); ++it) {
      const auto [step, num_ps] = it->first;
      const std::string what = CheckpointPrefix(prefix_or_dir, step);
      if (it->second != num_ps) {
        LOG(WARNING) << "skipping incomplete checkpoint " << what << " (" << it->second << " of " << num_ps
                     << " ps files); trying the previous one";
        continue;
      }
      absl::StatusOr<std::vector<CheckpointData>> parts = ReadStep(env, files, step, num_ps, what);
      if (parts.ok()) return parts;
      if (!absl::IsDataLoss(parts.status()) && !absl::IsNotFound(parts.status())) return parts.status();
      LOG(WARNING) << "skipping corrupt checkpoint " << what << ": " << parts.status().message()
                   << "; trying the previous one";
    }
    return absl::NotFoundError(absl::StrCat("no complete, valid checkpoint in directory '", prefix_or_dir,
                                            "' (", files.size(), " checkpoint files there)"));
  }
  const std::string dir = ParentDir(prefix_or_dir);
  const std::string name = prefix_or_dir.substr(prefix_or_dir.find_last_of('/') + 1);  // npos + 1 == 0
  CheckpointFile probe;
  if (!ParseCheckpointFileName(name + ".ps0-of-1", &probe)) {
    return absl::InvalidArgumentError(absl::StrCat("'", prefix_or_dir,
                                                   "' is neither a directory nor a checkpoint prefix "
                                                   "<dir>/model.ckpt-<step>"));
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(env, dir));
  std::set<int> num_ps_seen;
  std::set<int64_t> steps;
  for (const CheckpointFile& f : files) {
    steps.insert(f.step);
    if (f.step == probe.step) num_ps_seen.insert(f.num_ps);
  }
  if (num_ps_seen.empty()) {
    std::string there;
    for (int64_t s : steps) absl::StrAppend(&there, there.empty() ? "" : ", ", s);
    return absl::NotFoundError(absl::StrCat("no checkpoint files ", prefix_or_dir, ".ps*-of-* (steps in '", dir,
                                            "': ", there.empty() ? "none" : there, ")"));
  }
  if (num_ps_seen.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(prefix_or_dir, " has files for ", num_ps_seen.size(),
                                                   " different numbers of ps tasks; remove the stale ones"));
  }
  return ReadStep(env, files, probe.step, *num_ps_seen.begin(), prefix_or_dir);
}

absl::StatusOr<std::vector<float>> AssembleFlatBuffer(const std::vector<CheckpointData>& parts,
                                                      int64_t total_floats, bool moving_averages) {
  if (parts.empty()) return absl::InvalidArgumentError("no checkpoint files to assemble");
  std::vector<float> flat(total_floats, 0.0f);
  std::vector<char> covered(total_floats, 0);
  for (const CheckpointData& d : parts) {
    if (d.model_signature != parts[0].model_signature || d.global_step != parts[0].global_step ||
        d.num_ps != parts[0].num_ps) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the files of ps tasks 0 and ", d.task_index, " disagree (model '", parts[0].model_signature, "' vs '",
          d.model_signature, "', step ", parts[0].global_step, " vs ", d.global_step, ")"));
    }
    if (moving_averages && !d.has_moving_averages) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint of step ", d.global_step, " (ps task ", d.task_index,
                       ") keeps no moving averages: trained with --moving_average_decay=0?"));
    }
    for (const SliceState& s : d.slices) {
      // Compared without the sum, which a hostile offset near INT64_MAX would overflow.
      if (s.spec.flat_offset < 0 || s.spec.length < 0 || s.spec.length > total_floats ||
          s.spec.flat_offset > total_floats - s.spec.length) {
        return absl::FailedPreconditionError(absl::StrCat("slice ", DescribeSlice(s.spec), " of ps task ",
                                                          d.task_index, " lies beyond the model's ",
                                                          total_floats, " parameters"));
      }
      const std::vector<float>& src = moving_averages ? s.moving_average : s.values;
      for (int64_t j = 0; j < s.spec.length; ++j) {
        const int64_t k = s.spec.flat_offset + j;
        if (covered[k]) {
          return absl::FailedPreconditionError(absl::StrCat("slice ", DescribeSlice(s.spec), " of ps task ",
                                                            d.task_index, " overlaps another slice at ", k));
        }
        covered[k] = 1;
        flat[k] = src[j];
      }
    }
  }
  const auto gap = std::find(covered.begin(), covered.end(), 0);
  if (gap != covered.end()) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint does not cover parameter ",
                                                      gap - covered.begin(), " of ", total_floats,
                                                      " (files of a ps task missing, or another model?)"));
  }
  return flat;
}

}  // namespace dtrain::ps
