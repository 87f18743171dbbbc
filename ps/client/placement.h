// Placement of the model's variables on ps tasks: cuts the flat parameter buffer into slices (large
// variables are partitioned into contiguous pieces) and assigns each slice to a ps task, balancing bytes.
//
// Rules (deterministic: the same inputs give the same placement on every worker):
//   - With num_ps x pieces_per_task > 1, a variable of at least 2 * min_slice_bytes is split into
//     k = min(num_ps x pieces_per_task, bytes / min_slice_bytes) contiguous slices of roughly equal length (each
//     therefore >= min_slice_bytes); with num_ps x pieces_per_task == 1 or min_slice_bytes == 0 nothing is split.
//   - Slices get keys 0..n-1 in flat-buffer order.
//   - Slices are placed greedily, largest first (ties: lower key first), each onto the task with the fewest
//     bytes so far (ties: lowest task index).
//
// Usage:
//   ASSIGN_OR_RETURN(Placement p, PlaceVariables({{"conv1/w", 800}, {"conv1/b", 32}}, /*num_ps=*/2));
//   LOG(INFO) << FormatPlacement(p);
//   config.slices = p.task_slices[task_index];
//
// Thread-safety: free functions over values; safe to call concurrently.
#ifndef DTRAIN_PS_CLIENT_PLACEMENT_H_
#define DTRAIN_PS_CLIENT_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/api/ps_types.h"

namespace dtrain::ps {

// A model variable in flat-buffer order.
struct VariableInfo {
  std::string name;
  int64_t size = 0;  // floats
  bool trainable = true;  // false: state (SliceSpec::trainable)
};

struct PlacementOptions {
  // Smallest slice a partitioned variable is cut into; variables of at least twice this are partitioned.
  // 0 = never partition.
  int64_t min_slice_bytes = 256 * 1024;
  // Pieces a large variable may be cut into per ps task: a worker striping its pushes and pulls by slice over
  // several connections to each task (--channels_per_ps) cuts them this much finer. Every worker of a run must
  // use the same value (the slices are part of the config the ps tasks check).
  int pieces_per_task = 1;
};

struct Placement {
  std::vector<SliceSpec> slices;                    // every slice, index == key, in flat-buffer order
  std::vector<int> task_of_slice;                   // [key] = ps task holding it
  std::vector<std::vector<SliceSpec>> task_slices;  // [task] = its slices in key order
  std::vector<int64_t> task_bytes;                  // [task] = bytes it holds
};

// InvalidArgument for num_ps < 1, pieces_per_task outside [1, 64], a negative min_slice_bytes, an empty or
// duplicate variable name, or a variable of size <= 0.
absl::StatusOr<Placement> PlaceVariables(const std::vector<VariableInfo>& variables, int num_ps,
                                         const PlacementOptions& options = {});

// A table for logs: one line per slice (task, key, variable, flat range, bytes) grouped by task, then the
// per-task totals.
std::string FormatPlacement(const Placement& placement);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CLIENT_PLACEMENT_H_
