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

absl::StatusOr<std::vector<SparseTableRows>> ReadSparseTables(const std::vector<CheckpointData>& parts) {
  if (parts.empty()) return absl::InvalidArgumentError("no checkpoint files to read tables from");
  const CheckpointData& first = parts[0];
  std::vector<SparseTableRows> out(first.tables.size());
  for (size_t t = 0; t < out.size(); ++t) out[t].spec = first.tables[t].spec;
  for (const CheckpointData& d : parts) {
    if (d.global_step != first.global_step || d.num_ps != first.num_ps || d.tables.size() != out.size()) {
      return absl::FailedPreconditionError(absl::StrCat("the files of ps tasks 0 and ", d.task_index,
                                                        " disagree (step ", first.global_step, " vs ",
                                                        d.global_step, ", ", out.size(), " vs ", d.tables.size(),
                                                        " sparse tables)"));
    }
    for (size_t t = 0; t < out.size(); ++t) {
      const SparseTableState& s = d.tables[t];
      const SparseTableSpec& spec = out[t].spec;
      if (s.spec.name != spec.name || s.spec.dim != spec.dim || s.spec.rows != spec.rows ||
          s.values.size() != s.ids.size() * static_cast<size_t>(spec.dim)) {
        return absl::FailedPreconditionError(absl::StrCat("sparse table ", t, " of ps task ", d.task_index, " ('",
                                                          s.spec.name, "', dim ", s.spec.dim, ") is not ps task 0's ('",
                                                          spec.name, "', dim ", spec.dim, ")"));
      }
      for (int64_t id : s.ids) {
        if (ShardOfId(id, d.num_ps) != d.task_index || (spec.rows > 0 && (id < 0 || id >= spec.rows))) {
          return absl::FailedPreconditionError(absl::StrCat("sparse table '", spec.name, "': ps task ",
                                                            d.task_index, " holds id ", id,
                                                            ", which is not its own (or outside the table)"));
        }
      }
      out[t].ids.insert(out[t].ids.end(), s.ids.begin(), s.ids.end());
      out[t].values.insert(out[t].values.end(), s.values.begin(), s.values.end());
    }
  }
  for (SparseTableRows& table : out) {
    const int dim = table.spec.dim;
    std::vector<size_t> order(table.ids.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return table.ids[a] < table.ids[b]; });
    std::vector<int64_t> ids(order.size());
    std::vector<float> values(table.values.size());
    for (size_t i = 0; i < order.size(); ++i) {
      ids[i] = table.ids[order[i]];
      if (i > 0 && ids[i] == ids[i - 1]) {
        return absl::FailedPreconditionError(
            absl::StrCat("sparse table '", table.spec.name, "': id ", ids[i], " is held twice"));
      }
      std::copy_n(table.values.begin() + order[i] * dim, dim, values.begin() + i * dim);
    }
    table.ids = std::move(ids);
    table.values = std::move(values);
  }
  return out;
}

absl::StatusOr<std::vector<float>> AssembleFixedTable(const SparseTableRows& table, absl::Span<const float> initial) {
  const SparseTableSpec& spec = table.spec;
  if (spec.rows <= 0 || spec.dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec.name, "' is a hash table (no row count)"));
  }
  if (spec.rows > (int64_t{1} << 34) / spec.dim) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec.name, "' is too large to assemble"));
  }
  if (!initial.empty() && static_cast<int64_t>(initial.size()) != spec.rows * spec.dim) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec.name, "': ", initial.size(),
                                                   " initial values for ", spec.rows, " x ", spec.dim, " rows"));
  }
  std::vector<float> out(spec.rows * spec.dim);
  std::vector<char> have(spec.rows, 0);
  for (size_t i = 0; i < table.ids.size(); ++i) {
    const int64_t id = table.ids[i];
    if (id < 0 || id >= spec.rows) {
      return absl::InvalidArgumentError(absl::StrCat("sparse table '", spec.name, "': id ", id, " outside [0, ",
                                                     spec.rows, ")"));
    }
    std::copy_n(table.values.begin() + i * spec.dim, spec.dim, out.begin() + id * spec.dim);
    have[id] = 1;
  }
  for (int64_t id = 0; id < spec.rows; ++id) {
    if (have[id]) continue;
    if (initial.empty()) {
      SparseInitialRow(spec, id, out.data() + id * spec.dim);
    } else {
      std::copy_n(initial.begin() + id * spec.dim, spec.dim, out.begin() + id * spec.dim);
    }
  }
  return out;
}

}  // namespace dtrain::ps
