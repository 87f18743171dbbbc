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

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_CHECKPOINT_SET_H_
