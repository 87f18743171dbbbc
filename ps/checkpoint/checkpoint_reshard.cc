#include "ps/checkpoint/checkpoint_reshard.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace dtrain::ps {
namespace {

// An old slice, located in the model's flat buffer.
struct OldSlice {
  int64_t begin = 0, end = 0;
  const SliceState* state = nullptr;
  int task = 0;
};

// Copies floats [begin, end) of the flat buffer from the old slices (sorted by begin, not overlapping) into the
// new slice `out` (its spec set, its arrays sized).
absl::Status FillSlice(const std::vector<OldSlice>& old, const std::string& name, const CheckpointData& first,
                       SliceState* out) {
  const SliceSpec& spec = out->spec;
  int64_t at = spec.flat_offset;
  const int64_t end = spec.flat_offset + spec.length;
  // The last old slice starting at or before `at`.
  auto it = std::upper_bound(old.begin(), old.end(), at, [](int64_t v, const OldSlice& s) { return v < s.begin; });
  if (it != old.begin()) --it;
  while (at < end) {
    if (it == old.end() || it->begin > at || it->end <= at) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, ": holds no values for floats [", at, ", ", end, ") of variable '", spec.variable,
          "' (this task's slice ", DescribeSlice(spec), "): written for another model layout?"));
    }
    const SliceSpec& from = it->state->spec;
    if (from.variable != spec.variable || from.trainable != spec.trainable) {
      return absl::FailedPreconditionError(absl::StrCat(
          name, ": floats [", at, ", ", std::min(end, it->end), ") belong to variable '", from.variable,
          "' in ps task ", it->task, "'s file (", DescribeSlice(from), "), this run places '", spec.variable,
          "' there (", DescribeSlice(spec), ")", from.trainable != spec.trainable ? ", trainable or not" : "",
          ": another model?"));
    }
    const int64_t n = std::min(end, it->end) - at;
    const int64_t src = at - it->begin, dst = at - spec.flat_offset;
    std::copy_n(it->state->values.begin() + src, n, out->values.begin() + dst);
    for (int k = 0; k < first.num_slots; ++k) {
      std::copy_n(it->state->slots[k].begin() + src, n, out->slots[k].begin() + dst);
    }
    if (first.has_moving_averages) {
      std::copy_n(it->state->moving_average.begin() + src, n, out->moving_average.begin() + dst);
    }
    at += n;
    ++it;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointData> ReshardCheckpoint(const std::vector<CheckpointData>& parts, const std::string& name,
                                                 const TrainConfig& config, int task, int num_ps) {
  if (parts.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": no checkpoint files to reshard"));
  const CheckpointData& first = parts[0];
  const int from = first.num_ps;
  for (size_t t = 0; t < parts.size(); ++t) {
    const CheckpointData& d = parts[t];
    if (d.task_index != static_cast<int>(t) || d.num_ps != from || d.global_step != first.global_step ||
        d.num_slots != first.num_slots || d.has_moving_averages != first.has_moving_averages ||
        d.tables.size() != first.tables.size() || d.sparse_num_slots != first.sparse_num_slots) {
      return absl::DataLossError(absl::StrCat(name, ": the file of ps task ", d.task_index, " of ", d.num_ps,
                                              " (step ", d.global_step, ") does not belong with ps task 0's of ",
                                              from, " (step ", first.global_step, ")"));
    }
    RETURN_IF_ERROR(CheckModelCompatible(d, absl::StrCat(name, " (ps task ", t, " of ", from, ")"), config));
  }
  if (static_cast<int>(parts.size()) != from) {
    return absl::DataLossError(absl::StrCat(name, ": ", parts.size(), " files of a checkpoint of ", from, " ps tasks"));
  }

  CheckpointData out;
  out.task_index = task;
  out.num_ps = num_ps;
  out.global_step = first.global_step;
  out.task_step = first.global_step;
  out.model_signature = first.model_signature;
  out.optimizer = first.optimizer;
  out.num_slots = first.num_slots;
  out.has_moving_averages = first.has_moving_averages;
  if (task == 0) out.input_positions = first.input_positions;
  out.sparse_optimizer = first.sparse_optimizer;
  out.sparse_num_slots = first.sparse_num_slots;

  // Dense: the old slices by their place in the flat buffer.
  std::vector<OldSlice> old;
  for (const CheckpointData& d : parts) {
    for (const SliceState& s : d.slices) {
      old.push_back({s.spec.flat_offset, s.spec.flat_offset + s.spec.length, &s, d.task_index});
    }
  }
  std::sort(old.begin(), old.end(), [](const OldSlice& a, const OldSlice& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < old.size(); ++i) {
    if (old[i].begin < old[i - 1].end) {
      return absl::DataLossError(absl::StrCat(name, ": slices ", DescribeSlice(old[i - 1].state->spec), " (ps task ",
                                              old[i - 1].task, ") and ", DescribeSlice(old[i].state->spec),
                                              " (ps task ", old[i].task, ") overlap"));
    }
  }
  std::vector<SliceSpec> specs = config.slices;
  std::sort(specs.begin(), specs.end(), [](const SliceSpec& a, const SliceSpec& b) { return a.key < b.key; });
  for (const SliceSpec& spec : specs) {
    SliceState s;
    s.spec = spec;
    s.values.resize(spec.length);
    s.slots.assign(first.num_slots, std::vector<float>(spec.length));
    if (first.has_moving_averages) s.moving_average.resize(spec.length);
    RETURN_IF_ERROR(FillSlice(old, name, first, &s));
    out.slices.push_back(std::move(s));
  }

  // Sparse: every old row to the task that owns its id now.
  for (size_t t = 0; t < first.tables.size(); ++t) {
    SparseTableState table;
    table.spec = first.tables[t].spec;
    const int64_t dim = table.spec.dim;
    table.slots.resize(first.sparse_num_slots);
    absl::flat_hash_set<int64_t> seen;
    for (const CheckpointData& d : parts) {
      const SparseTableState& s = d.tables[t];
      if (s.spec.name != table.spec.name || s.spec.dim != table.spec.dim ||
          s.values.size() != s.ids.size() * static_cast<size_t>(dim)) {
        return absl::DataLossError(absl::StrCat(name, ": sparse table ", t, " of ps task ", d.task_index, " ('",
                                                s.spec.name, "') is not ps task 0's ('", table.spec.name, "')"));
      }
      for (size_t i = 0; i < s.ids.size(); ++i) {
        const int64_t id = s.ids[i];
        if (ShardOfId(id, from) != d.task_index || !seen.insert(id).second) {
          return absl::DataLossError(absl::StrCat(name, ": sparse table '", table.spec.name, "': ps task ",
                                                  d.task_index, " holds id ", id,
                                                  ", which is not its own or is held twice"));
        }
        if (ShardOfId(id, num_ps) != task) continue;
        table.ids.push_back(id);
        table.values.insert(table.values.end(), s.values.begin() + i * dim, s.values.begin() + (i + 1) * dim);
        for (int k = 0; k < first.sparse_num_slots; ++k) {
          table.slots[k].insert(table.slots[k].end(), s.slots[k].begin() + i * dim, s.slots[k].begin() + (i + 1) * dim);
        }
      }
    }
    out.tables.push_back(std::move(table));
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> CandidateSteps(Env* env, const std::string& dir, int task, int num_ps) {
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(env, dir));
  std::set<int64_t> steps;
  std::map<std::pair<int64_t, int>, int> others;  // (step, num_ps) -> files present
  for (const CheckpointFile& f : files) {
    if (f.num_ps == num_ps) {
      if (f.task == task) steps.insert(f.step);
    } else {
      ++others[{f.step, f.num_ps}];
    }
  }
  for (const auto& [key, count] : others) {
    if (count == key.second) steps.insert(key.first);
  }
  return std::vector<int64_t>(steps.rbegin(), steps.rend());
}

absl::StatusOr<RestorableCheckpoint> ReadCheckpointForTask(Env* env, const std::string& dir, int64_t step,
                                                           const TrainConfig& config, int task, int num_ps) {
  const std::string own = CheckpointPath(dir, step, task, num_ps);
  if (env->FileExists(own)) {
    ASSIGN_OR_RETURN(CheckpointData data, ReadCheckpoint(env, own));
    if (data.global_step != step) {
      return absl::DataLossError(absl::StrCat(own, ": holds step ", data.global_step, ", its name says step ", step));
    }
    RETURN_IF_ERROR(CheckCompatible(data, own, config, task, num_ps));
    return RestorableCheckpoint{own, std::move(data), 0};
  }
  ASSIGN_OR_RETURN(std::vector<CheckpointFile> files, ListCheckpointFiles(env, dir));
  std::map<int, std::vector<const CheckpointFile*>> by_num_ps;  // complete layouts of `step`, fewest tasks first
  for (const CheckpointFile& f : files) {
    if (f.step == step && f.num_ps != num_ps) by_num_ps[f.num_ps].push_back(&f);
  }
  for (const auto& [from, of_step] : by_num_ps) {
    if (static_cast<int>(of_step.size()) != from) continue;
    const std::string name = absl::StrCat(CheckpointPrefix(dir, step), ".ps*-of-", from);
    std::vector<CheckpointData> parts(from);
    for (const CheckpointFile* f : of_step) {
      ASSIGN_OR_RETURN(parts[f->task], ReadCheckpoint(env, f->path));
      const CheckpointData& d = parts[f->task];
      if (d.task_index != f->task || d.num_ps != from || d.global_step != step) {
        return absl::DataLossError(absl::StrCat(f->path, ": holds task ", d.task_index, " of ", d.num_ps,
                                                " at step ", d.global_step, ", its name says otherwise"));
      }
    }
    ASSIGN_OR_RETURN(CheckpointData data, ReshardCheckpoint(parts, name, config, task, num_ps));
    RETURN_IF_ERROR(CheckCompatible(data, name, config, task, num_ps));
    return RestorableCheckpoint{name, std::move(data), from};
  }
  return absl::NotFoundError(absl::StrCat("no checkpoint of step ", step, " in '", dir, "' for ps task ", task,
                                          " of ", num_ps, ", nor a complete one by another number of ps tasks"));
}

absl::StatusOr<std::vector<int64_t>> RestorableSteps(Env* env, const std::string& dir, const TrainConfig& config,
                                                     int task, int num_ps) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, CandidateSteps(env, dir, task, num_ps));
  std::vector<int64_t> out;
  for (int64_t step : steps) {
    absl::StatusOr<RestorableCheckpoint> r = ReadCheckpointForTask(env, dir, step, config, task, num_ps);
    if (r.ok()) {
      out.push_back(step);
    } else if (!absl::IsFailedPrecondition(r.status())) {
      const std::string own = CheckpointPath(dir, step, task, num_ps);
      LOG(WARNING) << "ps task " << task << ": "
                   << (env->FileExists(own) ? own : absl::StrCat(CheckpointPrefix(dir, step), " (resharded)"))
                   << " is not restorable (skipping it; an older step will be tried): " << r.status();
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace dtrain::ps
