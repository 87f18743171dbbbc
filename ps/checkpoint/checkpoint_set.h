// Reading a whole checkpoint (the files of every ps task for one step) and reassembling the model's flat
// parameter buffer from it: what dtrain_eval does with a checkpoint directory or prefix. Names and the single-file
// reader are checkpoint_dir.h; the bytes are checkpoint_format.h.
//
// Thread-safety: free functions without shared state, safe from any thread.
#ifndef DTRAIN_PS_CHECKPOINT_CHECKPOINT_SET_H_
#define DTRAIN_PS_CHECKPOINT_CHECKPOINT_SET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/env.h"
#include "ps/checkpoint/checkpoint_format.h"

namespace dtrain::ps {

// The files that make up one checkpoint. `prefix_or_dir` is "<dir>/model.ckpt-<step>" (every
// "<prefix>.psI-of-N" file of that step), or a directory: its newest step for which the files of all N tasks
// are present and read back valid (older steps are tried when the newest is incomplete or corrupt, with a
// LOG(WARNING)). Returns the parsed files, ordered by task. NotFound when there is no such checkpoint (the
// message lists the steps there are), DataLoss/FailedPrecondition from reading, InvalidArgument when a step has
// files for several numbers of ps tasks or `prefix_or_dir` is neither a directory nor a prefix.
absl::StatusOr<std::vector<CheckpointData>> ReadCheckpointSet(Env* env, const std::string& prefix_or_dir);

// Reassembles the model's flat buffer (total_floats floats) from the slices of all tasks by their flat
// offsets: their values, or their moving averages when `moving_averages` (FailedPrecondition if the
// checkpoint has none). Verifies that the parts agree (one model signature, one step, the same num_ps) and
// that the slices cover [0, total_floats) exactly once (FailedPrecondition naming the gap, overlap or
// out-of-range slice otherwise).
absl::StatusOr<std::vector<float>> AssembleFlatBuffer(const std::vector<CheckpointData>& parts,
                                                      int64_t total_floats, bool moving_averages);

// One sparse table of a whole checkpoint: the rows that exist on any task, sorted by id.
struct SparseTableRows {
  SparseTableSpec spec;
  std::vector<int64_t> ids;
  std::vector<float> values;  // ids.size() * spec.dim
};
// Every sparse table of a checkpoint, its rows merged across the tasks' files (no optimizer slots). Verifies
// that the parts agree (one step, the same tables and num_ps) and that each id is held by the task ShardOfId
// names, once (FailedPrecondition naming the table and id otherwise). An id without a row reads as its
// initializer in a fixed-size table (SparseInitialRow) and as absent in a hash table (a model evaluates it as
// the ps would serve it: a row created from its initializer, or zeros while not admitted).
absl::StatusOr<std::vector<SparseTableRows>> ReadSparseTables(const std::vector<CheckpointData>& parts);

// A fixed-size table ([spec.rows, spec.dim]) as one dense buffer: the rows of `table`, the others from their
// initializer, as the ps would serve them, or, for a table with initial values (which checkpoints do not
// record: the caller knows them, e.g. from the ONNX file), from `initial` (spec.rows * spec.dim floats; empty:
// the initializer). InvalidArgument for a hash table (rows == 0), an id outside [0, rows), or `initial` of
// another size.
absl::StatusOr<std::vector<float>> AssembleFixedTable(const SparseTableRows& table,
                                                      absl::Span<const float> initial = {});

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_SET_H_
