// Deltas: what changed on one ps task since its previous delta, written every --delta_every_secs beside the
// periodic full snapshots (the checkpoints, checkpoint_format.h). A reader applies the newest snapshot and the
// deltas after it to serve the model as it trains (dtrain_eval --follow_deltas, delta_chain.h); a ps task
// killed and restarted restores the same way, losing at most the updates of one delta interval.
//
// File: <dir>/model.delta-<step>.ps<task>-of-<num_ps>, written atomically (common/env.h).
// Format (version 1; integers little-endian):
//   "DTRNDLTA" | u32 version | u32 header_len | header | u32 masked CRC32C(everything before it) | state
//   header: i64 step | i64 prev_step | u32 num_tables | num_tables x (u32 table | u64 count | i64 removed[count])
//   state:  a checkpoint (checkpoint_format.h, with its own checksums and trailer) of step `step` holding the
//           task's whole dense state (every slice's values, optimizer slots and moving averages: they all change
//           every step), ps 0's input positions, and of each sparse table only the rows created or updated since
//           prev_step (values and optimizer slots, as fp32).
// prev_step: the step of the state the delta applies to: the task's previous delta, or the checkpoint or delta
// the task restored; -1 for the first delta of a fresh start (the tables were empty then: no snapshot needed).
// Applying a delta (ApplyDelta): remove the `removed` ids (rows evicted or expired since prev_step), then set
// every changed row (an id removed and created again since is in both lists), then take the slices, steps and
// input positions whole. A delta applies to any state of the task between prev_step and step, so a reader that
// starts from a snapshot of step S takes the first delta with prev_step <= S < step and every one after it.
//
// Errors (ParseDelta, ApplyDelta): DataLoss for truncated or corrupt bytes (the message names the file and what),
// FailedPrecondition for a newer version or a delta that does not fit the state (another task, step or table).
//
// Thread-safety: stateless functions.
#ifndef DTRAIN_PS_CHECKPOINT_DELTA_FORMAT_H_
#define DTRAIN_PS_CHECKPOINT_DELTA_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/env.h"
#include "ps/checkpoint/checkpoint_format.h"

namespace dtrain::ps {

inline constexpr char kDeltaMagic[] = "DTRNDLTA";  // 8 bytes, no terminator in the file
inline constexpr uint32_t kDeltaFormatVersion = 1;

struct DeltaData {
  int64_t prev_step = -1;
  // global_step names the delta; its tables hold the changed rows only.
  CheckpointData state;
  std::vector<std::vector<int64_t>> removed;  // per table of state.tables, in that order
};

// The encoding above. CHECKs that `removed` has one list per table (built by the ParameterServer).
std::string SerializeDelta(const DeltaData& delta);
// The same into `*out` (replacing what it held, keeping its capacity: the writer reuses one buffer).
void SerializeDeltaInto(const DeltaData& delta, std::string* out);
// Validates everything; `name` (usually the path) starts every message.
absl::StatusOr<DeltaData> ParseDelta(absl::string_view bytes, const std::string& name);

// What a delta file's first bytes say: enough to chain deltas without reading them whole.
struct DeltaHeader {
  int64_t step = 0;
  int64_t prev_step = -1;
};
absl::StatusOr<DeltaHeader> ParseDeltaHeader(absl::string_view bytes, const std::string& name);
// Reads only as much of the file as the header takes (the whole file on an Env without partial reads).
absl::StatusOr<DeltaHeader> ReadDeltaHeader(Env* env, const std::string& path);
absl::StatusOr<DeltaData> ReadDelta(Env* env, const std::string& path);

// Applies `delta` to `state` (a checkpoint of the same task, or the result of earlier deltas), in place.
// FailedPrecondition when the delta is of another task or model, or does not apply: state.global_step <
// delta.prev_step, or >= the delta's step; or its tables differ.
absl::Status ApplyDelta(const DeltaData& delta, CheckpointData* state);

// File names: "<dir>/model.delta-<step>.ps<task>-of-<num_ps>".
std::string DeltaPath(const std::string& dir, int64_t step, int task, int num_ps);
struct DeltaFile {
  int64_t step = 0;
  int task = 0;
  int num_ps = 0;
  std::string path;
};
// Parses a name (without directory); false for anything else (temporary files of an unfinished write included).
bool ParseDeltaFileName(absl::string_view name, DeltaFile* out);
// Every delta file in `dir`, sorted by (step, task). A missing directory is an empty list.
absl::StatusOr<std::vector<DeltaFile>> ListDeltaFiles(Env* env, const std::string& dir);

}  // namespace dtrain::ps

#endif  // DTRAIN_PS_CHECKPOINT_DELTA_FORMAT_H_
