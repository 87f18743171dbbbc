#include "ps/client/placement.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dtrain::ps {
namespace {

constexpr int64_t kBytesPerFloat = sizeof(float);

// How many slices a variable of `size` floats is cut into (at most `max_pieces`).
int64_t NumPieces(int64_t size, int max_pieces, int64_t min_slice_bytes) {
  if (max_pieces <= 1 || min_slice_bytes <= 0) return 1;
  const int64_t bytes = size * kBytesPerFloat;
  if (bytes < 2 * min_slice_bytes) return 1;
  return std::min<int64_t>(max_pieces, bytes / min_slice_bytes);
}

}  // namespace

absl::StatusOr<Placement> PlaceVariables(const std::vector<VariableInfo>& variables, int num_ps,
                                         const PlacementOptions& options) {
  if (num_ps < 1) return absl::InvalidArgumentError(absl::StrCat("num_ps must be >= 1, got ", num_ps));
  if (options.pieces_per_task < 1 || options.pieces_per_task > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("pieces_per_task (--channels_per_ps) must be in [1, 64], got ", options.pieces_per_task));
  }
  if (options.min_slice_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_slice_bytes must be >= 0, got ", options.min_slice_bytes));
  }
  std::set<std::string> names;
  for (const VariableInfo& v : variables) {
    if (v.name.empty()) return absl::InvalidArgumentError("a variable has an empty name");
    if (!names.insert(v.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate variable name '", v.name, "'"));
    }
    if (v.size <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("variable '", v.name, "' has size ", v.size, " (must be > 0)"));
    }
  }

  Placement p;
  int64_t offset = 0;
  for (const VariableInfo& v : variables) {
    const int64_t pieces = NumPieces(v.size, num_ps * options.pieces_per_task, options.min_slice_bytes);
    const int64_t base = v.size / pieces, extra = v.size % pieces;
    for (int64_t i = 0; i < pieces; ++i) {
      SliceSpec s;
      s.key = static_cast<uint32_t>(p.slices.size());
      s.variable = v.name;
      s.flat_offset = offset;
      s.length = base + (i < extra ? 1 : 0);
      s.trainable = v.trainable;
      offset += s.length;
      p.slices.push_back(std::move(s));
    }
  }

  std::vector<size_t> order(p.slices.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return p.slices[a].length > p.slices[b].length; });
  p.task_of_slice.assign(p.slices.size(), 0);
  p.task_bytes.assign(num_ps, 0);
  for (size_t key : order) {
    // min_element returns the first minimum: the lowest task index among equally loaded tasks.
    const int task = static_cast<int>(std::min_element(p.task_bytes.begin(), p.task_bytes.end()) -
                                      p.task_bytes.begin());
    p.task_of_slice[key] = task;
    p.task_bytes[task] += p.slices[key].length * kBytesPerFloat;
  }
  p.task_slices.assign(num_ps, {});
  for (size_t key = 0; key < p.slices.size(); ++key) {
    p.task_slices[p.task_of_slice[key]].push_back(p.slices[key]);
  }
  return p;
}

std::string FormatPlacement(const Placement& placement) {
  std::string out = absl::StrFormat("%-4s %-5s %-32s %-25s %12s\n", "task", "key", "variable", "flat range",
                                    "bytes");
  for (size_t task = 0; task < placement.task_slices.size(); ++task) {
    for (const SliceSpec& s : placement.task_slices[task]) {
      const std::string range = absl::StrCat("[", s.flat_offset, ", ", s.flat_offset + s.length, ")");
      absl::StrAppendFormat(&out, "%-4d %-5d %-32s %-25s %12d\n", task, s.key, s.variable, range,
                            s.length * kBytesPerFloat);
    }
  }
  int64_t total = 0;
  for (int64_t b : placement.task_bytes) total += b;
  for (size_t task = 0; task < placement.task_bytes.size(); ++task) {
    const int64_t b = placement.task_bytes[task];
    absl::StrAppendFormat(&out, "task %d: %d slices, %d bytes (%.1f%%)\n", task,
                          placement.task_slices[task].size(), b, total > 0 ? 100.0 * b / total : 0.0);
  }
  return out;
}

}  // namespace dtrain::ps
